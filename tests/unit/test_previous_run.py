"""The launcher's guard against a fresh start over an earlier run (launch/previous_run.py) and the lock of a
checkpoint.dir (launch/runlock.py): a run dir or checkpoint.dir holding logged steps or checkpoints is
refused without --resume, naming what is there and the ways on; --restart moves the old run's own files
aside and nothing else; a checkpoint.dir held by another run names that run's run dir.

Leaves out: the launcher wiring (tests/e2e/test_run_dir_guard.py).
"""

import json
import os

import pytest

from zerolaunch.config.errors import UserError
from zerolaunch.launch.previous_run import (
    OWNER_NAME,
    PreviousRunFound,
    check_previous_run,
    find_previous,
    write_owner,
)
from zerolaunch.launch.runlock import RunLock


def _old_run(run_dir, root=None, steps=(100, 150, 200), logged=200):
    """The files a run leaves: metrics.jsonl, summary.json, recipe.resolved.json, logs/, checkpoints."""
    root = root or run_dir / "checkpoints"
    run_dir.mkdir(parents=True, exist_ok=True)
    lines = [json.dumps({"step": s, "loss": 1.0, "time_unix": 1.7e9 + s}) for s in range(1, logged + 1)]
    (run_dir / "metrics.jsonl").write_text("\n".join(lines) + "\n")
    (run_dir / "summary.json").write_text("{}")
    (run_dir / "recipe.resolved.json").write_text(json.dumps({"source": "recipes/tiny-gpt.yaml"}))
    (run_dir / "logs" / "attempt_0").mkdir(parents=True)
    for step in steps:
        folder = root / f"step_{step:06d}"
        folder.mkdir(parents=True)
        (folder / "manifest.json").write_text("{}")
    (root / "latest").write_text(f"step_{steps[-1]:06d}\n")
    return root


def test_a_fresh_start_over_an_earlier_run_is_refused_naming_what_is_there(tmp_path):
    run_dir = tmp_path / "R"
    _old_run(run_dir)
    before = sorted(p.relative_to(run_dir) for p in run_dir.rglob("*"))
    with pytest.raises(PreviousRunFound) as err:
        check_previous_run(run_dir, run_dir / "checkpoints", resume=None, restart=False)
    message = err.value.message
    assert err.value.exit_code == 2
    assert "logs 200 step(s)" in message and "up to step 200" in message
    assert "step_000100, step_000150, step_000200" in message and "latest -> step_000200" in message
    assert "recipes/tiny-gpt.yaml" in message
    assert "--resume auto" in message and "--run-dir NEW_DIR" in message and "--restart" in message
    assert f"{run_dir}/previous-" in message
    assert sorted(p.relative_to(run_dir) for p in run_dir.rglob("*")) == before  # nothing touched


def test_resume_is_let_through_and_an_empty_folder_needs_nothing(tmp_path):
    run_dir = tmp_path / "R"
    _old_run(run_dir)
    assert check_previous_run(run_dir, run_dir / "checkpoints", resume="auto", restart=False) is None
    fresh = tmp_path / "fresh"
    (fresh / "logs").mkdir(parents=True)  # a run killed before its first step leaves only logs
    (fresh / "recipe.resolved.json").write_text("{}")
    assert not find_previous(fresh, fresh / "checkpoints")
    assert check_previous_run(fresh, fresh / "checkpoints", resume=None, restart=False) is None


def test_restart_moves_only_the_old_runs_files_aside(tmp_path):
    run_dir = tmp_path / "R"
    _old_run(run_dir)
    (run_dir / "notes.txt").write_text("the user's own file")
    os.utime(run_dir / "metrics.jsonl", (1_700_000_000, 1_700_000_000))
    for path in [run_dir / "summary.json", *(run_dir / "checkpoints").iterdir()]:
        os.utime(path, (1_600_000_000, 1_600_000_000))
    RunLock(run_dir / "checkpoints").acquire().release()  # the lock file stays where it is
    line = check_previous_run(run_dir, run_dir / "checkpoints", resume=None, restart=True)
    aside = run_dir / "previous-20231114-221320"  # the old run's last write, not the clock
    assert line == f"--restart: moved the previous run aside to {aside}/ (nothing deleted)"
    assert sorted(p.name for p in aside.iterdir()) == [
        "checkpoints",
        "logs",
        "metrics.jsonl",
        "recipe.resolved.json",
        "summary.json",
    ]
    assert sorted(p.name for p in (aside / "checkpoints").iterdir()) == [
        "latest",
        "step_000100",
        "step_000150",
        "step_000200",
    ]
    assert (run_dir / "notes.txt").is_file()
    assert [p.name for p in (run_dir / "checkpoints").iterdir()] == [".lock"]
    assert not find_previous(run_dir, run_dir / "checkpoints")


