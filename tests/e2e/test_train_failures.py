"""How `zerolaunch train` fails: one worker raising or being killed ends the whole job within seconds (not
at the collective timeout) with a root-cause panel and exit code 1; Ctrl-C stops every worker.

Failures are injected by the test's model builder (_faulty_model.py, named by `tiny_recipe(fault=...)`). The
collective timeout is left at 300 s, so a run that ends quickly proves the agent, not a timeout, ended it.
Leaves out: restarts (test_train_restart.py).
"""

import signal

import pytest

pytestmark = pytest.mark.e2e


@pytest.mark.parametrize("mode", ["raise", "kill"])
def test_a_failing_rank_ends_the_job_with_a_root_cause_panel(cli, tiny_recipe, tmp_path, mode):
    run_dir = tmp_path / "run"
    proc = cli.run(
        tiny_recipe(steps=50, fault={"step": 3, "rank": 1, "mode": mode}),
        "--cpu",
        "2",
        "--run-dir",
        run_dir,
        "--timeout",
        "300",
        timeout=150,
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode == 1, out[-3000:]
    assert "training failed" in out and "rank 1 failed" in out
    if mode == "raise":
        assert "exit code 1" in out
        assert "InjectedFailure: injected fault: rank 1 fails at step 3" in out
        assert "inject_fault" in out  # a traceback line, from the @record error file
    else:
        assert "signal SIGKILL" in out
    assert "/attempt_0/1/stderr.log" in out  # the path of the failed rank's full log
    steps = [m["step"] for m in cli.metrics(run_dir)]
    assert steps == [1, 2]


def test_ctrl_c_stops_every_worker(cli, tiny_recipe, tmp_path):
    run_dir = tmp_path / "run"
    proc = cli.popen(tiny_recipe(steps=100000), "--cpu", "2", "--run-dir", run_dir)
    try:
        cli.wait_for_a_step(proc, run_dir, timeout=120)
        workers = [p for p in cli.descendants(proc.pid) if cli.alive(p)]
        assert len(workers) >= 2
        proc.send_signal(signal.SIGINT)
        out, _ = proc.communicate(timeout=30)
        assert proc.returncode == 130, out[-3000:]
        assert "interrupted" in out
        assert not cli.survivors(workers, within=5)
    finally:
        cli.stop(proc)


def _failure(tmp_path, local_rank, exitcode, timestamp, message=None):
    """A real ProcessFailure, with an @record-style error file when `message` is given."""
    import json

    from torch.distributed.elastic.multiprocessing.errors import ProcessFailure

    error_file = tmp_path / f"error_{local_rank}.json"
    if message is not None:
        error_file.write_text(
            json.dumps(
                {
                    "message": {
                        "message": message,
                        "extraInfo": {
                            "py_callstack": f"Traceback:\n  File x\n{message}",
                            "timestamp": str(timestamp),
                        },
                    }
                }
            )
        )
    failure = ProcessFailure(
        local_rank=local_rank, pid=100 + local_rank, exitcode=exitcode, error_file=str(error_file)
    )
    failure.timestamp = timestamp if message is None else failure.timestamp
    return failure


def test_root_cause_prefers_the_killed_rank_over_the_peer_that_lost_it(tmp_path):
    from zerolaunch.launch import failures

    peer = _failure(tmp_path, 0, -15, 1000, "RuntimeError: Read error: Connection reset by peer")
    killed = _failure(tmp_path, 1, -9, 1001)
    rank, found = failures.root_cause({0: peer, 1: killed})
    assert rank == 1 and found is killed
    report = failures.describe(rank, found, None)
    assert report.exit_text == "signal SIGKILL" and "killed by SIGKILL" in report.exception


def test_root_cause_is_the_first_raise_and_shows_its_traceback(tmp_path):
    from zerolaunch.launch import failures

    first = _failure(tmp_path, 1, 1, 1000, "ValueError: bad batch")
    later = _failure(tmp_path, 0, 1, 1003, "RuntimeError: something else")
    rank, found = failures.root_cause({0: later, 1: first})
    report = failures.describe(rank, found, "/logs/1/stderr.log")
    assert (rank, report.exit_text, report.exception) == (1, "exit code 1", "ValueError: bad batch")
    assert report.traceback_tail == ["Traceback:", "  File x"]  # the exception line is not repeated


def test_a_hung_rank_is_named_after_the_collective_timeout(cli, tiny_recipe, tmp_path):
    proc = cli.run(
        tiny_recipe(steps=50, fault={"step": 2, "rank": 1, "mode": "hang"}),
        "--cpu",
        "2",
        "--run-dir",
        tmp_path / "run",
        "--timeout",
        "4",
        timeout=150,
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode == 1, out[-3000:]
    assert "rank 0 failed" in out
    assert "timed out after --timeout 4 s: rank(s) 1 did not fail on their own: probably hung" in out


def test_a_worker_crash_is_said_once_on_stderr_without_the_raw_traceback(cli, tmp_path):
    # the data builder raises at its 5th batch on every rank: rank 0's dying traceback used to reach the
    # terminal before the panel that shows it again
    (tmp_path / "data5.py").write_text(
        "import torch\n"
        "def build(rank, world_size, micro_batch_size, seed, **kw):\n"
        "    def gen():\n"
        "        for i in range(100):\n"
        "            if i == 5:\n"
        "                raise RuntimeError('builder broke at batch 5')\n"
        "            x = torch.randint(0, 64, (micro_batch_size, 32))\n"
        "            yield {'input_ids': x, 'labels': x}\n"
        "    return gen()\n"
    )
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(
        "model: {builder: zerolaunch.models.gpt:build, args: {size: tiny, vocab_size: 64, seq_len: 32}}\n"
        "data: {builder: data5.py:build}\n"
        "train: {steps: 20, micro_batch_size: 4, log_every: 1}\n"
    )
    proc = cli.run(recipe, "--cpu", "2", "--run-dir", tmp_path / "run", timeout=150)
    assert proc.returncode == 1, (proc.stdout + proc.stderr)[-3000:]
    assert proc.stderr.count("RuntimeError: builder broke at batch 5") == 1, proc.stderr[-3000:]
    assert "training failed" in proc.stderr and "training failed" not in proc.stdout
    assert "[rank0]:" not in proc.stderr and "Traceback (most recent call last)" not in proc.stderr
    stderr_logs = list((tmp_path / "run" / "logs").glob("*/attempt_0/0/stderr.log"))
    assert "[rank0]: RuntimeError: builder broke at batch 5" in stderr_logs[0].read_text()  # the log keeps it
