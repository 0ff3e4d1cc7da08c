"""Where one training step's GPU time goes, by kernel category, for several configurations side by side.

    PYTHONPATH=$PWD python bench/step_profile.py --size 1.3b --engines torch-amp-compile,zl-z2-compile-model

Each configuration is bench/run.py's (`build_step`: same GPT, seq 2048, micro batch 8, bf16, AdamW, clipping),
in its own process. After `--warmup` steps, `--steps` steps run under torch.profiler; every CUDA kernel's time
is summed into a category by its name (matmul, attention, multi-tensor kernels: the optimizer and foreach ops such
as the grad norm, inductor's generated kernels, copies and casts, collectives, layer norms, the rest), per step. "busy" is the sum of all kernel time per step, "wall" the
step's time measured with CUDA events outside the profiler (so profiling overhead does not count); where busy is
below wall the GPU idled (launch gaps, host syncs) or kernels ran on two streams at once. The largest kernels are
listed too.

Each row also says how often per timed step the caching allocator called the driver (cudaMalloc / cudaFree of a
segment, or a retry after emptying its cache): waits no kernel shows.

"idle" is measured in the profiled steps themselves, so it does not depend on how much the profiler slows the
kernels: the time per step in which no kernel, copy or fill runs on the GPU (the union of their intervals
against the profiled span). The longest gaps are listed with the kernels on either side; with `--host` the steps
are profiled with host activity and Python stacks too, and each gap names the host code that launched the kernel
ending it and how long after the GPU went idle that launch came (late: the host was the bottleneck; early: the
kernel waited on something else, e.g. another stream). Host profiling slows the host, so `--host` gaps are an
upper bound; compare configurations under the same flag.
A measurement, not a test: what it prints is for deciding where a step can still lose time.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from _row_process import print_result, row_result  # noqa: E402  (bench/ is scripts, not a package)
from run import _batches, build_step, one_args  # noqa: E402

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


def idle_gaps(intervals: list[tuple], min_gap_us: float = 10.0):
    """(idle us in the span, gaps) for device activity `intervals` [(start us, end us, tag)], any order,
    possibly overlapping (several streams); a tag is anything (a kernel's name, its event). The span runs from
    the first start to the last end; a gap is a stretch of it no interval covers, listed when at least
    `min_gap_us` long as (start us, length us, tag of the interval whose end opened it, tag of the one whose
    start closed it), longest first. Every gap counts in the idle total, listed or not."""
    ordered = sorted(intervals, key=lambda iv: (iv[0], iv[1]))  # tags need not compare
    if not ordered:
        return 0.0, []
    idle, gaps = 0.0, []
    covered_to, last_tag = ordered[0][1], ordered[0][2]
    for start, end, tag in ordered[1:]:
        if start > covered_to:
            idle += start - covered_to
            if start - covered_to >= min_gap_us:
                gaps.append((covered_to, start - covered_to, last_tag, tag))
        if end >= covered_to:
            covered_to, last_tag = end, tag
    gaps.sort(key=lambda g: -g[1])
    return idle, gaps


def launch_site(ancestry: list[str]) -> str:
    """Where to blame a launch, from the names of its host op and the events enclosing it, innermost first
    (with_stack records each Python call as an event named "file(line): function", and may fill an op's own
    stack too): the innermost frame in zerolaunch/ or bench/, else the outermost name ("?" when empty)."""
    for name in ancestry:
        if "zerolaunch/" in name or "bench/" in name:
            return name
    return ancestry[-1] if ancestry else "?"


def _ancestry(op) -> list[str]:
    names = []
    while op is not None:
        names += [op.name, *(op.stack or ())]
        op = op.cpu_parent
    return names


LAUNCH_CALL = re.compile(r"cu(da)?[A-Z]")
"""A CUDA runtime or driver call on the host (cudaLaunchKernel, cuLaunchKernel for inductor's kernels,
cudaMemcpyAsync, ...): the profiler gives it the CUPTI correlation id of the device work it queued, so a
kernel's `id` finds its launch. (Not through the kernel's linked_correlation_id to its op: on the device
machine's torch 2.11 that lookup found a launch for no gap at all, 2026-12-05.)"""


def device_work(events: list) -> list:
    """The events that are device work (kernels, copies, fills). torch also mirrors each record_function range
    (e.g. "Optimizer.step#AdamW.step") onto the GPU timeline as a user annotation when host activity is
    profiled; it spans kernels and the idle time between them, so it is neither a kernel nor busy time."""
    from torch.autograd import DeviceType

    return [
        e
        for e in events
        if e.device_type == DeviceType.CUDA
        and not getattr(e, "is_user_annotation", False)
        and getattr(e, "activity_type", "") != "gpu_user_annotation"
    ]


def _launched_by(launch) -> str:
    """'<op> in <site>': the op that made the runtime call `launch` (its nearest aten:: ancestor, else the call
    itself) and the project frame it came from (launch_site)."""
    ancestry = _ancestry(launch)
    op = next((name for name in ancestry if name.startswith("aten::")), launch.name)
    return f"{op} in {launch_site(ancestry)}"


def gap_report(events: list, steps: int, top: int = 8, host: bool = False) -> dict:
    """idle ms per step and the `top` longest gaps of a profile's events (see idle_gaps); with host activity
    recorded (`host`), each gap also names the host code that launched the device work closing it and when,
    relative to the start of the gap (its runtime call: LAUNCH_CALL)."""
    from torch.autograd import DeviceType

    idle_us, gaps = idle_gaps([(e.time_range.start, e.time_range.end, e) for e in device_work(events)])
    launches = {}
    if host:
        launches = {e.id: e for e in events if e.device_type == DeviceType.CPU and LAUNCH_CALL.match(e.name)}
    rows = []
    for start, length, before, after in gaps[:top]:
        row = {"ms": length / 1e3, "after": before.name[:70], "before": after.name[:70]}
        launch = launches.get(after.id)
        if launch is not None:
            row["launched_by"] = _launched_by(launch)
            row["launch_after_idle_ms"] = (launch.time_range.start - start) / 1e3
        rows.append(row)
    return {"idle_ms": idle_us / 1e3 / steps, "gaps": rows}


ALLOCATOR_COUNTERS = {
    # memory_stats() key (cumulative since the process started) -> what the row reports per timed step
    "segment.all.allocated": "device_mallocs",
    "segment.all.freed": "device_frees",
    "num_alloc_retries": "alloc_retries",
}


def allocator_churn(before: dict, after: dict, steps: int) -> dict:
    """Per step, how often the caching allocator went to the driver in the timed steps (torch.cuda.memory_stats
    before and after them): cudaMalloc / cudaFree of whole segments and the retries after freeing its cache
    (a cudaFree waits for the device). In steady state all three should be 0; anything else is a place where
    the GPU may sit idle that no kernel shows."""
    return {
        name: (after.get(key, 0) - before.get(key, 0)) / steps for key, name in ALLOCATOR_COUNTERS.items()
    }


def profile_one(
    engine: str, size: str, steps: int, warmup: int, seq_len: int, micro_batch: int, host: bool = False
) -> dict:
    import torch
    from torch.profiler import ProfilerActivity, profile

    step, _, _ = build_step(engine, size, seq_len)
    batches = _batches(50304, seq_len, micro_batch, warmup + 2 * steps, torch.device("cuda", 0))
    for b in batches[:warmup]:
        step(b)
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    wall = []
    before = torch.cuda.memory_stats()
    for b in batches[warmup : warmup + steps]:  # timed without the profiler
        start.record()
        step(b)
        end.record()
        torch.cuda.synchronize()
        wall.append(start.elapsed_time(end))
    allocator = allocator_churn(before, torch.cuda.memory_stats(), steps)
    activities = [ProfilerActivity.CPU, ProfilerActivity.CUDA] if host else [ProfilerActivity.CUDA]
    with profile(activities=activities, with_stack=host) as prof:
        for b in batches[warmup + steps :]:
            step(b)
        torch.cuda.synchronize()
    events = prof.events()
    by_category: dict[str, float] = {}
    by_kernel: dict[str, float] = {}
    for evt in device_work(events):  # host ops and runtime calls: their device time is their kernels'
        ms = evt.time_range.elapsed_us() / 1e3 / steps
        by_category[category(evt.name)] = by_category.get(category(evt.name), 0.0) + ms
        by_kernel[evt.name] = by_kernel.get(evt.name, 0.0) + ms
    top = sorted(by_kernel.items(), key=lambda kv: -kv[1])[:12]
    return {
        "engine": engine,
        "size": size,
        "wall_ms": statistics.median(wall),
        "busy_ms": sum(by_category.values()),
        "by_category_ms": by_category,
        "top_kernels_ms": [[name[:90], ms] for name, ms in top],
        "peak_gib": torch.cuda.max_memory_allocated() / 2**30,
        "steps": steps,
        "allocator": allocator,
        **gap_report(events, steps, host=host),
    }


LABELS = [c for c, _ in CATEGORIES] + ["other"]
HEADER = f"{'engine':<22}{'wall':>8}{'busy':>8}{'idle':>8}" + "".join(f"{c[:10]:>11}" for c in LABELS)


def row_line(r: dict) -> str:
    if "error" in r:
        return f"{r['engine']:<22} FAILED: {r['error'][:150]}"
    cats = r["by_category_ms"]
    return f"{r['engine']:<22}{r['wall_ms']:>8.1f}{r['busy_ms']:>8.1f}{r['idle_ms']:>8.1f}" + "".join(
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
            churn = ", ".join(f"{k} {v:g}" for k, v in r["allocator"].items())
            print(f"{r['engine']}: caching allocator per timed step: {churn}")
            print(
                f"{r['engine']}: longest GPU idle gaps of {r['steps']} profiled steps (ms, between kernels)"
            )
            for gap in r["gaps"]:
                print(f"  {gap['ms']:8.2f}  after {gap['after']}\n            before {gap['before']}")
                if "launched_by" in gap:
                    print(
                        f"            launched {gap['launch_after_idle_ms']:+.2f} ms into the gap by {gap['launched_by']}"
                    )


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
    p.add_argument(
        "--host", action="store_true", help="also profile host activity with Python stacks (see above)"
    )
    args = p.parse_args()
    if args.one:
        r = profile_one(
            args.one, args.size, args.steps, args.warmup, args.seq_len, args.micro_batch, args.host
        )
        print_result(r)
        return
    rows = []
    print(HEADER, flush=True)
    for engine in args.engines.split(","):
        try:
            rows.append(
                row_result(
                    [
                        sys.executable,
                        __file__,
                        *one_args(engine, args.size, args),
                        *(["--host"] if args.host else []),
                    ],
                    args.timeout,
                )
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
