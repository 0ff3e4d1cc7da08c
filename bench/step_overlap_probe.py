"""Would an optimizer step on a side stream hide under the model's matmuls? A probe before building it.

    python bench/step_overlap_probe.py                 # GPT-1.3B's shapes: 24 layers, d 2048, 16384 tokens
    python bench/step_overlap_probe.py --numel 4e8 --layers 8

Issue #19 asks for GPT-1.3B at <= 0.95x pure-bf16 torch.compile with an fp32 master. The optimizer step is
the one part of a step a ZeRO engine adds that the model does not need in order: if the step of layer k ran
on a side stream while the next forward's matmuls of layers < k run, its memory-bound kernels would share the
GPU with compute-bound ones. Whether that pays depends on how the two share SMs, which only a measurement
says. This probe times, on CUDA events:
  matmuls:  the forward matmuls of `--layers` GPT layers (qkv, out, fc, proj at --tokens x --d-model), bf16;
  step:     torch's fused AdamW over `--numel` fp32 elements in `--chunks` chunks (the engine's unfused step);
  both:     the two at once, the step on a low-priority side stream, each chunk issued as the matmuls start;
and prints the fraction of the step hidden: (matmuls + step - both) / step (1.0: free; 0: no overlap; < 0:
they slowed each other). A measurement, not a test; on the CPU (no streams) it runs the same code in
sequence at a tiny size, so a device call cannot fail on a typo (tests/unit/test_bench_step_overlap_probe.py).
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch


def _matmul_operands(layers: int, tokens: int, d: int, device) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Per layer the four forward matmuls of a GPT block (attention's own kernels left out)."""
    g = torch.Generator(device=device).manual_seed(0)
    x = torch.randn(tokens, d, device=device, generator=g, dtype=torch.bfloat16)
    h = torch.randn(tokens, 4 * d, device=device, generator=g, dtype=torch.bfloat16)
    shapes = [(x, (d, 3 * d)), (x, (d, d)), (x, (d, 4 * d)), (h, (4 * d, d))]
    ops = []
    for _ in range(layers):
        for inp, (k, n) in shapes:
            ops.append((inp, torch.randn(k, n, device=device, generator=g, dtype=torch.bfloat16) * 0.02))
    return ops


def _step_state(numel: int, chunks: int, device) -> list[list[torch.Tensor]]:
    """[master, grad, exp_avg, exp_avg_sq] chunks of a flat fp32 shard, as ShardOptimizer steps them."""
    g = torch.Generator(device=device).manual_seed(1)
    flat = [torch.randn(numel, device=device, generator=g) * s for s in (0.02, 1e-3, 1e-4, 1e-4)]
    flat[3].abs_()
    size = -(-numel // chunks)
    return [[t[i : i + size] for t in flat] for i in range(0, numel, size)]


def _step_chunk(chunk: list[torch.Tensor], step: torch.Tensor) -> None:
    master, grad, m, v = chunk
    if master.device.type == "cuda":
        torch._fused_adamw_(
            [master],
            [grad],
            [m],
            [v],
            [],
            [step],
            lr=3e-4,
            beta1=0.9,
            beta2=0.95,
            weight_decay=0.1,
            eps=1e-8,
            amsgrad=False,
            maximize=False,
        )
    else:  # no fused kernel needed for the CPU's smoke run: the same reads and writes, eagerly
        m.mul_(0.9).add_(grad, alpha=0.1)
        v.mul_(0.95).addcmul_(grad, grad, value=0.05)
        master.addcdiv_(m, v.sqrt().add_(1e-8), value=-3e-4)


def interleave(n_ops: int, n_chunks: int) -> list[list[int]]:
    """Which step chunks the side stream gets before each of `n_ops` matmuls (entry i), the last entry the
    chunks left after them: evenly spread, in order, each exactly once (the way per-layer steps would meet
    the next forward)."""
    plan: list[list[int]] = [[] for _ in range(n_ops + 1)]
    for c in range(n_chunks):
        plan[min(n_ops, c * n_ops // max(1, n_chunks))].append(c)
    return plan


class _Timer:
    """Elapsed ms of a region: CUDA events on the GPU, perf_counter on the CPU."""

    def __init__(self, device):
        self.cuda = device.type == "cuda"

    def __enter__(self):
        if self.cuda:
            self.start, self.end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            torch.cuda.synchronize()
            self.start.record()
        else:
            self.t0 = time.perf_counter()
        return self

    def __exit__(self, *_):
        if self.cuda:
            self.end.record()
            torch.cuda.synchronize()
            self.ms = self.start.elapsed_time(self.end)
        else:
            self.ms = 1e3 * (time.perf_counter() - self.t0)


def run(args) -> dict[str, float]:
    device = torch.device("cuda" if torch.cuda.is_available() and not args.cpu else "cpu")
    ops = _matmul_operands(args.layers, args.tokens, args.d_model, device)
    chunks = _step_state(int(args.numel), args.chunks, device)
    step = torch.ones((), device=device)
    side = torch.cuda.Stream(priority=0) if device.type == "cuda" else None  # 0 is the lowest priority
    plan = interleave(len(ops), len(chunks))

    def matmuls():
        for a, b in ops:
            torch.mm(a, b)

    def steps():
        for c in chunks:
            _step_chunk(c, step)

    def both():
        if side is None:
            matmuls()
            steps()
            return
        side.wait_stream(torch.cuda.current_stream())
        for (a, b), before in zip(ops, plan, strict=False):
            with torch.cuda.stream(side):
                for c in before:
                    _step_chunk(chunks[c], step)
            torch.mm(a, b)
        with torch.cuda.stream(side):
            for c in plan[-1]:
                _step_chunk(chunks[c], step)
        torch.cuda.current_stream().wait_stream(side)

    out = {}
    for name, fn in (("matmuls", matmuls), ("step", steps), ("both", both)):
        times = []
        for i in range(args.warmup + args.repeats):
            with _Timer(device) as t:
                fn()
            if i >= args.warmup:
                times.append(t.ms)
        out[name] = statistics.median(times)
    out["hidden"] = (out["matmuls"] + out["step"] - out["both"]) / out["step"]
    out["device"] = torch.cuda.get_device_name() if device.type == "cuda" else "cpu"
    return out


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--numel", type=float, default=1.3e9, help="fp32 elements the step updates")
    p.add_argument("--chunks", type=int, default=40, help="step chunks (the engine's grad segments)")
    p.add_argument("--layers", type=int, default=24)
    p.add_argument("--tokens", type=int, default=16384, help="micro batch x seq")
    p.add_argument("--d-model", type=int, default=2048)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--cpu", action="store_true", help="run on the CPU even where a GPU is visible")
    args = p.parse_args(argv)
    r = run(args)
    print(
        f"device: {r['device']}; {args.layers} layers x 4 matmuls at {args.tokens} x {args.d_model}; "
        f"AdamW over {args.numel:.3g} fp32 elements in {args.chunks} chunks"
    )
    print(f"{'matmuls ms':>10} {'step ms':>8} {'both ms':>8} {'sum ms':>8} {'step hidden':>11}")
    print(
        f"{r['matmuls']:10.2f} {r['step']:8.2f} {r['both']:8.2f} {r['matmuls'] + r['step']:8.2f} "
        f"{100 * r['hidden']:10.0f}%"
    )
    return r


if __name__ == "__main__":
    main()
