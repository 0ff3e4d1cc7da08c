"""How much of a step's fp32-master overhead one fused kernel could take back, at GPT-1.3B's parameter count.

    python bench/master_step_probe.py             # 1.3e9 elements, one flat shard, as at world size 1
    python bench/master_step_probe.py --numel 4e8

The engine's optimizer work at world size 1 with no gradient accumulation, as separate passes over flat
tensors (what zero/flat/reducer.py DirectAccumulator, the norm check and ShardOptimizer queue today):
  1. the bf16 grad copied into the fp32 grad shard (the grad hook),
  2. the L2 norm of the fp32 grads,
  3. torch's fused AdamW over the fp32 master, grads and moments (grad_scale folds the clip in),
  4. the fp32 master copied back into the bf16 params.
against alternatives that keep the numerics (fp32 master, fp32 moments; a bf16 -> fp32 upcast is exact):
  compiled AdamW: 1, 2, one torch.compile'd kernel doing 3, then 4 as today (is inductor's AdamW alone faster?),
  fused-from-fp32: 1, 2 + one torch.compile'd kernel doing 3 and 4 (the grads still go through the fp32 shard),
  fused-from-bf16: the norm over the bf16 grads + one compiled kernel reading them and writing master,
    moments and bf16 params (possible only with one micro-step per window: accumulation needs fp32).
Prints the median ms of each over CUDA events (after warm-up, compile time excluded), the bytes each moves,
and how far the fused results are from the separate passes after one step. A measurement, not a test.
"""

from __future__ import annotations

import argparse
import statistics

import torch

LR, BETA1, BETA2, EPS, WD, CLIP = 3e-4, 0.9, 0.95, 1e-8, 0.1, 1.0


def _tensors(numel: int):
    g = torch.Generator(device="cuda").manual_seed(0)
    master = torch.randn(numel, device="cuda", generator=g) * 0.02
    grad16 = (torch.randn(numel, device="cuda", generator=g) * 1e-3).to(torch.bfloat16)
    m = torch.randn(numel, device="cuda", generator=g) * 1e-4
    v = torch.rand(numel, device="cuda", generator=g) * 1e-7
    return master, grad16, m, v


def separate_passes(master, grad16, grad32, m, v, param16, step):
    grad32.copy_(grad16)
    norm = torch.linalg.vector_norm(grad32)
    coef = torch.clamp(CLIP / (norm + 1e-6), max=1.0)
    # torch's own fused kernel (optim/adamw.py increments `step` before calling it; here it is held at 1)
    torch._fused_adamw_(
        [master],
        [grad32],
        [m],
        [v],
        [],
        [step],
        lr=LR,
        beta1=BETA1,
        beta2=BETA2,
        weight_decay=WD,
        eps=EPS,
        amsgrad=False,
        maximize=False,
        grad_scale=1.0 / coef,
        found_inf=None,
    )
    param16.copy_(master)


def _adamw(master, grad, m, v, coef, bc1, bc2):
    """AdamW as torch's fused kernel computes it, on fp32 (the grad upcast and multiplied by `coef`)."""
    g = grad.float() * coef
    m.lerp_(g, 1 - BETA1)
    v.mul_(BETA2).addcmul_(g, g, value=1 - BETA2)
    master.mul_(1 - LR * WD)
    master.addcdiv_(m, (v / bc2).sqrt() + EPS, value=-LR / bc1)


def _adamw_into(master, grad, m, v, param16, coef, bc1, bc2):
    """_adamw plus the bf16 copy of the master, in one kernel once compiled."""
    _adamw(master, grad, m, v, coef, bc1, bc2)
    param16.copy_(master)


def fused(master, grad, m, v, param16, step_kernel, bc1, bc2):
    """The clip coefficient from the grads' norm, then `step_kernel` (_adamw_into, compiled or not)."""
    norm = torch.linalg.vector_norm(grad, dtype=torch.float32)
    coef = torch.clamp(CLIP / (norm + 1e-6), max=1.0)
    step_kernel(master, grad, m, v, param16, coef, bc1, bc2)


# (name, grads the kernel reads, whether the kernel writes the bf16 params, bytes per element moved)
VARIANTS = (
    ("compiled AdamW, bf16 copy as today", "fp32", False, 6 + 4 + 28 + 6),
    ("fused-from-fp32", "fp32", True, 6 + 4 + 28 + 2),  # the grad copy and norm as today
    ("fused-from-bf16", "bf16", True, 2 + 28),  # norm over bf16; the kernel reads 2-byte grads
)


def _median_ms(fn, reps: int) -> float:
    times = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--numel", type=float, default=1.3e9)
    p.add_argument("--reps", type=int, default=10)
    args = p.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("master_step_probe.py measures CUDA kernels; no GPU is visible here")
    numel = int(args.numel)
    step_into = torch.compile(_adamw_into, dynamic=False)
    step_only = torch.compile(_adamw, dynamic=False)
    # bias corrections as device scalars (step 1), so the compiled kernel is not specialized to the step
    bc1 = torch.tensor(1 - BETA1, device="cuda")
    bc2 = torch.tensor(1 - BETA2, device="cuda")

    def step_then_copy(master, grad, m, v, param16, coef, bc1, bc2):
        step_only(master, grad, m, v, coef, bc1, bc2)
        param16.copy_(master)  # a pass of its own, as the engine's publish today

    rows = []
    master, grad16, m, v = _tensors(numel)
    grad32 = torch.empty(numel, device="cuda")
    param16 = torch.empty(numel, device="cuda", dtype=torch.bfloat16)
    step = torch.zeros((), device="cuda")
    ref = [t.clone() for t in (master, m, v)]

    def run_separate():
        step.fill_(1.0)
        separate_passes(master, grad16, grad32, m, v, param16, step)

    run_separate()
    after_separate = [t.clone() for t in (master, m, v)]
    # bytes per element: grad copy 2+4, norm 4, AdamW reads master, grad, m, v and writes three, copy back 4+2
    rows.append(("separate passes (today)", _median_ms(run_separate, args.reps), 6 + 4 + 28 + 6))

    for name, source, writes_bf16, nbytes in VARIANTS:
        for t, r in zip((master, m, v), ref, strict=True):
            t.copy_(r)

        def run(source=source, writes_bf16=writes_bf16):
            grad = grad16
            if source == "fp32":
                grad32.copy_(grad16)  # the grad hook's copy into the fp32 shard
                grad = grad32
            fused(master, grad, m, v, param16, step_into if writes_bf16 else step_then_copy, bc1, bc2)

        run()  # compiles; also the one step compared with the separate passes
        err = max(
            ((a - b).abs().max() / b.abs().max()).item()
            for a, b in zip((master, m, v), after_separate, strict=True)
        )
        rows.append((f"{name} (max rel diff {err:.1e})", _median_ms(run, args.reps), nbytes))

    base = rows[0][1]
    print(f"numel {numel:.3g}, {torch.cuda.get_device_name()}, torch {torch.__version__}")
    print(f"{'variant':<56} {'ms':>8} {'B/param':>8} {'GB/s':>8} {'vs today':>9}")
    for name, ms, nbytes in rows:
        print(f"{name:<56} {ms:8.2f} {nbytes:8d} {numel * nbytes / ms / 1e6:8.0f} {ms / base:8.2f}x")


if __name__ == "__main__":
    main()
