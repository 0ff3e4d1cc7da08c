"""The launcher's side of reliability: workers never outlive it, one run per run_dir, folders that cannot
be written fail before any worker starts.

Each test drives the real CLI (tiny recipe, 2 gloo workers on CPU) as a subprocess.
"""

import json
import os
import signal
import time

import pytest

pytestmark = pytest.mark.e2e


def _start(cli, recipe, run_dir, *extra):
    return cli.popen(recipe, "--cpu", "2", "--run-dir", run_dir, *extra)


def test_sigkill_of_the_launcher_takes_every_worker_with_it(cli, tiny_recipe, tmp_path):
    run_dir = tmp_path / "run"
    proc = _start(cli, tiny_recipe(steps=100000), run_dir)
    workers = []
    try:
        cli.wait_for_a_step(proc, run_dir)
        workers = [p for p in cli.descendants(proc.pid) if cli.alive(p)]
        assert len(workers) >= 2, workers
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)
        survivors = cli.survivors(workers, within=10)
        assert not survivors, f"workers outlived the launcher: {survivors}"
    finally:
        cli.stop(proc)
        for pid in workers:
            if cli.alive(pid):
                os.kill(pid, signal.SIGKILL)


def test_a_second_run_on_the_same_run_dir_exits_2_naming_the_holder(cli, tiny_recipe, tmp_path):
    run_dir = tmp_path / "run"
    first = _start(cli, tiny_recipe(steps=100000), run_dir)
    try:
        cli.wait_for_a_step(first, run_dir)
        started = time.monotonic()
        second = cli.run(tiny_recipe(steps=3), "--cpu", "2", "--run-dir", run_dir, timeout=120)
        out = second.stdout + second.stderr
        assert second.returncode == 2, out[-3000:]
        assert f"pid {first.pid}" in out and "is in use by another run" in out
        assert "since " in out and "Traceback" not in out
        assert "launching" not in out  # no worker was started
        assert time.monotonic() - started < 60
        assert first.poll() is None  # the first run is untouched
    finally:
        cli.stop(first)


def test_a_dead_runs_lock_is_taken_over_with_a_note(cli, tiny_recipe, tmp_path):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / ".lock").write_text(json.dumps({"host": "elsewhere", "pid": 4242, "since": "yesterday"}))
    proc = cli.run(tiny_recipe(steps=2), "--cpu", "2", "--run-dir", run_dir, timeout=150)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-3000:]
    assert "took over the lock" in out and "pid 4242" in out
    assert (run_dir / ".lock").read_text() == ""  # released at the end


@pytest.mark.parametrize("which", ["run_dir", "checkpoint.dir"])
@pytest.mark.parametrize("how", ["file_in_the_way", "read_only"])
def test_a_folder_that_cannot_be_written_fails_before_any_worker(cli, tiny_recipe, tmp_path, which, how):
    if how == "read_only" and os.geteuid() == 0:
        pytest.skip("root writes to read-only folders")
    blocked = tmp_path / "blocked"
    if how == "file_in_the_way":
        blocked.write_text("a file where a folder should be\n")
        reason = "Not a directory"
    else:
        blocked.mkdir()
        blocked.chmod(0o555)
        reason = "Permission denied"
    try:
        run_dir = blocked / "run" if which == "run_dir" else tmp_path / "run"
        extra = [] if which == "run_dir" else ["--set", f"checkpoint.dir={blocked / 'ckpt'}"]
        proc = cli.run(tiny_recipe(steps=2), "--cpu", "2", "--run-dir", run_dir, *extra, timeout=120)
    finally:
        if blocked.is_dir():
            blocked.chmod(0o755)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 2, out[-3000:]
    assert f"{which} " in out and f"cannot be written: {reason}" in out
    assert str(blocked) in out
    assert "Traceback" not in out and "launching" not in out


def test_ctrl_c_prints_one_line_and_no_worker_traceback(cli, tiny_recipe, tmp_path):
    run_dir = tmp_path / "run"
    proc = _start(cli, tiny_recipe(steps=100000), run_dir)
    try:
        cli.wait_for_a_step(proc, run_dir)
        proc.send_signal(signal.SIGINT)
        out, _ = proc.communicate(timeout=60)
        assert proc.returncode == 130, out[-3000:]
        after = out[out.index("launching") :]
        assert "Traceback" not in after and "KeyboardInterrupt" not in after, after[-3000:]
        assert "death signal" not in after
        assert "interrupted by SIGINT: all workers stopped" in after
    finally:
        cli.stop(proc)
