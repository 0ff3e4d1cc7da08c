"""zerolaunch.initialize inside a user script started by plain torchrun (2 CPU ranks, gloo).

Covers: initialize() starting the process group from torchrun's env, training that lowers the loss, and a
collective save_checkpoint whose manifest says world size 2 and which loads back at world size 1. Leaves out:
`zerolaunch train` with `entrypoint:` (test_api_entrypoint.py) and CUDA/nccl.
"""

import json
import os
import re
import subprocess
from pathlib import Path

import pytest
import torch
from _helpers import torchrun_cmd

import zerolaunch

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "my_train.py"

pytestmark = pytest.mark.e2e


def _env() -> dict:
    env = dict(
        os.environ, OMP_NUM_THREADS="1", PYTHONPATH=f"{REPO}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"
    )
    env.pop("ZEROLAUNCH_RECIPE", None)
    return env


def test_example_under_torchrun_two_cpu_ranks(tmp_path):
    ckpt = tmp_path / "ckpt"
    cmd = torchrun_cmd(EXAMPLE, "--steps", "30", "--save", ckpt)
    proc = subprocess.run(cmd, cwd=tmp_path, env=_env(), capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    losses = [float(v) for v in re.findall(r"step \d+ loss ([0-9.]+)", proc.stdout)]
    assert len(losses) == 30  # rank 0 printed every step, and only rank 0 printed
    assert losses[-1] < losses[0] - 0.1
    step_dir = ckpt / "step_000030"
    manifest = json.loads((step_dir / "manifest.json").read_text())
    assert manifest["world_size"] == 2
    assert (ckpt / "latest").read_text().strip() == "step_000030"

    # the same checkpoint loads into a world of one (another world size), and its weights are trained:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Embedding(256, 64), torch.nn.Linear(64, 256))
    engine = zerolaunch.initialize(model)
    tokens = (torch.arange(8)[:, None] * 31 + torch.arange(33)) % 256

    def loss_now():
        with torch.no_grad():
            logits = engine(tokens[:, :-1])
            return torch.nn.functional.cross_entropy(logits.flatten(0, 1), tokens[:, 1:].flatten()).item()

    before = loss_now()
    engine.load_checkpoint(ckpt)
    assert engine.global_steps == 30
    assert loss_now() < before - 0.1
