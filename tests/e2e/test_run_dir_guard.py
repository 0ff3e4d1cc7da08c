"""`zerolaunch train` never starts over silently in a folder that holds another run: a second run in the same
run dir without --resume, or a run of another run dir saving into the first one's checkpoint.dir, is refused
with exit 2 before any worker starts and leaves every file as it was; a checkpoint.dir that a live run holds
is refused naming that run; --restart moves the old run aside and trains.

One real run (one CPU worker) is shared by the module's cases. Leaves out: the guard's own rules in detail
(tests/unit/test_previous_run.py).
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from _helpers import tiny_gpt_recipe

from zerolaunch.launch.runlock import RunLock

pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parents[2]
RECIPE = yaml.safe_dump(
    tiny_gpt_recipe(
        train={"steps": 4, "micro_batch_size": 4, "lr": 1.0e-2, "seed": 1234, "log_every": 1},
        checkpoint={"every": 2},
    ),
    sort_keys=False,
)


def _train(*args, cwd: Path) -> subprocess.CompletedProcess:
    env = dict(os.environ, OMP_NUM_THREADS="1", COLUMNS="80")
    env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
    return subprocess.run(
        [sys.executable, "-m", "zerolaunch", "train", "recipe.yaml", "--cpu", "1", *map(str, args)],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=150,
    )


def _snapshot(folder: Path) -> dict:
    return {
        p.relative_to(folder): p.read_bytes() for p in folder.rglob("*") if p.is_file() and p.name != ".lock"
    }


@pytest.fixture(scope="module")
def first_run(tmp_path_factory):
    work = tmp_path_factory.mktemp("guard")
    (work / "recipe.yaml").write_text(RECIPE)
    proc = _train("--run-dir", "R", cwd=work)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    return work


def test_a_second_run_without_resume_is_refused_and_changes_nothing(first_run):
    before = _snapshot(first_run / "R")
    proc = _train("--run-dir", "R", "--set", "train.lr=0.001", cwd=first_run)
    assert proc.returncode == 2, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert proc.stdout.strip() == ""
    err = " ".join(proc.stderr.split())
    assert err.startswith("error: run dir R already holds a run: R/metrics.jsonl logs 4 step(s)")
    assert "step_000002, step_000004, latest -> step_000004" in err
    assert "--resume auto" in err and "--run-dir NEW_DIR" in err and "--restart" in err
    assert _snapshot(first_run / "R") == before


def test_another_run_dir_saving_into_that_checkpoint_dir_is_refused(first_run):
    before = _snapshot(first_run / "R")
    proc = _train("--run-dir", "R2", "--set", "checkpoint.dir=R/checkpoints", cwd=first_run)
    assert proc.returncode == 2, proc.stdout[-2000:] + proc.stderr[-2000:]
    err = " ".join(proc.stderr.split())
    assert "checkpoint.dir R/checkpoints already holds checkpoints" in err
    assert "--set checkpoint.dir=NEW_DIR" in err
    assert _snapshot(first_run / "R") == before


def test_a_checkpoint_dir_a_live_run_holds_is_refused_naming_that_run(first_run):
    shared = first_run / "shared"
    shared.mkdir()
    with RunLock(shared, what="checkpoint.dir", run_dir=first_run / "other"):
        proc = _train("--run-dir", "R3", "--set", f"checkpoint.dir={shared}", cwd=first_run)
    assert proc.returncode == 2, proc.stdout[-2000:] + proc.stderr[-2000:]
    err = " ".join(proc.stderr.split())
    assert f"checkpoint.dir {shared} is in use by another run (run dir {first_run / 'other'}" in err
    assert not (first_run / "R3" / "metrics.jsonl").exists()


def test_resume_auto_of_the_finished_run_says_there_is_nothing_to_do(first_run):
    proc = _train("--run-dir", "R", "--resume", "auto", cwd=first_run)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    out = " ".join(proc.stdout.split())
    assert out == (
        "nothing to do: the checkpoint R/checkpoints/step_000004 is at step 4 and train.steps is 4. To train "
        "further, raise it (--set train.steps=8) with --resume auto."
    )


def test_a_latest_naming_a_missing_step_is_refused_naming_the_newest_good_one(first_run):
    latest = first_run / "R" / "checkpoints" / "latest"
    latest.write_text("step_000003\n")
    try:
        proc = _train("--run-dir", "R", "--resume", "auto", "--set", "train.steps=6", cwd=first_run)
    finally:
        latest.write_text("step_000004\n")
    assert proc.returncode == 2, proc.stdout[-2000:] + proc.stderr[-2000:]
    err = " ".join(proc.stderr.split())
    assert err == (
        "error: R/checkpoints/latest names step_000003, which does not exist. The newest complete checkpoint "
        "is step_000004: resume from it with --resume R/checkpoints/step_000004, or write step_000004 into "
        "R/checkpoints/latest."
    )


def test_a_damaged_latest_checkpoint_names_the_newest_other_good_one(first_run):
    rank_file = first_run / "R" / "checkpoints" / "step_000004" / "rank_0.safetensors"
    original = rank_file.read_bytes()
    data = bytearray(original)
    data[len(data) // 2] ^= 0xFF
    rank_file.write_bytes(bytes(data))
    try:
        proc = _train("--run-dir", "R", "--resume", "auto", "--set", "train.steps=6", cwd=first_run)
    finally:
        rank_file.write_bytes(original)
    assert proc.returncode == 2, proc.stdout[-2000:] + proc.stderr[-2000:]
    err = " ".join(proc.stderr.split())
    assert "rank_0.safetensors is damaged" in err
    assert (
        "The newest other complete checkpoint is step_000002: resume from it with --resume R/checkpoints/step_000002"
        in err
    )
    assert "[rank0]" not in proc.stderr and "error:" not in proc.stdout


def test_restart_moves_the_old_run_aside_and_trains(first_run):
    old_metrics = (first_run / "R" / "metrics.jsonl").read_bytes()
    proc = _train("--run-dir", "R", "--restart", "--set", "train.steps=2", cwd=first_run)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    aside = [p for p in (first_run / "R").iterdir() if p.name.startswith("previous-")]
    assert len(aside) == 1
    assert f"moved the previous run aside to R/{aside[0].name}/" in proc.stdout
    assert (aside[0] / "metrics.jsonl").read_bytes() == old_metrics
    assert sorted(p.name for p in (aside[0] / "checkpoints").iterdir()) == [
        "latest",
        "step_000002",
        "step_000004",
    ]
    assert (first_run / "R" / "checkpoints" / "latest").read_text().strip() == "step_000002"
    # the run's last lines say where everything went
    tail = proc.stdout.splitlines()[-5:]
    assert tail[0] == "results:"
    assert tail[1].split() == [
        "final",
        "checkpoint",
        "R/checkpoints/step_000002",
        "(zerolaunch",
        "convert-checkpoint",
        "R/checkpoints",
        "OUT)",
    ]
    assert tail[2].split() == ["metrics", "R/metrics.jsonl"] and tail[3].split() == [
        "summary",
        "R/summary.json",
    ]
    assert tail[4].split()[0] == "logs" and tail[4].split()[1].startswith("R/logs/")
    assert len((first_run / "R" / "metrics.jsonl").read_text().splitlines()) == 2


def test_resume_from_another_runs_checkpoint_is_refused_then_restart_starts_there(first_run, tmp_path):
    import shutil

    shutil.copytree(first_run / "R", tmp_path / "R", ignore=shutil.ignore_patterns(".lock"))
    shutil.copytree(first_run / "R" / "checkpoints", tmp_path / "B" / "checkpoints")
    (tmp_path / "recipe.yaml").write_text(RECIPE)
    other = "B/checkpoints/step_000002"
    before = _snapshot(tmp_path)
    proc = _train("--run-dir", "R", "--resume", other, cwd=tmp_path)
    assert proc.returncode == 2, proc.stdout[-2000:] + proc.stderr[-2000:]
    err = " ".join(proc.stderr.split())
    assert f"--resume {other} is a checkpoint of another run" in err
    assert "--restart" in err and "--run-dir NEW_DIR" in err
    assert _snapshot(tmp_path) == before
    proc = _train("--run-dir", "R", "--resume", other, "--restart", cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "moved the previous run aside" in proc.stdout
    steps = [json.loads(line)["step"] for line in (tmp_path / "R" / "metrics.jsonl").read_text().splitlines()]
    assert steps == [3, 4]  # this run's history starts at the other run's checkpoint
    assert {p: b for p, b in _snapshot(tmp_path).items() if p.parts[0] == "B"} == {
        p: b for p, b in before.items() if p.parts[0] == "B"
    }
