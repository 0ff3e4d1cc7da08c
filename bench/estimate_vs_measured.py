"""estimate-memory vs measured peak for one recipe at ZeRO stages 1-3, on this machine's GPU(s).

    python bench/estimate_vs_measured.py [--recipe recipes/hf-llama-1b.yaml] [--stages 1 2 3] [--steps 3]

For each stage it runs `zerolaunch estimate-memory RECIPE --measure --json --set
deepspeed.zero_optimization.stage=S` (a few real steps in a fresh process; the model is built from the
recipe's config, no hub access) and prints estimated peak, measured `torch.cuda.max_memory_allocated` (steps
after the first), their ratio, and whether it is within --tolerance. Exit 1 when a stage is outside it.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--recipe", default="recipes/hf-llama-1b.yaml")
    p.add_argument("--stages", type=int, nargs="+", default=[1, 2, 3])
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--gpus", type=int, default=1)
    p.add_argument("--tolerance", type=float, default=0.05)
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="K=V")
    args = p.parse_args()
    rows, bad = [], 0
    for stage in args.stages:
        cmd = [sys.executable, "-m", "zerolaunch", "estimate-memory", args.recipe, "--measure", "--json"]
        cmd += ["--gpus", str(args.gpus), "--measure-steps", str(args.steps)]
        for kv in [f"deepspeed.zero_optimization.stage={stage}", *args.overrides]:
            cmd += ["--set", kv]
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=540)
        if out.returncode != 0:
            print(f"stage {stage}: exit {out.returncode}\n{out.stdout[-2000:]}\n{out.stderr[-2000:]}")
            bad += 1
            continue
        data = json.loads(out.stdout)
        m = data["measured"]
        est, got = m["peak"]["estimated"], m["peak"]["measured_max_allocated"]
        ratio = est / got if got else float("nan")
        ok = got is not None and abs(ratio - 1) <= args.tolerance
        bad += not ok
        rows.append((m["row"], est, got, ratio, ok, m["components"]))
    print(
        f"{'row':<28} {'estimated GiB':>14} {'measured GiB':>13} {'est/meas':>9}  within {args.tolerance:.0%}"
    )
    for label, est, got, ratio, ok, _ in rows:
        meas = f"{got / 2**30:13.3f}" if got else f"{'-':>13}"
        print(f"{label:<28} {est / 2**30:14.3f} {meas} {ratio:9.4f}  {'yes' if ok else 'NO'}")
    for label, *_, comps in rows:
        parts = ", ".join(f"{k} {v['estimated']}/{v['measured']}" for k, v in comps.items())
        print(f"  {label} components est/meas bytes: {parts}")
    print("ESTIMATE_VS_MEASURED " + json.dumps([{"row": r[0], "est": r[1], "meas": r[2]} for r in rows]))
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
