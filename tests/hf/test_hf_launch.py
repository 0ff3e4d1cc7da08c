"""A zerolaunch.hf Trainer script started three ways on 2 CPU ranks: torchrun, `accelerate launch` (no
DeepSpeed plugin), and `zerolaunch train recipe.yaml` with `entrypoint:` naming the script.

The same script, data and seed under each launcher must train at world size 2 and log the same losses (the
launchers differ only in how the ranks and the group start). Also: accelerate launch with a DeepSpeed plugin is
refused with the fix named. Leaves out: CUDA/nccl, multi-node, the numbers themselves (the side-by-side tests).
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("accelerate")
pytest.importorskip("transformers", minversion="5.17")  # the Trainer hooks zerolaunch.hf replaces
pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parents[2]
SCRIPT = Path(__file__).with_name("_hf_launch_train.py")


def _port() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return str(s.getsockname()[1])


def _env(**extra) -> dict:
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(REPO), COLUMNS="200")
    env.pop("ZEROLAUNCH_RECIPE", None)
    env.update(extra)
    return env


def _launch(kind: str, cwd: Path, **env) -> subprocess.CompletedProcess:
    if kind == "torchrun":
        cmd = [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--nproc-per-node",
            "2",
            "--master-port",
            _port(),
            str(SCRIPT),
            "--from",
            kind,
        ]
    elif kind == "accelerate":
        cmd = [
            sys.executable,
            "-m",
            "accelerate.commands.launch",
            # accelerate's torchrun launcher (its --cpu one starts several processes only through mpirun); the
            # script's use_cpu=True keeps the ranks on the CPU, with gloo
            "--multi_gpu",
            "--num_processes",
            "2",
            "--num_machines",
            "1",
            "--mixed_precision",
            "no",
            "--dynamo_backend",
            "no",
            "--main_process_port",
            _port(),
            str(SCRIPT),
            "--from",
            kind,
        ]
    else:
        recipe = cwd / "recipe.yaml"
        recipe.write_text(
            json.dumps({"entrypoint": f"{SCRIPT} --from {kind}", "train": {"run_dir": str(cwd / "run")}})
        )
        cmd = [sys.executable, "-m", "zerolaunch", "train", str(recipe), "--cpu", "2"]
    return subprocess.run(cmd, cwd=cwd, env=_env(**env), capture_output=True, text=True, timeout=400)


@pytest.fixture(scope="module")
def launched(tmp_path_factory):
    out = {}
    for kind in ("torchrun", "accelerate", "zerolaunch"):
        cwd = tmp_path_factory.mktemp(kind)
        proc = _launch(kind, cwd)
        assert proc.returncode == 0, f"{kind}:\n{proc.stdout[-3000:]}\n{proc.stderr[-4000:]}"
        out[kind] = [json.loads((cwd / f"hf_{r}.json").read_text()) for r in (0, 1)]
    return out


@pytest.mark.parametrize("kind", ["torchrun", "accelerate", "zerolaunch"])
def test_trains_at_world_size_two(launched, kind):
    for seen in launched[kind]:
        assert seen["world"] == 2 and seen["argv"] == ["--from", kind]
        assert len(seen["losses"]) == 3


def test_same_losses_under_every_launcher(launched):
    assert launched["accelerate"][0]["losses"] == launched["torchrun"][0]["losses"]
    assert launched["zerolaunch"][0]["losses"] == launched["torchrun"][0]["losses"]


def test_accelerate_deepspeed_plugin_is_refused(tmp_path):
    proc = subprocess.run(
        [sys.executable, str(SCRIPT)],
        cwd=tmp_path,
        env=_env(ACCELERATE_USE_DEEPSPEED="true"),
        capture_output=True,
        text=True,
        timeout=200,
    )
    assert proc.returncode != 0
    assert "without --use_deepspeed" in proc.stderr and "TrainingArguments(deepspeed=...)" in proc.stderr
