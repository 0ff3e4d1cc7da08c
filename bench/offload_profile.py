"""Where an offloaded step's time goes, on one GPU: host/device copy rates, CPU optimizer rates, and the
phases of a zerolaunch ZeRO-2 + CPU optimizer offload step.

    python bench/offload_profile.py --size 1.3b [--parts rates,engine,peer]

Prints one table. The phases are timed from the host with a device sync at each boundary, so they add up
to the step (overlap between phases is deliberately removed here; bench/run.py times the real step).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _timed(fn, reps: int = 3) -> float:
    """Median wall ms of fn() over reps, device synced around each."""
    out = []
    for _ in range(reps):
        torch.cuda.synchronize()
        t = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        out.append((time.perf_counter() - t) * 1e3)
    return statistics.median(out)


def rates(rows: list) -> None:
    n = 256 * 2**20  # 1 GiB of fp32
    host = torch.empty(n, dtype=torch.float32).pin_memory()
    dev = torch.empty(n, dtype=torch.float32, device="cuda")
    dev16 = torch.empty(n, dtype=torch.bfloat16, device="cuda")
    ms = _timed(lambda: host.copy_(dev, non_blocking=True))
    rows.append(("D2H fp32 pinned", f"{n * 4 / ms / 1e6:.1f} GB/s"))
    ms = _timed(lambda: dev.copy_(host, non_blocking=True))
    rows.append(("H2D fp32 pinned", f"{n * 4 / ms / 1e6:.1f} GB/s"))
    ms = _timed(lambda: dev16.copy_(host, non_blocking=True))
    rows.append(("H2D fp32 pinned -> bf16 device (per fp32 GB)", f"{n * 4 / ms / 1e6:.1f} GB/s"))
    ms = _timed(lambda: host.copy_(dev16, non_blocking=True))
    rows.append(("D2H bf16 device -> fp32 pinned (per fp32 GB)", f"{n * 4 / ms / 1e6:.1f} GB/s"))
    host16 = torch.empty(n, dtype=torch.bfloat16).pin_memory()
    ms = _timed(lambda: host16.copy_(host))
    rows.append(("CPU cast fp32 -> bf16 (ns/elem)", f"{ms * 1e6 / n:.3f}"))
    ms = _timed(lambda: dev16.copy_(host16, non_blocking=True))
    rows.append(("H2D bf16 pinned", f"{n * 2 / ms / 1e6:.1f} GB/s"))

    m = 400 * 2**20
    p = torch.randn(m)
    g = torch.randn(m)
    for threads in sorted({torch.get_num_threads(), max(1, torch.get_num_threads() // 2)}, reverse=True):
        torch.set_num_threads(threads)
        opt = torch.optim.AdamW([p], lr=1e-4, fused=True)
        p.grad = g
        opt.step()
        ms = _timed(opt.step)
        rows.append((f"CPU fused AdamW, {threads} threads (ns/elem)", f"{ms * 1e6 / m:.3f}"))
        opt2 = torch.optim.AdamW([p], lr=1e-4, foreach=True)
        opt2.step()
        ms = _timed(opt2.step)
        rows.append((f"CPU foreach AdamW, {threads} threads (ns/elem)", f"{ms * 1e6 / m:.3f}"))
        ms = _timed(lambda: g.mul_(0.999))
        rows.append((f"CPU g.mul_ (clip), {threads} threads (ns/elem)", f"{ms * 1e6 / m:.3f}"))
        from zerolaunch.zero.optim.torch_optim import _sum_of_squares

        ms = _timed(lambda: _sum_of_squares(g))
        rows.append((f"CPU sum of squares, {threads} threads (ns/elem)", f"{ms * 1e6 / m:.3f}"))
    torch.set_num_threads(os.cpu_count() or 1)
    p.grad = None


def engine_phases(size: str, rows: list, steps: int = 4) -> None:
    import zerolaunch.zero.engine as engine_mod
    from zerolaunch.models.gpt import build as build_gpt
    from zerolaunch.zero import Engine
    from zerolaunch.zero.options import (
        EngineOptions,
        OffloadOptions,
        OptimizerOptions,
        PrecisionOptions,
        ZeroOptions,
    )

    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from _row_process import init_single_rank_group
    from run import _batches

    init_single_rank_group()
    device = torch.device("cuda", 0)
    opts = EngineOptions(
        zero=ZeroOptions(
            stage=2,
            reduce_bucket_size=500_000_000,
            overlap_comm=True,
            offload_optimizer=OffloadOptions(device="cpu", pin_memory=True),
        ),
        precision=PrecisionOptions(dtype="bf16"),
        optimizer=OptimizerOptions(name="adamw", lr=3e-4, betas=(0.9, 0.95), weight_decay=0.1),
        gradient_clipping=1.0,
    )
    t = time.perf_counter()
    eng = Engine(build_gpt(size=size, vocab_size=50304, seq_len=2048), opts, device=device)
    rows.append((f"{size} engine construction", f"{time.perf_counter() - t:.1f} s"))
    phases: dict[str, list[float]] = {}

    def wrap(obj, name, label):
        inner = getattr(obj, name)

        def timed(*a, **k):
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            r = inner(*a, **k)
            torch.cuda.synchronize()
            phases.setdefault(label, []).append((time.perf_counter() - t0) * 1e3)
            return r

        setattr(obj, name, timed)

    wrap(engine_mod, "sum_of_squares", "step: sum of squares on the host (when not taken on device)")
    wrap(engine_mod, "check_and_scale", "step: norm all-reduce + clip factor")
    wrap(eng.shards, "step", "step: chunked CPU AdamW + H2D sends + all-gathers")
    batches = _batches(50304, 2048, 8, steps + 2, device)
    for i, b in enumerate(batches):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        loss = eng(**b).loss
        torch.cuda.synchronize()
        t1 = time.perf_counter()
        eng.backward(loss)
        torch.cuda.synchronize()
        t2 = time.perf_counter()
        eng.step()
        torch.cuda.synchronize()
        t3 = time.perf_counter()
        if i >= 2:
            phases.setdefault("forward", []).append((t1 - t0) * 1e3)
            phases.setdefault("backward (+ D2H grads)", []).append((t2 - t1) * 1e3)
            phases.setdefault("step total", []).append((t3 - t2) * 1e3)
            phases.setdefault("whole step", []).append((t3 - t0) * 1e3)
    for label, v in phases.items():
        v = v[2:] if len(v) > steps else v
        rows.append((f"{size} zl-z2-off {label}", f"{statistics.median(v):.1f} ms"))


def fsdp2_phases(size: str, rows: list, steps: int = 4) -> None:
    """The peer's side of the offload comparison: FSDP2 + CPUOffloadPolicy (bench/run.py's fsdp2-off, fused CPU
    AdamW), each phase synced, so a slow peer row can be traced to its phase (its 1.3B step measured 1345 and
    1673 ms in two calls of bench/run.py, 774 ms in #19's outside harness)."""
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from run import _batches, build_step

    _, _, parts = build_step("fsdp2-off", size, 2048)
    model, opt = parts["module"], parts["stepper"]
    device = torch.device("cuda", 0)
    phases: dict[str, list[float]] = {}

    def synced(fn):
        """(fn(), wall ms) with the device synced on both sides."""
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        out = fn()
        torch.cuda.synchronize()
        return out, (time.perf_counter() - t0) * 1e3

    for i, b in enumerate(_batches(50304, 2048, 8, steps + 2, device)):
        loss, fwd = synced(lambda b=b: model(**b).loss)
        _, bwd = synced(loss.backward)
        _, clip = synced(lambda: torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0))
        _, step = synced(opt.step)
        _, zero = synced(lambda: opt.zero_grad(set_to_none=True))
        if i < 2:
            continue
        for label, ms in (
            ("forward", fwd),
            ("backward (+ D2H grads)", bwd),
            ("clip_grad_norm_ (host grads)", clip),
            ("optimizer.step (fused CPU AdamW)", step),
            ("zero_grad", zero),
            ("whole step", fwd + bwd + clip + step + zero),
        ):
            phases.setdefault(label, []).append(ms)
    for label, v in phases.items():
        rows.append((f"{size} fsdp2-off {label}", f"{statistics.median(v):.1f} ms"))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--size", default="1.3b")
    ap.add_argument(
        "--parts",
        default="rates,engine",
        help="comma list of: rates (copy and CPU AdamW rates), engine (zerolaunch's phases), peer (FSDP2's)",
    )
    args = ap.parse_args()
    parts = args.parts.split(",")
    rows = [("torch threads / cpu count", f"{torch.get_num_threads()} / {os.cpu_count()}")]
    if "rates" in parts:
        rates(rows)
    if "engine" in parts:
        engine_phases(args.size, rows)
    if "peer" in parts:
        fsdp2_phases(args.size, rows)
    w = max(len(r[0]) for r in rows)
    print("\nOFFLOAD PROFILE")
    for k, v in rows:
        print(f"{k:<{w}}  {v}")


if __name__ == "__main__":
    main()
