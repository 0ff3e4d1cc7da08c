"""The hostfile side of `--hostfile` (launch/hostfile.py): parsing, --include/--exclude held against
DeepSpeed 0.19.8's own parse_inclusion_exclusion (the reference, imported when installed), one worker
count per host, the variables forwarded and the remote command line. Running over ssh is left to
tests/e2e/test_cluster_hostfile.py."""

import re
import shlex
import sys

import pytest

from zerolaunch.launch.hostfile import (
    exported_env,
    filter_hosts,
    parse_hostfile,
    remote_command,
    workers_per_host,
)
from zerolaunch.launch.launcher import LaunchRequest
from zerolaunch.launch.ports import LaunchError

HOSTS = "# cluster\nworker-0 slots=4\n\n  worker-1 slots=4   # trailing words are ignored, as DeepSpeed\nw2 slots=2\n"


def _write(tmp_path, text):
    path = tmp_path / "hosts"
    path.write_text(text)
    return str(path)


def test_parse_hostfile(tmp_path):
    pool = parse_hostfile(_write(tmp_path, HOSTS))
    assert list(pool.items()) == [("worker-0", 4), ("worker-1", 4), ("w2", 2)]


@pytest.mark.parametrize(
    "text, words",
    [
        ("worker-0 slots=4\nworker-0 slots=2\n", "line 2: host 'worker-0' is listed twice"),
        ("worker-0\n", "line 1: 'worker-0' is not 'HOST slots=N'"),
        ("# nothing\n\n", "lists no host"),
        ("a slots=0\n", "slots=0"),
    ],
)
def test_bad_hostfile(tmp_path, text, words):
    with pytest.raises(LaunchError, match=re.escape(words)):
        parse_hostfile(_write(tmp_path, text))


def test_missing_hostfile(tmp_path):
    with pytest.raises(LaunchError, match="cannot read it"):
        parse_hostfile(str(tmp_path / "nope"))


POOL = {"worker-0": 4, "worker-1": 4, "w2": 2}
FILTERS = [
    ("", ""),
    ("worker-1", ""),
    ("worker-0@worker-1:0,2", ""),
    ("worker-1:3,1@w2", ""),
    ("", "worker-1"),
    ("", "worker-0:0@w2:1"),
    ("", "worker-0:1,1"),
]


@pytest.mark.parametrize("include, exclude", FILTERS)
def test_filters_match_deepspeed(include, exclude):
    runner = pytest.importorskip("deepspeed.launcher.runner")
    expected = runner.parse_inclusion_exclusion(dict(POOL), include, exclude)
    assert filter_hosts(POOL, include, exclude) == {h: list(s) for h, s in expected.items()}


def test_filters_by_hand():
    # written out from DeepSpeed's docstring, so the rules hold without DeepSpeed installed
    assert filter_hosts(POOL, "worker-0@worker-1:0,2") == {"worker-0": [0, 1, 2, 3], "worker-1": [0, 2]}
    assert filter_hosts(POOL, exclude="worker-1:0") == {
        "worker-0": [0, 1, 2, 3],
        "worker-1": [1, 2, 3],
        "w2": [0, 1],
    }
    assert list(filter_hosts(POOL, "w2@worker-0")) == ["worker-0", "w2"]  # hostfile order, not filter order


@pytest.mark.parametrize(
    "include, exclude, words",
    [
        ("worker-9", "", "host 'worker-9' is not in the hostfile"),
        ("w2:2", "", "host 'w2' has no slot 2"),
        ("w2", "w2", "cannot be used together"),
        ("", "worker-0@worker-1@w2", "leaves no host"),
        ("w2:x", "", "must be numbers"),
    ],
)
def test_bad_filters(include, exclude, words):
    with pytest.raises(LaunchError, match=re.escape(words)):
        filter_hosts(POOL, include, exclude)


def test_workers_per_host():
    same = {"a": [0, 1], "b": [2, 3]}
    assert workers_per_host(same, None, None) == 2
    assert workers_per_host(same, 2, None) == 2
    with pytest.raises(LaunchError, match="host 'a' has 2 slot.* but --gpus 4"):
        workers_per_host(same, 4, None)
    with pytest.raises(LaunchError, match="host 'b' has 1 slot.* a's 2"):
        workers_per_host({"a": [0, 1], "b": [0]}, None, None)


def test_exported_env():
    env = {"NCCL_IB_HCA": "mlx5", "PYTHONPATH": "/src", "HOME": "/root", "MINE": "x y", "OTHER": "o"}
    assert exported_env(["MINE", "SET=1"], env) == {
        "NCCL_IB_HCA": "mlx5",
        "PYTHONPATH": "/src",
        "MINE": "x y",
        "SET": "1",
    }
    with pytest.raises(LaunchError, match="--export ABSENT: ABSENT is not set here"):
        exported_env(["ABSENT"], env)
    with pytest.raises(LaunchError, match="not a variable name"):
        exported_env(["1BAD"], env)


def test_remote_command_round_trips_through_the_shell():
    req = LaunchRequest(recipe="my recipe.yaml", sets=["train.lr=1e-3"], run_dir="runs/x", timeout_seconds=60)
    command = remote_command(
        req,
        node_rank=1,
        nnodes=2,
        endpoint="worker-0:29400",
        run_id="abc",
        workers=2,
        device="cuda",
        visible_devices=[0, 2],
        env={"MINE": "x y"},
        cwd="/work dir",
    )
    words = shlex.split(command)
    assert words[:4] == ["cd", "/work dir", "&&", "exec"]
    assert words[4:7] == ["env", "CUDA_VISIBLE_DEVICES=0,2", "MINE=x y"]
    argv = words[7:]
    assert argv[:5] == [sys.executable, "-m", "zerolaunch", "train", "my recipe.yaml"]
    flags = " ".join(argv[5:])
    for part in ["--gpus 2", "--set train.lr=1e-3", "--run-dir runs/x", "--timeout 60", "--nnodes 2",
                 "--node-rank 1", "--rdzv-endpoint worker-0:29400", "--rdzv-backend static", "--run-id abc",
                 "--no-slurm", "--stop-on-stdin-eof"]:  # fmt: skip
        assert part in flags


def test_restart_reaches_every_host():
    req = LaunchRequest(recipe="r.yaml", run_dir="runs/x", restart=True)
    words = shlex.split(
        remote_command(
            req,
            node_rank=0,
            nnodes=2,
            endpoint="h:1",
            run_id="abc",
            workers=1,
            device="cpu",
            visible_devices=None,
            env={},
            cwd="/w",
        )
    )
    assert "--restart" in words and "--resume" not in words
