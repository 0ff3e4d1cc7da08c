"""Two "nodes" on one machine: two `zerolaunch train` launchers with 1 CPU worker each, --nnodes 2, c10d
rendezvous over loopback at a free port (the README's two-node command, shrunk). Both must finish; the run
dir (shared, as a real multi-node run's must be for checkpoints) gets rank 0's metrics for world size 2.
"""

import json
import socket
import subprocess

import pytest

pytestmark = pytest.mark.e2e


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_two_nodes_over_loopback_c10d(cli, tiny_recipe, tmp_path):
    recipe, run_dir, port = tiny_recipe(steps=5), tmp_path / "run", _free_port()
    common = ["--cpu", "1", "--nnodes", "2", "--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{port}"]
    common += ["--run-id", "two-node-test", "--run-dir", str(run_dir)]
    nodes = [
        subprocess.Popen(
            cli.cmd(recipe, *common, "--node-rank", str(node)),
            env=cli.env(),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for node in (0, 1)
    ]
    try:
        outs = [node.communicate(timeout=180)[0] for node in nodes]
    finally:
        for node in nodes:
            if node.poll() is None:
                node.kill()
                node.wait(timeout=10)
    for node, out in zip(nodes, outs, strict=True):
        assert node.returncode == 0, out[-3000:]
    assert "launching 2 node(s) x 1 cpu worker(s)" in outs[0]
    assert [m["step"] for m in cli.metrics(run_dir)] == [1, 2, 3, 4, 5]
    assert json.loads((run_dir / "summary.json").read_text())["world_size"] == 2
