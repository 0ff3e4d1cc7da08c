"""`recipe show` flags the schedule a `deepspeed:` block changes silently.

Without a deepspeed block zerolaunch's default schedule is cosine; any deepspeed block makes it DeepSpeed's
(no scheduler: a constant lr), and train.warmup_steps then runs as DeepSpeed's WarmupLR from lr 0, so steps 1
and 2 train at lr 0. Tested: the note on the scheduler row (in the recipe and in `recipe show`), the lrs it
describes, and no such note where the default did not change. Leaves out: the table's layout (test_report_*).
"""

from __future__ import annotations

from typer.testing import CliRunner

from zerolaunch.cli.app import app
from zerolaunch.config import load_recipe
from zerolaunch.zero.sched import LRSchedule

DS_BLOCK = "deepspeed:\n  zero_optimization: {stage: 1}\n"


def _recipe(tmp_path, text):
    file = tmp_path / "r.yaml"
    file.write_text(text)
    return file


def test_a_deepspeed_block_flags_the_changed_schedule(tmp_path):
    file = _recipe(tmp_path, "train: {warmup_steps: 2, steps: 10, lr: 3.0e-4}\n" + DS_BLOCK)
    recipe = load_recipe(file)
    note = recipe.notes["engine.scheduler.name"]
    assert note.startswith("CHANGED DEFAULT: the deepspeed: block makes the lr constant")
    assert "steps 1 and 2 train at lr 0" in note
    schedule = LRSchedule(recipe.engine.scheduler, recipe.train.lr)
    assert [schedule.lr_at(k) for k in range(4)] == [0.0, 0.0, 1.5e-4, 3.0e-4]  # what the note says
    shown = CliRunner().invoke(app, ["recipe", "show", str(file)], env={"COLUMNS": "400"})
    assert shown.exit_code == 0, shown.output
    row = next(line for line in shown.output.splitlines() if "engine.scheduler.name" in line)
    assert "CHANGED DEFAULT" in row and "steps 1 and 2 train at lr 0" in row


def test_without_warmup_the_note_says_constant_only(tmp_path):
    recipe = load_recipe(_recipe(tmp_path, "train: {steps: 10}\n" + DS_BLOCK))
    note = recipe.notes["engine.scheduler.name"]
    assert "CHANGED DEFAULT" in note and "lr 0" not in note


def test_no_flag_where_the_default_did_not_change(tmp_path):
    plain = load_recipe(_recipe(tmp_path, "train: {warmup_steps: 2, steps: 10}\n"))
    chosen = load_recipe(
        _recipe(tmp_path, "train: {warmup_steps: 2, steps: 10, lr_schedule: cosine}\n" + DS_BLOCK)
    )
    for recipe in (plain, chosen):
        assert "CHANGED" not in recipe.notes.get("engine.scheduler.name", "")
        assert recipe.engine.scheduler.name == "cosine"


def test_a_deepspeed_scheduler_is_not_called_no_scheduler(tmp_path):
    file = _recipe(
        tmp_path,
        DS_BLOCK
        + "  scheduler: {type: WarmupCosineLR, params: {warmup_num_steps: 2, total_num_steps: auto}}\n",
    )
    recipe = load_recipe(file)
    assert recipe.engine.scheduler.name == "WarmupCosineLR"
    note = recipe.notes.get("train.lr_schedule", "")
    assert "no scheduler" not in note and "WarmupCosineLR" in note
    shown = CliRunner().invoke(app, ["recipe", "show", str(file)], env={"COLUMNS": "400"})
    assert shown.exit_code == 0, shown.output
    row = next(line for line in shown.output.splitlines() if "train.lr_schedule" in line)
    assert "no scheduler" not in row and "WarmupCosineLR" in row
