"""`zerolaunch train RECIPE --hostfile hosts`: two loopback host entries (127.0.0.1 and localhost) started
through a fake `ssh` on PATH that logs what it was asked and runs the command locally in a clean
environment (as a real ssh login would: only what the launcher forwards arrives). Covers a full 2-host run,
a failing host stopping the other, and the exit-2 errors (unreachable host, slots vs --cpu, no ssh)."""

import contextlib
import json
import os
import signal
import stat
import time

import pytest
from _helpers import free_port

pytestmark = pytest.mark.e2e

FAKE_SSH = """#!/usr/bin/env bash
# fake ssh: skip options, log "HOST COMMAND", then run COMMAND here in a clean environment
while [ $# -gt 0 ]; do case "$1" in -o|-p|-i|-l) shift 2;; -*) shift;; *) break;; esac; done
host="$1"; shift
echo "$host $*" >> "$FAKE_SSH_LOG"
case "$host" in unreachable*) echo "ssh: Could not resolve hostname $host" >&2; exit 255;; esac
if [ "$*" != "true" ] && [ "$host" = "$FAKE_SSH_FAIL_HOST" ]; then echo "boom on $host"; exit 3; fi
exec env -i PATH="$PATH" HOME="$HOME" bash -c "$*"
"""


@pytest.fixture
def fake_ssh(tmp_path):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    ssh = bin_dir / "ssh"
    ssh.write_text(FAKE_SSH)
    ssh.chmod(ssh.stat().st_mode | stat.S_IEXEC)
    log = tmp_path / "ssh.log"
    return dict(PATH=f"{bin_dir}{os.pathsep}{os.environ['PATH']}", FAKE_SSH_LOG=str(log)), log


def _hostfile(tmp_path, text):
    path = tmp_path / "hosts"
    path.write_text(text)
    return path


def _run_on_hosts(cli, recipe, hosts, run_dir, *args, **env):
    """The CLI on the hostfile's hosts, one CPU worker each, on a free rendezvous port (5 minutes at most)."""
    return cli.run(
        recipe,
        "--cpu",
        "1",
        "--hostfile",
        str(hosts),
        *args,
        "--run-dir",
        str(run_dir),
        timeout=300,
        MASTER_PORT=str(free_port()),
        **env,
    )


def test_two_hosts_over_fake_ssh(cli, tiny_recipe, tmp_path, fake_ssh):
    env, log = fake_ssh
    hosts = _hostfile(tmp_path, "# two loopback nodes\n127.0.0.1 slots=1\n\nlocalhost slots=1  # second\n")
    run_dir = tmp_path / "run"
    out = _run_on_hosts(
        cli,
        tiny_recipe(steps=4),
        hosts,
        run_dir,
        "--export",
        "CLUSTER_MARK",
        CLUSTER_MARK="hello world",
        NCCL_DEBUG="WARN",
        **env,
    )
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    lines = out.stdout.splitlines()
    assert any(line.startswith("[127.0.0.1] ") for line in lines), out.stdout[-3000:]
    assert any(line.startswith("[localhost] ") for line in lines), out.stdout[-3000:]
    assert [m["step"] for m in cli.metrics(run_dir)] == [1, 2, 3, 4]
    assert json.loads((run_dir / "summary.json").read_text())["world_size"] == 2
    # hosts start at once: the log's order is a race, the node ranks follow the hostfile
    commands = dict(line.split(" ", 1) for line in log.read_text().splitlines() if not line.endswith(" true"))
    assert sorted(commands) == ["127.0.0.1", "localhost"]
    for rank, host in enumerate(["127.0.0.1", "localhost"]):
        command = commands[host]
        assert f"--node-rank {rank}" in command and "--nnodes 2" in command
        assert "CLUSTER_MARK='hello world'" in command and "NCCL_DEBUG=WARN" in command
        assert "PYTHONPATH=" in command


def test_a_failing_host_stops_the_others(cli, tiny_recipe, tmp_path, fake_ssh):
    env, _ = fake_ssh
    hosts = _hostfile(tmp_path, "127.0.0.1 slots=1\nlocalhost slots=1\n")
    started = time.monotonic()
    # 127.0.0.1 waits at the rendezvous for a node that never comes; it must be stopped, not left waiting
    out = _run_on_hosts(
        cli, tiny_recipe(steps=4), hosts, tmp_path / "run", FAKE_SSH_FAIL_HOST="localhost", **env
    )
    assert out.returncode == 3, out.stdout[-3000:] + out.stderr[-3000:]
    assert "[localhost] boom on localhost" in out.stdout
    assert "host localhost failed (exit code 3); stopped every other host" in out.stdout
    assert time.monotonic() - started < 200


