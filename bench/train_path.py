"""Median step time of the real `zerolaunch train` path, read back from a run's metrics.jsonl.

    python bench/train_path.py RUN_DIR [--skip 5]

The first `--skip` steps (compile, allocator warm-up) are left out, as bench/run.py leaves out its warm-up.
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path


def read_run(run_dir: str | Path, skip: int = 5) -> dict:
    """{run_dir, steps, median_step_ms[, median_data_wait_ms]} of a run's metrics.jsonl, past its first `skip`
    steps."""
    rows = [json.loads(line) for line in (Path(run_dir) / "metrics.jsonl").read_text().splitlines() if line]
    steps = [r for r in rows if r.get("step_seconds") and r.get("step", 0) > skip]
    ms = [1e3 * r["step_seconds"] for r in steps]
    waits = [r["data_wait_ms"] for r in steps if r.get("data_wait_ms") is not None]
    out = {"run_dir": str(run_dir), "steps": len(ms), "median_step_ms": statistics.median(ms) if ms else None}
    if waits:
        out["median_data_wait_ms"] = statistics.median(waits)
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("run_dir")
    p.add_argument("--skip", type=int, default=5)
    args = p.parse_args()
    print("TRAIN_PATH " + json.dumps(read_run(args.run_dir, args.skip)))


if __name__ == "__main__":
    main()
