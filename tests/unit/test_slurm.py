"""SLURM support (launch/slurm.py): hostlist expansion against what `scontrol show hostnames` prints (the
expected lists are written out by hand from SLURM's documented behaviour), and which launch values a SLURM
job fills in, with explicit flags winning. Starting the job is left to tests/e2e/test_cluster_slurm.py."""

import re

import pytest

from zerolaunch.launch.launcher import LaunchRequest
from zerolaunch.launch.ports import LaunchError
from zerolaunch.launch.slurm import apply_slurm, expand_nodelist, render_origins


@pytest.mark.parametrize(
    "nodelist, hosts",
    [
        ("node[01-03,07],gpu-a", ["node01", "node02", "node03", "node07", "gpu-a"]),
        ("a[1-2]-ib,b", ["a1-ib", "a2-ib", "b"]),
        ("node[008-011]", ["node008", "node009", "node010", "node011"]),
        ("n[8-10]", ["n8", "n9", "n10"]),
        ("single", ["single"]),
        ("127.0.0.1,localhost", ["127.0.0.1", "localhost"]),
        ("rack[1-2]-n[1-2]", ["rack1-n1", "rack1-n2", "rack2-n1", "rack2-n2"]),
        ("x[3],y[1,05]", ["x3", "y1", "y05"]),
    ],
)
def test_expand_nodelist(nodelist, hosts):
    assert expand_nodelist(nodelist) == hosts


@pytest.mark.parametrize(
    "nodelist, words",
    [
        ("node[1-3", "without its ']'"),
        ("node1-3]", "without '['"),
        ("n[a-b]", "not a number"),
        ("n[5-2]", "backwards"),
        ("a,,b", "empty entry"),
    ],
)
def test_bad_nodelist_is_a_user_error(nodelist, words):
    with pytest.raises(LaunchError, match=re.escape(words)):
        expand_nodelist(nodelist)


JOB = {
    "SLURM_JOB_ID": "4242",
    "SLURM_NNODES": "2",
    "SLURM_NODEID": "1",
    "SLURM_JOB_NODELIST": "gpu[07-08]",
    "SLURM_GPUS_ON_NODE": "8",
}


def _apply(env, req=None, force=None, nnodes_given=False, backend_given=False):
    return apply_slurm(
        req or LaunchRequest(recipe="r.yaml"),
        force=force,
        nnodes_given=nnodes_given,
        backend_given=backend_given,
        env=env,
    )


def test_job_fills_every_value_and_says_where_from():
    req, origins = _apply(JOB)
    assert (req.nnodes, req.node_rank, req.gpus) == (2, 1, 8)
    assert (req.rdzv_endpoint, req.rdzv_backend, req.run_id) == ("gpu07:29400", "static", "4242")
    sources = {name: where for name, _, where in origins}
    assert sources["nnodes"] == "SLURM_NNODES" and sources["node rank"] == "SLURM_NODEID"
    assert sources["workers per node"] == "SLURM_GPUS_ON_NODE" and sources["run id"] == "SLURM_JOB_ID"
    assert "first host of SLURM_JOB_NODELIST" in sources["rendezvous"]
    render_origins(origins)  # builds a table from the rows


def test_explicit_flags_win():
    given = LaunchRequest(
        recipe="r.yaml", cpu=1, nnodes=3, node_rank=0, rdzv_endpoint="h:1", rdzv_backend="c10d", run_id="me"
    )
    req, origins = _apply(JOB, given, nnodes_given=True, backend_given=True)
    assert req == given
    assert {where for _, _, where in origins} == {
        "--nnodes",
        "--node-rank",
        "--cpu",
        "--rdzv-endpoint",
        "--rdzv-backend",
        "--run-id",
    }


@pytest.mark.parametrize(
    "extra, gpus, source",
    [
        ({"SLURM_GPUS_PER_NODE": "h200:4"}, 4, "SLURM_GPUS_PER_NODE"),
        ({"SLURM_GPUS_PER_NODE": "2"}, 2, "SLURM_GPUS_PER_NODE"),
        ({"CUDA_VISIBLE_DEVICES": "0,1,2"}, 3, "CUDA_VISIBLE_DEVICES"),
        ({}, None, "default (the allocation names none)"),
    ],
)
def test_gpu_count_sources(extra, gpus, source):
    env = {k: v for k, v in JOB.items() if k != "SLURM_GPUS_ON_NODE"} | extra
    req, origins = _apply(env)
    assert req.gpus == gpus
    assert dict((n, w) for n, _, w in origins)["workers per node"] == source


def test_master_port_and_no_slurm():
    req, _ = _apply(JOB | {"MASTER_PORT": "31000"})
    assert req.rdzv_endpoint == "gpu07:31000"
    plain = LaunchRequest(recipe="r.yaml")
    assert _apply(JOB, plain, force=False) == (plain, None)
    assert _apply({}, plain) == (plain, None)


@pytest.mark.parametrize(
    "env, force, words",
    [
        ({}, True, "SLURM_JOB_ID is not set"),
        ({k: v for k, v in JOB.items() if k != "SLURM_NNODES"}, None, "SLURM_NNODES"),
        ({k: v for k, v in JOB.items() if k != "SLURM_JOB_NODELIST"}, None, "--rdzv-endpoint"),
        (JOB | {"SLURM_STEP_NUM_TASKS": "16"}, None, "ntasks-per-node=1"),
        (JOB | {"MASTER_PORT": "http"}, None, "MASTER_PORT"),
    ],
)
def test_slurm_errors(env, force, words):
    with pytest.raises(LaunchError, match=re.escape(words)):
        _apply(env, force=force)
