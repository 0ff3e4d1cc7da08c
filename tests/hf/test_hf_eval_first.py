"""evaluate() before train() with an "auto" DeepSpeed schedule: docs/hf-trainer.md says evaluate works before
train, but the engine built for it filled the schedule's total_num_steps from 0 steps and refused it. The
same script run with and without the early evaluate() must train with the same lrs (the config's
WarmupDecayLR over max_steps, installed by train()). Leaves out: several ranks (tests/hf/test_hf_trainer_deepspeed.py
evaluates after train at stages 1-3)."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("transformers", minversion="5.17")
pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parents[2]
SCRIPT = Path(__file__).with_name("_hf_eval_first.py")


def _run(mode: str, cwd: Path) -> dict:
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(REPO))
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT", "ZEROLAUNCH_RECIPE"):
        env.pop(name, None)
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), mode], cwd=cwd, env=env, capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    assert "Traceback" not in proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_evaluate_before_train_with_an_auto_schedule(tmp_path):
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    first = _run("eval-first", tmp_path / "a")
    plain = _run("train-only", tmp_path / "b")
    assert math.isfinite(first["eval_loss_before"])
    assert len(first["lrs"]) == 4
    assert first["lrs"] == plain["lrs"]
    assert max(first["lrs"]) == pytest.approx(1e-2)  # the warmup reached warmup_max_lr ("auto": the lr)
