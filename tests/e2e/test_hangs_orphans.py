"""No silent hangs and no orphans, whichever way a training process was started.

Covers: an `entrypoint:` script's hung rank ends the run after `zerolaunch train --timeout` (not 1800 s),
named in the panel, whether initialize() or the script itself started the group; a rank that exits 0 early is named as the cause, not the peer that lost it; a
rendezvous endpoint whose port another program holds fails in seconds naming it; `zerolaunch.initialize()`
under plain torchrun honours ZEROLAUNCH_TIMEOUT, the rank that timed out names the hung one, and its ranks
die within 10 s of a `kill -9` of torchrun.
Each run is 2 CPU gloo ranks of a tiny script. Leaves out: the built-in loop's hang and kill cases
(test_train_failures.py, test_reliability_launcher.py), the HF Trainer's own hang (its ddp_timeout:
tests/unit/test_script_timeout.py; its ranks do die with `accelerate launch`, here), CUDA/nccl.
"""

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from _helpers import free_port, torchrun_cmd

pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parents[2]

HANGS = """\
import sys, time
import torch
import torch.distributed as dist
import zerolaunch

engine = zerolaunch.initialize(torch.nn.Linear(7, 3))
x = torch.randn(4, 7)
for step in range(50):
    if dist.get_rank() == 1 and step == 2:
        print("rank 1 hangs", flush=True)
        time.sleep(3600)
    loss = (engine(x) ** 2).mean()
    engine.backward(loss)
    engine.step()
"""
LEAVES = HANGS.replace('print("rank 1 hangs", flush=True)\n        time.sleep(3600)', "sys.exit(0)")

FOREVER = """\
import os, sys, time
import torch
import torch.distributed as dist
import zerolaunch

engine = zerolaunch.initialize(torch.nn.Linear(7, 3))
open(os.path.join(sys.argv[1], f"pid_{dist.get_rank()}"), "w").write(str(os.getpid()))
x = torch.randn(4, 7)
while True:
    loss = (engine(x) ** 2).mean()
    engine.backward(loss)
    engine.step()
    time.sleep(0.1)
"""


def _entrypoint_recipe(tmp_path: Path, script: str) -> Path:
    (tmp_path / "script.py").write_text(script)
    path = tmp_path / "r.json"
    path.write_text(json.dumps({"entrypoint": "script.py", "train": {"run_dir": str(tmp_path / "run")}}))
    return path


PLAIN_HANGS = """\
import time
import torch
import torch.distributed as dist

dist.init_process_group("gloo")  # no timeout: torch's default, which --timeout must reach
if dist.get_rank() == 1:
    time.sleep(3600)
dist.all_reduce(torch.ones(3))
"""


@pytest.mark.parametrize("script", ["initialize", "plain"])
def test_an_entrypoint_rank_that_hangs_ends_the_run_after_timeout_named(tmp_path, cli, script):
    started = time.monotonic()
    source = HANGS if script == "initialize" else PLAIN_HANGS
    recipe = _entrypoint_recipe(tmp_path, source)
    proc = cli.run(recipe, "--cpu", "2", "--timeout", "5", cwd=tmp_path, timeout=240)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 1, out[-3000:]
    assert "timed out after --timeout 5 s: rank(s) 1 did not fail on their own: probably hung" in out
    assert time.monotonic() - started < 200  # the script's group once waited 1800 s


def test_an_entrypoint_rank_that_exits_0_early_is_named_as_the_cause(tmp_path, cli):
    assert LEAVES != HANGS
    proc = cli.run(_entrypoint_recipe(tmp_path, LEAVES), "--cpu", "2", cwd=tmp_path, timeout=240)
    out = " ".join((proc.stdout + proc.stderr).replace("│", " ").split())
    assert proc.returncode == 1, out[-3000:]
    assert "rank 1 failed: exit code 0 before the other ranks finished" in out
    assert "rank 1 ended (its script returned or exited 0) while the other ranks were still running" in out
    assert "rank 0 failed" not in out
    assert "attempt_0/1/stderr.log" in out


def test_a_held_rendezvous_port_fails_in_seconds_naming_it(tmp_path, cli, tiny_recipe):
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen(4)
        port = holder.getsockname()[1]
        started = time.monotonic()
        proc = cli.run(
            tiny_recipe(steps=2),
            "--cpu",
            "2",
            "--run-dir",
            tmp_path / "run",
            "--rdzv-endpoint",
            f"127.0.0.1:{port}",
            timeout=120,
        )
        elapsed = time.monotonic() - started
    out = " ".join((proc.stdout + proc.stderr).split())
    assert proc.returncode == 2, out[-3000:]
    assert f"rendezvous endpoint 127.0.0.1:{port} is held by another program" in out
    assert "--rdzv-endpoint 127.0.0.1:OTHER_PORT" in out and "Traceback" not in out
    assert "launching" not in out and not (tmp_path / "run").exists()
    assert elapsed < 60