@pytest.mark.parametrize(
    "hostfile, args, words",
    [
        ("127.0.0.1 slots=1\nunreachable-b slots=1\n", [], "cannot reach host(s) unreachable-b over ssh"),
        ("127.0.0.1 slots=1\nlocalhost slots=2\n", [], "host 'localhost' has 2 slot(s) in use but --cpu 1"),
        ("127.0.0.1 slots=1\nlocalhost slots=1\n", ["--include", "nohost"], "host 'nohost' is not in"),
        ("127.0.0.1 slot=1\n", [], "line 1: '127.0.0.1 slot=1' is not 'HOST slots=N'"),
    ],
)
def test_hostfile_errors_exit_2_naming_the_host(cli, tiny_recipe, tmp_path, fake_ssh, hostfile, args, words):
    env, _ = fake_ssh
    hosts = _hostfile(tmp_path, hostfile)
    out = cli.run(tiny_recipe(steps=2), "--cpu", "1", "--hostfile", str(hosts), *args, **env)
    assert out.returncode == 2, out.stdout[-2000:] + out.stderr[-2000:]
    assert words in " ".join(out.stderr.split()), out.stderr
    assert "Traceback" not in out.stderr


def test_no_ssh_client_is_exit_2(cli, tiny_recipe, tmp_path):
    hosts = _hostfile(tmp_path, "127.0.0.1 slots=1\n")
    (tmp_path / "empty").mkdir()
    out = cli.run(tiny_recipe(steps=2), "--cpu", "1", "--hostfile", str(hosts), PATH=str(tmp_path / "empty"))
    assert out.returncode == 2 and "needs the `ssh` client" in " ".join(out.stderr.split()), out.stderr


@contextlib.contextmanager
def _training_in_background(cli, tmp_path, run_dir, args, env, **popen):
    """The CLI started with its output in tmp_path/out.log (a full pipe would stall the launcher; a file never
    does), yielded once run_dir/metrics.jsonl exists or 180 s have passed; killed on the way out if alive."""
    with open(tmp_path / "out.log", "w") as log_file:
        proc = cli.popen(*args, stdout=log_file, env=env, **popen)
        try:
            deadline = time.monotonic() + 180
            while not (run_dir / "metrics.jsonl").exists() and time.monotonic() < deadline:
                assert proc.poll() is None, (tmp_path / "out.log").read_text()[-3000:]
                time.sleep(0.5)
            yield proc
        finally:
            cli.stop(proc)


def _ignore_sigint():
    signal.signal(signal.SIGINT, signal.SIG_IGN)


@pytest.mark.parametrize(
    "signum, start, code, line",
    [
        # started with SIGINT ignored, as a background job of a non-interactive shell is (CI, nohup): Python
        # then raises no KeyboardInterrupt, so the launcher must handle SIGINT itself (it once did not, and
        # this test hung whenever the suite ran in the background)
        (signal.SIGINT, _ignore_sigint, 130, "interrupted: stopped every host"),
        # a scheduler's or `kill`'s SIGTERM stops the hosts too, instead of ending the launcher alone
        (signal.SIGTERM, None, 143, "interrupted by SIGTERM: stopped every host"),
    ],
    ids=["sigint_ignored_at_start", "sigterm"],
)
def test_ctrl_c_stops_every_host(cli, tiny_recipe, tmp_path, fake_ssh, signum, start, code, line):
    env, _ = fake_ssh
    hosts = _hostfile(tmp_path, "127.0.0.1 slots=1\nlocalhost slots=1\n")
    run_dir = tmp_path / "run"
    args = (tiny_recipe(steps=100000), "--cpu", "1", "--hostfile", hosts, "--run-dir", run_dir)
    with _training_in_background(
        cli, tmp_path, run_dir, args, cli.env(MASTER_PORT=str(free_port()), **env), preexec_fn=start
    ) as proc:
        assert (run_dir / "metrics.jsonl").exists(), "training never started"
        tree = cli.descendants(proc.pid)
        assert len(tree) >= 4  # two host launchers and their workers
        proc.send_signal(signum)
        proc.wait(timeout=120)
    out = (tmp_path / "out.log").read_text()
    assert proc.returncode == code, out[-3000:]
    assert line in out, out[-3000:]
    assert not cli.survivors(tree, within=60, poll=0.5), "a host's launcher or worker outlived the job"


def test_a_host_launcher_stops_when_its_ssh_channel_closes(cli, tiny_recipe, tmp_path):
    # a real ssh killed here closes the remote launcher's stdin; --stop-on-stdin-eof must stop it and its workers
    import subprocess

    run_dir = tmp_path / "run"
    args = (tiny_recipe(steps=100000), "--cpu", "1", "--stop-on-stdin-eof", "--run-dir", run_dir)
    with _training_in_background(cli, tmp_path, run_dir, args, cli.env(), stdin=subprocess.PIPE) as proc:
        tree = cli.descendants(proc.pid)
        assert tree, "no worker started"
        proc.stdin.close()
        proc.wait(timeout=120)
    out = (tmp_path / "out.log").read_text()
    assert proc.returncode != 0 and "interrupted by SIGTERM" in out, out[-3000:]
    assert not cli.survivors(tree, within=60, poll=0.5)
