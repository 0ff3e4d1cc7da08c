"""Where one training step's GPU time goes, by kernel category, for several configurations side by side.

    PYTHONPATH=$PWD python bench/step_profile.py --size 1.3b --engines torch-amp-compile,zl-z2-compile-model

Each configuration is bench/run.py's (`build_step`: same GPT, seq 2048, micro batch 8, bf16, AdamW, clipping),
in its own process. After `--warmup` steps, `--steps` steps run under torch.profiler; every CUDA kernel's time
is summed into a category by its name (matmul, attention, multi-tensor kernels: the optimizer and foreach ops such
as the grad norm, inductor's generated kernels, copies and casts, collectives, layer norms, the rest), per step. "busy" is the sum of all kernel time per step, "wall" the
step's time measured with CUDA events outside the profiler (so profiling overhead does not count); where busy is
below wall the GPU idled (launch gaps, host syncs) or kernels ran on two streams at once. The largest kernels are
listed too. A measurement, not a test: what it prints is for deciding where a step can still lose time.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from run import _batches, build_step, one_args, one_result  # noqa: E402  (bench/ is scripts, not a package)

CATEGORIES = (
    # (category, substrings of a kernel's name, lowercased); the first match wins, so order matters
    ("attention", ("flash", "fmha", "attention", "sdpa")),
    # fused / foreach kernels: the optimizer step and foreach ops such as the grad norm (torch's _foreach_norm)
    ("multi-tensor", ("adam", "multi_tensor_apply", "sgd")),
    ("matmul", ("gemm", "xmma", "cutlass", "nvjet", "wgmma", "cublas", "matmul", "splitk")),
    ("collective", ("nccl",)),
    ("inductor", ("triton",)),
    ("copy/cast", ("copy", "memcpy", "memset", "cast", "fill")),
    ("loss", ("cross_entropy", "log_softmax", "softmax", "nll")),
    ("norm", ("norm",)),  # layer norms and other norm kernels outside the multi-tensor ones
)


def category(kernel_name: str) -> str:
    name = kernel_name.lower()
    for label, keys in CATEGORIES:
        if any(k in name for k in keys):
            return label
    return "other"


def profile_one(engine: str, size: str, steps: int, warmup: int, seq_len: int, micro_batch: int) -> dict:
    import torch
    from torch.profiler import ProfilerActivity, profile

    step, _, _ = build_step(engine, size, seq_len)
    batches = _batches(50304, seq_len, micro_batch, warmup + 2 * steps, torch.device("cuda", 0))
    for b in batches[:warmup]:
        step(b)
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    wall = []
    for b in batches[warmup : warmup + steps]:  # timed without the profiler
        start.record()
        step(b)
        end.record()
        torch.cuda.synchronize()
        wall.append(start.elapsed_time(end))
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for b in batches[warmup + steps :]:
            step(b)
        torch.cuda.synchronize()
    by_category: dict[str, float] = {}
    by_kernel: dict[str, float] = {}
    for evt in prof.key_averages():
        us = getattr(evt, "self_device_time_total", None)
        if us is None:  # older torch
            us = evt.self_cuda_time_total
        if not us:
            continue  # a host-side event (with only CUDA activity asked for: runtime calls)
        ms = us / 1e3 / steps
        by_category[category(evt.key)] = by_category.get(category(evt.key), 0.0) + ms
        by_kernel[evt.key] = by_kernel.get(evt.key, 0.0) + ms
    top = sorted(by_kernel.items(), key=lambda kv: -kv[1])[:12]
    return {
        "engine": engine,
        "size": size,
        "wall_ms": statistics.median(wall),
        "busy_ms": sum(by_category.values()),
        "by_category_ms": by_category,
        "top_kernels_ms": [[name[:90], ms] for name, ms in top],
        "peak_gib": torch.cuda.max_memory_allocated() / 2**30,
    }


LABELS = [c for c, _ in CATEGORIES] + ["other"]
HEADER = f"{'engine':<22}{'wall':>8}{'busy':>8}" + "".join(f"{c[:10]:>11}" for c in LABELS)


def row_line(r: dict) -> str:
    if "error" in r:
        return f"{r['engine']:<22} FAILED: {r['error'][:150]}"
    cats = r["by_category_ms"]
    return f"{r['engine']:<22}{r['wall_ms']:>8.1f}{r['busy_ms']:>8.1f}" + "".join(
        f"{cats.get(c, 0.0):>11.1f}" for c in LABELS
    )


def print_table(rows: list[dict]) -> None:
    print(HEADER)
    for r in rows:
        print(row_line(r))
    for r in rows:
        if "error" not in r:
            print(f"\n{r['engine']}: largest kernels, ms per step")
            for name, ms in r["top_kernels_ms"][:8]:
                print(f"  {ms:8.2f}  {name}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--engines", default="torch-amp-compile,zl-z2-compile-model")
    p.add_argument("--one")
    p.add_argument("--size", default="1.3b")
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--seq-len", type=int, default=2048)
    p.add_argument("--micro-batch", type=int, default=8)
    p.add_argument("--timeout", type=int, default=300)
    p.add_argument("--json-out")
    args = p.parse_args()
    if args.one:
        r = profile_one(args.one, args.size, args.steps, args.warmup, args.seq_len, args.micro_batch)
        print("RESULT " + json.dumps(r), flush=True)
        return
    rows = []
    print(HEADER, flush=True)
    for engine in args.engines.split(","):
        try:
            rows.append(
                one_result([sys.executable, __file__, *one_args(engine, args.size, args)], args.timeout)
            )
        except RuntimeError as error:
            rows.append({"engine": engine, "error": str(error)[-400:]})
        print(row_line(rows[-1]), flush=True)  # each row as it comes: a call cut short keeps what ran
        if args.json_out:
            with open(args.json_out, "w") as f:
                json.dump(rows, f, indent=1)
    print()
    print_table(rows)


if __name__ == "__main__":
    main()
