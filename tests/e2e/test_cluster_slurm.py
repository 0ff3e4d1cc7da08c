"""A SLURM job of two "nodes" on one machine: two `zerolaunch train RECIPE --cpu 1` launchers with no
--nnodes/--node-rank/--rdzv-endpoint/--run-id, each given the SLURM_* variables srun would set on its node
(nodelist `127.0.0.1,localhost`, so node 0's address is loopback; MASTER_PORT a free port). Both must finish,
the run must be world size 2, and the launch table must say the values came from SLURM."""

import json
import subprocess

import pytest
from _helpers import free_port

pytestmark = pytest.mark.e2e


def test_two_node_slurm_job_needs_no_flags(cli, tiny_recipe, tmp_path):
    recipe, run_dir, port = tiny_recipe(steps=4), tmp_path / "run", free_port()
    job = dict(
        SLURM_JOB_ID="777", SLURM_NNODES="2", SLURM_JOB_NODELIST="127.0.0.1,localhost", MASTER_PORT=str(port)
    )
    nodes = [
        subprocess.Popen(
            cli.cmd(recipe, "--cpu", "1", "--run-dir", str(run_dir)),
            env=cli.env(**job, SLURM_NODEID=str(node)),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for node in (0, 1)
    ]
    try:
        outs = [node.communicate(timeout=240)[0] for node in nodes]
    finally:
        for node in nodes:
            if node.poll() is None:
                node.kill()
                node.wait(timeout=10)
    for node, out in zip(nodes, outs, strict=True):
        assert node.returncode == 0, out[-3000:]
    for out in outs:
        assert "SLURM_NNODES" in out and "SLURM_NODEID" in out and "SLURM_JOB_ID" in out, out[-3000:]
        assert f"127.0.0.1:{port}" in out
        assert "launching 2 node(s) x 1 cpu worker(s)" in out
    assert [m["step"] for m in cli.metrics(run_dir)] == [1, 2, 3, 4]
    assert json.loads((run_dir / "summary.json").read_text())["world_size"] == 2


def test_no_slurm_ignores_the_job(cli, tiny_recipe, tmp_path):
    # --no-slurm: a single-node run even though SLURM_* says two nodes (it would wait for node 1 otherwise)
    env = dict(
        SLURM_JOB_ID="778", SLURM_NNODES="2", SLURM_NODEID="0", SLURM_JOB_NODELIST="127.0.0.1,localhost"
    )
    out = cli.run(tiny_recipe(steps=2), "--cpu", "1", "--no-slurm", "--run-dir", str(tmp_path / "r"), **env)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    assert "SLURM_NNODES" not in out.stdout and "node(s)" not in out.stdout


def test_bad_slurm_value_is_exit_2(cli, tiny_recipe, tmp_path):
    env = dict(SLURM_JOB_ID="779", SLURM_NNODES="2", SLURM_NODEID="0", SLURM_JOB_NODELIST="node[1-")
    out = cli.run(tiny_recipe(steps=2), "--cpu", "1", "--run-dir", str(tmp_path / "r"), **env)
    assert out.returncode == 2
    assert "nodelist" in out.stderr and "Traceback" not in out.stderr