def test_a_checkpoint_dir_of_another_run_is_refused_naming_that_run_and_restart_keeps_them_there(tmp_path):
    shared = tmp_path / "shared"
    _old_run(tmp_path / "R1", root=shared, steps=(10, 20))
    write_owner(shared, tmp_path / "R1")
    with pytest.raises(PreviousRunFound) as err:
        check_previous_run(tmp_path / "R2", shared, resume=None, restart=False)
    message = err.value.message
    assert message.startswith(f"checkpoint.dir {shared} already holds checkpoints")
    assert f"written by the run in {tmp_path / 'R1'}" in message
    assert "--set checkpoint.dir=NEW_DIR" in message and "--resume auto" in message
    line = check_previous_run(tmp_path / "R2", shared, resume=None, restart=True)
    moved = [p for p in shared.iterdir() if p.name.startswith("previous-")]
    assert len(moved) == 1 and str(moved[0]) in line
    assert sorted(p.name for p in moved[0].iterdir()) == ["latest", "step_000010", "step_000020"]
    assert (shared / OWNER_NAME).is_file()


def test_restart_and_resume_together_are_refused(tmp_path):
    with pytest.raises(UserError, match="give one of them"):
        check_previous_run(tmp_path, tmp_path / "checkpoints", resume="auto", restart=True)


def test_a_checkpoint_dir_locked_by_another_run_names_its_run_dir(tmp_path):
    shared = tmp_path / "shared"
    shared.mkdir()
    with RunLock(shared, what="checkpoint.dir", run_dir=tmp_path / "R1"):
        with pytest.raises(UserError) as err:
            RunLock(shared, what="checkpoint.dir", run_dir=tmp_path / "R2").acquire()
    message = err.value.message
    assert message.startswith(f"checkpoint.dir {shared} is in use by another run (run dir {tmp_path / 'R1'}")
    assert "--set checkpoint.dir=DIR" in message


def test_resume_from_another_runs_checkpoint_over_an_earlier_run_is_refused_naming_both_ways(tmp_path):
    run_a, run_b = tmp_path / "A", tmp_path / "B"
    _old_run(run_a, steps=(15, 20), logged=20)
    _old_run(run_b, steps=(10,), logged=10)
    before = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*"))
    other = str(run_b / "checkpoints" / "step_000010")
    with pytest.raises(PreviousRunFound) as err:
        check_previous_run(run_a, run_a / "checkpoints", resume=other, restart=False)
    message = err.value.message
    assert err.value.exit_code == 2
    assert f"--resume {other} is a checkpoint of another run" in message
    assert "step_000015, step_000020" in message
    assert "--restart" in message and f"{run_a}/previous-" in message and "--run-dir NEW_DIR" in message
    assert sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*")) == before  # nothing touched


def test_restart_with_resume_from_another_run_moves_this_run_aside_and_leaves_the_other(tmp_path):
    run_a, run_b = tmp_path / "A", tmp_path / "B"
    _old_run(run_a, steps=(15, 20), logged=20)
    _old_run(run_b, steps=(10,), logged=10)
    other = str(run_b / "checkpoints" / "step_000010")
    line = check_previous_run(run_a, run_a / "checkpoints", resume=other, restart=True)
    assert line and "moved the previous run aside" in line
    aside = [p for p in run_a.iterdir() if p.name.startswith("previous-")]
    assert len(aside) == 1
    assert sorted(p.name for p in (aside[0] / "checkpoints").iterdir()) == [
        "latest",
        "step_000015",
        "step_000020",
    ]
    assert not (run_a / "metrics.jsonl").exists()
    assert (run_b / "checkpoints" / "step_000010" / "manifest.json").is_file()
    assert (run_b / "metrics.jsonl").is_file()


def test_resume_from_another_run_into_an_empty_run_dir_just_starts(tmp_path):
    run_b = tmp_path / "B"
    _old_run(run_b, steps=(10,), logged=10)
    fresh = tmp_path / "A"
    other = str(run_b / "checkpoints" / "step_000010")
    assert check_previous_run(fresh, fresh / "checkpoints", resume=other, restart=False) is None


def test_restart_with_resume_of_this_runs_own_checkpoint_is_still_refused(tmp_path):
    run_a = tmp_path / "A"
    _old_run(run_a, steps=(15, 20), logged=20)
    for resume in ("auto", str(run_a / "checkpoints" / "step_000015"), str(run_a / "checkpoints")):
        with pytest.raises(UserError, match="give one of them"):
            check_previous_run(run_a, run_a / "checkpoints", resume=resume, restart=True)
    # and continuing this run from one of its own checkpoints needs no --restart
    assert check_previous_run(run_a, run_a / "checkpoints", resume="auto", restart=False) is None
