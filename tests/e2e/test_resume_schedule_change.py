"""A resume that raises `train.steps` under a decaying schedule stretches the schedule after the fact: the lr
jumps at the resume step (a 40-step cosine at step 40 is near its floor; the same step of an 80-step cosine is
half way up). The resume says so in one line, naming both totals and the lr at the resume step under each
(computed here from the cosine's formula, not from the code under test). Leaves out: DeepSpeed's
schedulers (the same record and line; tests/unit/test_sched.py checks their formulas)."""

import math
import re

import pytest
from _helpers import tiny_gpt_recipe, write_recipe

from zerolaunch.train.schedule_change import change_line

pytestmark = pytest.mark.e2e


def _recipe(tmp_path, steps, schedule="cosine"):
    train = {
        "steps": steps,
        "micro_batch_size": 4,
        "lr": 1.0e-2,
        "lr_schedule": schedule,
        "warmup_steps": 1,
        "seed": 1234,
    }
    recipe = tiny_gpt_recipe(train=train, checkpoint={"every": 4})
    return write_recipe(tmp_path / f"r{steps}-{schedule}.yaml", recipe)


def _cosine(step, total, peak=1e-2, warmup=1, floor_ratio=1e-4):
    """nanoGPT's cosine at step `step` (steps already taken): linear warmup, then cosine to floor_ratio*peak."""
    if step < warmup:
        return peak * step / warmup
    progress = min(1.0, (step - warmup) / max(1, total - warmup))
    floor = peak * floor_ratio
    return floor + 0.5 * (1 + math.cos(math.pi * progress)) * (peak - floor)


def test_raising_steps_on_resume_warns_with_both_totals_and_the_lr_jump(cli, tmp_path):
    run_dir = tmp_path / "run"
    first = cli.run(_recipe(tmp_path, 4), "--cpu", "1", "--run-dir", run_dir, timeout=300)
    assert first.returncode == 0, (first.stdout + first.stderr)[-3000:]
    longer = cli.run(
        _recipe(tmp_path, 8), "--cpu", "1", "--run-dir", run_dir, "--resume", "auto", timeout=300
    )
    out = longer.stdout + longer.stderr
    assert longer.returncode == 0, out[-3000:]
    lines = [line for line in out.splitlines() if "schedule now spans" in line]
    assert len(lines) == 1, out[-3000:]
    assert "spans 8 steps" in lines[0] and "run 4" in lines[0] and "train.steps=4" in lines[0]
    before, after = (float(x) for x in re.search(r"goes from (\S+) to (\S+?) \(", lines[0]).groups())
    assert before == pytest.approx(_cosine(4, 4), rel=1e-2)
    assert after == pytest.approx(_cosine(4, 8), rel=1e-2)
    assert after > 10 * before


class _Engine:
    def __init__(self, total, name="cosine"):
        from zerolaunch.zero.options import SchedulerOptions
        from zerolaunch.zero.sched import LRSchedule

        self.scheduler = LRSchedule(
            SchedulerOptions(name=name, warmup_num_steps=1, total_num_steps=total), 1e-2
        )


def test_no_line_where_the_lr_does_not_change():
    assert change_line({"total_num_steps": 4}, _Engine(4), 4) is None  # same total
    assert change_line(None, _Engine(8), 4) is None  # a checkpoint from before the record
    assert change_line({"total_num_steps": 4}, _Engine(8, "none"), 4) is None  # a constant lr
    assert "spans 8 steps" in change_line({"total_num_steps": 4}, _Engine(8), 4)
