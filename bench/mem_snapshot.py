"""Where the peak GPU memory of one bench configuration goes: live allocations at the peak, by source line.

    python bench/mem_snapshot.py --engines zl-z2,fsdp2 --size 1.3b --steps 3

Each configuration runs in its own process (as bench/run.py's rows do) under
`torch.cuda.memory._record_memory_history`, from before the model is built, so every allocation is in the
trace. The trace is replayed (alloc / free_completed) to find the moment the allocated bytes peak; the blocks
live then are grouped by the innermost stack frame in zerolaunch/, bench/ or torch/ code that is not the
allocator itself, and the largest groups are printed with their GiB. A tool for finding memory, not a test.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from collections import defaultdict

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# frames that only say "an allocation happened": skipped when naming where a block came from
_NOISE = ("torch/cuda/memory.py", "torch/utils/_", "<frozen", "torch/_ops.py", "torch/overrides.py")


def _site(frames) -> str:
    """The innermost frame in our code (zerolaunch/, bench/), else the innermost torch frame worth naming."""
    ours = [f for f in frames if "/zerolaunch/" in f["filename"] or "/bench/" in f["filename"]]
    pick = ours[0] if ours else next((f for f in frames if not any(n in f["filename"] for n in _NOISE)), None)
    if pick is None:
        return "?"
    path = pick["filename"]
    for root in ("/zerolaunch/", "/bench/", "/torch/"):
        if root in path:
            path = root.strip("/") + "/" + path.split(root, 1)[1]
            break
    return f"{path}:{pick['line']} {pick['name']}"


def _caller(frames) -> str:
    """The frame above the site in our code: tells apart e.g. which module's forward made an activation."""
    ours = [f for f in frames if "/zerolaunch/" in f["filename"] or "/bench/" in f["filename"]]
    if len(ours) < 2:
        return ""
    f = ours[1]
    return f"{f['filename'].rsplit('/', 2)[-2]}/{f['filename'].rsplit('/', 1)[-1]}:{f['line']} {f['name']}"


def peak_breakdown(snapshot: dict, top: int) -> dict:
    trace = snapshot["device_traces"][0]
    live: dict[int, tuple[int, list]] = {}
    total = peak = 0
    peak_live: dict[int, tuple[int, list]] = {}
    peak_index = 0
    for i, ev in enumerate(trace):
        action = ev["action"]
        if action == "alloc":
            live[ev["addr"]] = (ev["size"], ev.get("frames", []))
            total += ev["size"]
            if total > peak:
                peak, peak_live, peak_index = total, dict(live), i
        elif action == "free_completed" and ev["addr"] in live:
            total -= live.pop(ev["addr"])[0]
    groups: dict[tuple[str, str], list[int]] = defaultdict(lambda: [0, 0])
    for size, frames in peak_live.values():
        g = groups[(_site(frames), _caller(frames))]
        g[0] += size
        g[1] += 1
    # what was being allocated when the peak was reached: the phase (forward / backward / step)
    at_peak = trace[peak_index].get("frames", [])
    rows = sorted(groups.items(), key=lambda kv: -kv[1][0])
    return {
        "peak_gib": peak / 2**30,
        "events": len(trace),
        "at_peak": [_site(at_peak), _caller(at_peak)],
        "rows": [
            {"site": site, "caller": caller, "gib": b / 2**30, "blocks": n}
            for (site, caller), (b, n) in rows[:top]
        ],
        "rest_gib": sum(b for _, (b, _) in rows[top:]) / 2**30,
    }


def run_one(engine: str, size: str, steps: int, seq_len: int, micro_batch: int, top: int) -> dict:
    import torch

    from bench.run import _batches, build_step

    torch.cuda.memory._record_memory_history(max_entries=2_000_000, stacks="python")
    step, _ = build_step(engine, size, seq_len)
    batches = _batches(50304, seq_len, micro_batch, steps, torch.device("cuda", 0))
    for b in batches:
        step(b)
        torch.cuda.synchronize()
    snapshot = torch.cuda.memory._snapshot()
    torch.cuda.memory._record_memory_history(enabled=None)
    out = peak_breakdown(snapshot, top)
    out.update(engine=engine, size=size, max_allocated_gib=torch.cuda.max_memory_allocated() / 2**30)
    return out


def print_breakdown(r: dict) -> None:
    print(
        f"\n== {r['engine']} {r['size']}: peak {r['peak_gib']:.2f} GiB replayed "
        f"(max_memory_allocated {r['max_allocated_gib']:.2f}), {r['events']} events"
    )
    print(f"   peak reached at: {r['at_peak'][0]}  <- {r['at_peak'][1]}")
    for row in r["rows"]:
        print(f"   {row['gib']:7.2f} GiB {row['blocks']:6d} blk  {row['site']}  <- {row['caller']}")
    print(f"   {r['rest_gib']:7.2f} GiB  (the rest)")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--engines", default="zl-z2,fsdp2")
    p.add_argument("--one")
    p.add_argument("--size", default="1.3b")
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--seq-len", type=int, default=2048)
    p.add_argument("--micro-batch", type=int, default=8)
    p.add_argument("--top", type=int, default=18)
    p.add_argument("--timeout", type=int, default=200)
    p.add_argument("--json-out")
    args = p.parse_args()
    if args.one:
        r = run_one(args.one, args.size, args.steps, args.seq_len, args.micro_batch, args.top)
        print("RESULT " + json.dumps(r), flush=True)
        return
    results = []
    for engine in args.engines.split(","):
        cmd = [sys.executable, os.path.abspath(__file__), "--one", engine, "--size", args.size]
        cmd += [
            "--steps",
            str(args.steps),
            "--seq-len",
            str(args.seq_len),
            "--micro-batch",
            str(args.micro_batch),
        ]
        cmd += ["--top", str(args.top)]
        p_ = subprocess.run(cmd, capture_output=True, text=True, timeout=args.timeout)
        line = [ln for ln in p_.stdout.splitlines() if ln.startswith("RESULT ")]
        if p_.returncode or not line:
            print(f"[{engine}] FAILED: " + " | ".join((p_.stderr or p_.stdout).strip().splitlines()[-5:]))
            continue
        r = json.loads(line[-1][len("RESULT ") :])
        results.append(r)
        print_breakdown(r)
    if args.json_out:
        with open(args.json_out, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