def _env(**extra: str) -> dict:
    env = dict(
        os.environ, OMP_NUM_THREADS="1", PYTHONPATH=f"{REPO}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"
    )
    for key in ("ZEROLAUNCH_RECIPE", "ZEROLAUNCH_TIMEOUT", "ZEROLAUNCH_LAUNCHER_PID"):
        env.pop(key, None)
    env.update(extra)
    return env


def test_initialize_under_torchrun_honours_zerolaunch_timeout(tmp_path):
    (tmp_path / "hangs.py").write_text(HANGS)
    started = time.monotonic()
    proc = subprocess.run(
        torchrun_cmd(tmp_path / "hangs.py"),
        cwd=tmp_path,
        env=_env(ZEROLAUNCH_TIMEOUT="5"),
        capture_output=True,
        text=True,
        timeout=240,
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0, out[-3000:]
    assert "Timed out waiting 5000ms" in out, out[-3000:]
    assert (
        "zerolaunch: rank 0: a collective timed out; rank(s) 1 never timed out with it: probably hung" in out
    )
    assert time.monotonic() - started < 200


def test_kill_9_of_torchrun_takes_its_initialize_ranks_with_it(tmp_path, cli):
    (tmp_path / "forever.py").write_text(FOREVER)
    _kill_launcher_and_count_survivors(torchrun_cmd(tmp_path / "forever.py", str(tmp_path)), tmp_path, cli)


HF_ARGS_THEN_WAIT = """\
import os, sys, time
from zerolaunch.hf import TrainingArguments

TrainingArguments(output_dir=sys.argv[1], use_cpu=True, report_to=[])
open(os.path.join(sys.argv[1], f"pid_{os.environ['RANK']}"), "w").write(str(os.getpid()))
time.sleep(300)
"""


def test_kill_9_of_accelerate_launch_takes_its_hf_ranks_with_it(tmp_path, cli):
    pytest.importorskip("accelerate")
    pytest.importorskip("transformers")
    (tmp_path / "hf_wait.py").write_text(HF_ARGS_THEN_WAIT)
    accelerate = [
        sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", "2",
        "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no",
        "--main_process_port", str(free_port()), str(tmp_path / "hf_wait.py"), str(tmp_path),
    ]  # fmt: skip
    _kill_launcher_and_count_survivors(accelerate, tmp_path, cli)


def _kill_launcher_and_count_survivors(cmd: list[str], tmp_path: Path, cli) -> None:
    """Start `cmd` (2 ranks that write pid_<rank> into tmp_path), SIGKILL it, assert no rank outlives it by 10 s."""
    log = open(tmp_path / "launcher.log", "w")
    proc = subprocess.Popen(cmd, cwd=tmp_path, env=_env(), stdout=log, stderr=log)
    pids: list[int] = []
    try:
        deadline = time.monotonic() + 150
        while len(pids) < 2:
            assert proc.poll() is None, (tmp_path / "launcher.log").read_text()[-3000:]
            assert time.monotonic() < deadline, "the ranks never started"
            time.sleep(0.2)
            pids = [int(p.read_text()) for p in tmp_path.glob("pid_*") if p.read_text()]
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)
        survivors = cli.survivors(pids, within=10)
        assert not survivors, f"ranks outlived their launcher: {survivors}"
    finally:
        log.close()
        if proc.poll() is None:
            proc.kill()
        for pid in pids:
            if cli.alive(pid):
                os.kill(pid, signal.SIGKILL)


def test_an_early_exit_does_not_hide_a_rank_that_raised_on_its_own():
    from zerolaunch.launch import failures

    raised = failures.FailureReport(0, "exit code 1", "ValueError: bad batch", [], None)
    assert failures.early_exit(raised, [1], lambda r: None) is raised
    lost = failures.FailureReport(0, "exit code 1", "RuntimeError: Connection closed by peer [x]:1", [], None)
    assert failures.early_exit(lost, [], lambda r: None) is lost  # nobody left early: a real crash elsewhere
    named = failures.early_exit(lost, [1], lambda r: f"/logs/{r}/stderr.log")
    assert (named.rank, named.log_path) == (1, "/logs/1/stderr.log")
