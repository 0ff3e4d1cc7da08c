"""How the peak GPU memory of bench configurations splits: what persists between steps, and each phase's peak.

    python bench/mem_snapshot.py --engines zl-z2,fsdp2,torch --size 1.3b --steps 3

Each configuration runs in its own process (as bench/run.py's rows do), built by bench/run.py's build_step.
Hooks on the model's forward and on the stepper's .step() (the optimizer, or the engine) cut the last step
into forward / backward / step; for each phase it prints the allocated bytes when the phase starts and the
phase's peak (torch.cuda.max_memory_allocated, reset at each boundary). For zerolaunch rows it also prints the
engine's own accounting (Engine.memory_bytes(): params, grads, buckets, master, optimizer states), so
"persistent" can be split into model states and the rest. A tool for finding memory, not a test.
(torch.cuda.memory._record_memory_history was tried first: on torch 2.11 the GPT's checkpointed chunked
cross-entropy then fails with "SystemError: cross_entropy_loss returned NULL", so phases it is.)
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

GIB = 2**30


def run_one(engine: str, size: str, steps: int, seq_len: int, micro_batch: int) -> dict:
    import torch

    from bench.run import _batches, build_step

    step, _, parts = build_step(engine, size, seq_len)
    batches = _batches(50304, seq_len, micro_batch, steps, torch.device("cuda", 0))
    marks: list[tuple[str, int, int]] = []  # (boundary, allocated now, peak since the previous boundary)

    def mark(name: str) -> None:
        torch.cuda.synchronize()
        marks.append((name, torch.cuda.memory_allocated(), torch.cuda.max_memory_allocated()))
        torch.cuda.reset_peak_memory_stats()

    module, stepper = parts["module"], parts["stepper"]
    module.register_forward_pre_hook(lambda *_: mark("forward start"))
    module.register_forward_hook(lambda *_: mark("forward end"))
    inner_step = stepper.step

    def timed_step(*a, **k):
        mark("backward end")
        out = inner_step(*a, **k)
        mark("step end")
        return out

    stepper.step = timed_step
    for b in batches:
        marks.clear()
        torch.cuda.reset_peak_memory_stats()
        step(b)
        torch.cuda.synchronize()
    # the last step's marks: each mark's peak belongs to the phase that ended at it
    phases = []
    for (prev, at_start, _), (name, _, peak) in zip(marks, marks[1:], strict=False):
        phases.append({"phase": f"{prev} -> {name}", "start_gib": at_start / GIB, "peak_gib": peak / GIB})
    out = {"engine": engine, "size": size, "phases": phases}
    if marks:
        out["persistent_gib"] = marks[0][1] / GIB
    if parts.get("engine") is not None:
        out["engine_bytes_gib"] = {k: v / GIB for k, v in parts["engine"].memory_bytes().items()}
    return out


def print_result(r: dict) -> None:
    print(
        f"\n== {r['engine']} {r['size']}: allocated at step start {r.get('persistent_gib', float('nan')):.2f} GiB"
    )
    for ph in r["phases"]:
        print(f"   {ph['phase']:<32} starts at {ph['start_gib']:7.2f} GiB, peak {ph['peak_gib']:7.2f} GiB")
    if "engine_bytes_gib" in r:
        parts = ", ".join(f"{k} {v:.2f}" for k, v in r["engine_bytes_gib"].items())
        total = sum(r["engine_bytes_gib"].values())
        print(f"   engine.memory_bytes(): {parts} (sum {total:.2f} GiB)")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--engines", default="zl-z2,fsdp2,torch")
    p.add_argument("--one")
    p.add_argument("--size", default="1.3b")
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--seq-len", type=int, default=2048)
    p.add_argument("--micro-batch", type=int, default=8)
    p.add_argument("--timeout", type=int, default=200)
    p.add_argument("--json-out")
    args = p.parse_args()
    if args.one:
        r = run_one(args.one, args.size, args.steps, args.seq_len, args.micro_batch)
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
        p_ = subprocess.run(cmd, capture_output=True, text=True, timeout=args.timeout)
        line = [ln for ln in p_.stdout.splitlines() if ln.startswith("RESULT ")]
        if p_.returncode or not line:
            print(f"[{engine}] FAILED: " + " | ".join((p_.stderr or p_.stdout).strip().splitlines()[-5:]))
            continue
        r = json.loads(line[-1][len("RESULT ") :])
        results.append(r)
        print_result(r)
    if args.json_out:
        with open(args.json_out, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
