"""bench/fake_pg.py on the CPU: the engine at world size 8 under torch's fake process group, stages 1-3.

Runs the script as a user would (each configuration in its own subprocess, so the fake default group never
enters this pytest process) and checks: every configuration builds and steps without a skipped step, and rank
0 holds 1/8 of the fp32 master and AdamW moments, counted from the model's own parameters (padding allowed:
at most world_size - 1 elements per parameter tensor). Not checked: GPU peak memory and step times (no GPU).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
WS = 8


def test_fake_pg_world_size_8_shards_the_optimizer(tmp_path):
    out = tmp_path / "fake_pg.json"
    cmd = [sys.executable, str(ROOT / "bench" / "fake_pg.py"), "--device", "cpu", "--models", "tiny"]
    cmd += ["--world-sizes", str(WS), "--stages", "1,2,3", "--steps", "2", "--seq-len", "64"]
    cmd += ["--out", str(out)]
    env = dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1")
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=env, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "fake" in proc.stdout and "move no data" in proc.stdout

    from zerolaunch.models.gpt import build

    model = build(size="tiny", vocab_size=256, seq_len=64)
    tensors = [p.numel() for p in model.parameters() if p.requires_grad]
    numel = sum(tensors)
    rows = json.loads(out.read_text())["rows"]
    assert [(r["stage"], r["world_size"], r["status"]) for r in rows] == [(s, WS, "ok") for s in (1, 2, 3)]
    for r in rows:
        m = r["memory_bytes"]
        assert r["skipped_steps"] == 0 and r["step_ms"] > 0
        lo, hi = numel // WS, numel // WS + (WS - 1) * len(tensors)
        assert lo <= m["master"] // 4 <= hi, (r["stage"], m, numel)
        assert m["optimizer"] == 2 * m["master"]  # exp_avg + exp_avg_sq, fp32, same shard
        # the estimate's model-state figures are the engine's own (same layout code): exact equality
        assert r["estimate"]["params_numel"] == numel
        assert {k: r["estimate"]["states"][k] for k in m} == m
        if r["stage"] == 1:
            assert m["params"] >= 2 * numel  # bf16, unsharded below stage 3
        else:
            # the fp32 grad shard: 1/8 too (stage 3's tiny params stay whole: below the persistence threshold)
            assert m["grads"] == m["master"]
