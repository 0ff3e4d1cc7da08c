"""Causal self-attention forward + backward through each SDPA backend, at the built-in GPT's shapes.

    python bench/attention_backends.py            # GPT-350M and GPT-1.3B heads at seq 2048, micro batch 8

For each (batch, heads, seq, head dim) and each backend torch offers here (flash, cuDNN, efficient), prints
the median time of forward + backward in bf16 (CUDA events, after warm-up), its TFLOP/s counted as the
causal half of 4*B*H*T^2*D forward and 2.5x that backward, and how far its output and input gradients are
from the fp32 math backend on the same inputs (‖x - ref‖ / ‖ref‖; bf16 lands between 1e-3 and 1e-2).
Also prints which backend `F.scaled_dot_product_attention` picks by default (from the kernel names the
profiler sees), the torch and cuDNN versions. A measurement, not a test.
"""

from __future__ import annotations

import argparse
import statistics

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

SHAPES = {"350m": (8, 16, 2048, 64), "1.3b": (8, 32, 2048, 64)}
BACKENDS = {
    "flash": SDPBackend.FLASH_ATTENTION,
    "cudnn": SDPBackend.CUDNN_ATTENTION,
    "efficient": SDPBackend.EFFICIENT_ATTENTION,
}


def _inputs(shape, dtype, seed):
    """q, k, v leaves laid out as the built-in GPT makes them, (B, T, H, D), and the output grad (B, H, T, D)."""
    b, h, t, d = shape
    g = torch.Generator(device="cuda").manual_seed(seed)
    q, k, v = (torch.randn((b, t, h, d), device="cuda", dtype=dtype, generator=g) for _ in range(3))
    do = torch.randn(shape, device="cuda", dtype=dtype, generator=g)
    for x in (q, k, v):
        x.requires_grad_(True)
    return q, k, v, do


def _fwd_bwd(q, k, v, do):
    """(B, T, H, D) -> (B, H, T, D) views, as models/gpt.py's attention passes them (stride 1 in D only)."""
    out = F.scaled_dot_product_attention(
        q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True
    )
    out.backward(do)
    return out


def _rel(x, ref):
    return ((x.float() - ref).norm() / ref.norm()).item()


def default_backend(shape) -> str:
    from torch.profiler import ProfilerActivity, profile

    q, k, v, do = _inputs(shape, torch.bfloat16, 0)
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        _fwd_bwd(q, k, v, do)
        torch.cuda.synchronize()
    names = " ".join(e.key.lower() for e in prof.key_averages())
    if "cudnn" in names and "sdpa" in names:
        return "cudnn"
    if "flash" in names:
        return "flash"
    if "fmha" in names or "efficient" in names or "cutlass" in names:
        return "efficient"
    return "math/other"


def measure(shape, backend: SDPBackend, reps: int = 20) -> dict:
    b, h, t, d = shape
    q, k, v, do = _inputs(shape, torch.bfloat16, 1)
    ref_in = [x.detach().float().requires_grad_(True) for x in (q, k, v)]
    with sdpa_kernel([SDPBackend.MATH]):
        ref_out = _fwd_bwd(*ref_in, do.float())
    try:
        with sdpa_kernel([backend]):
            out = _fwd_bwd(q, k, v, do)
    except RuntimeError as error:
        return {"error": str(error).splitlines()[0][:80]}
    errors = {
        "out": _rel(out, ref_out.detach()),
        "dq": _rel(q.grad, ref_in[0].grad),
        "dk": _rel(k.grad, ref_in[1].grad),
        "dv": _rel(v.grad, ref_in[2].grad),
    }
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times = []
    with sdpa_kernel([backend]):
        for i in range(reps + 3):
            q.grad = k.grad = v.grad = None
            start.record()
            _fwd_bwd(q, k, v, do)
            end.record()
            torch.cuda.synchronize()
            if i >= 3:
                times.append(start.elapsed_time(end))
    ms = statistics.median(times)
    flops = 4 * b * h * t * t * d / 2 * 3.5  # causal half; backward 2.5x forward
    return {"ms": ms, "tflops": flops / ms / 1e9, **errors}


def main() -> None:
    argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    ).parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("bench/attention_backends.py times CUDA kernels: run it on a machine with a GPU")
    print(
        f"torch {torch.__version__}, cuDNN {torch.backends.cudnn.version()}, {torch.cuda.get_device_name()}"
    )
    for size, shape in SHAPES.items():
        print(
            f"\nGPT-{size}: (batch, heads, seq, head dim) = {shape}; default backend: {default_backend(shape)}"
        )
        print(
            f"  {'backend':<10}{'fwd+bwd ms':>11}{'TFLOP/s':>9}{'out err':>10}{'dq err':>10}{'dk err':>10}{'dv err':>10}"
        )
        for name, backend in BACKENDS.items():
            r = measure(shape, backend)
            if "error" in r:
                print(f"  {name:<10} not available: {r['error']}")
                continue
            print(
                f"  {name:<10}{r['ms']:>11.2f}{r['tflops']:>9.0f}"
                f"{r['out']:>10.1e}{r['dq']:>10.1e}{r['dk']:>10.1e}{r['dv']:>10.1e}"
            )


if __name__ == "__main__":
    main()
