"""`zerolaunch train --cpu 2` with a loss that turns NaN at step 3 on rank 1 (a model/data builder of this
test): the run stops after train.max_nonfinite_steps (3) bad steps in a row with exit code 3 and one message
naming the steps, the rank and the values; no checkpoint is written after step 2 (the last good one is kept).
"""

import json

import pytest

pytestmark = pytest.mark.e2e

BUILDERS = '''
import torch
from torch import nn


class Poisoned(nn.Module):
    """MSE of a linear layer; a batch with poison=1 multiplies the loss by NaN (so the grads are NaN)."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(8, 8)

    def forward(self, x, poison):
        loss = torch.nn.functional.mse_loss(self.lin(x), x.flip(-1))
        return loss * torch.where(poison > 0, torch.tensor(float("nan")), torch.tensor(1.0))


def model():
    torch.manual_seed(0)
    return Poisoned()


def data(rank, world_size, micro_batch_size, seed, bad_from_step, bad_rank):
    g = torch.Generator().manual_seed(seed + rank)
    step = 0
    while True:
        step += 1
        poison = float(rank == bad_rank and step >= bad_from_step)
        yield {"x": torch.randn(micro_batch_size, 8, generator=g), "poison": torch.tensor(poison)}
'''

RECIPE = """\
model:
  builder: builders.py:model
data:
  builder: builders.py:data
  args: {bad_from_step: 3, bad_rank: 1}
train:
  steps: 20
  micro_batch_size: 2
  lr: 1.0e-2
  lr_schedule: constant
  log_every: 1
checkpoint:
  every: 1
  keep: 0
deepspeed:
  zero_optimization: {stage: 2}
"""


@pytest.fixture
def poisoned_recipe(tmp_path):
    (tmp_path / "builders.py").write_text(BUILDERS)
    path = tmp_path / "poisoned.yaml"
    path.write_text(RECIPE)
    return path


def test_nan_loss_stops_the_run_with_exit_3_and_keeps_the_last_good_checkpoint(
    cli, poisoned_recipe, tmp_path
):
    run_dir = tmp_path / "run"
    proc = cli.run(poisoned_recipe, "--cpu", "2", "--run-dir", run_dir, "--timeout", "300", timeout=240)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 3, out[-4000:]
    assert "training stopped: 3 optimizer steps in a row had a non-finite loss or grad norm" in out, out[
        -4000:
    ]
    for step in (3, 4, 5):
        assert f"step {step}: rank 1 loss nan" in out, out[-4000:]
    assert "rank 0 loss" not in out  # only the rank that went bad is named
    assert "Traceback" not in out and "training failed" not in out  # one message, no crash panel
    assert "train.max_nonfinite_steps = 3" in out and "--resume auto" in out
    ckpts = sorted(p.name for p in (run_dir / "checkpoints").iterdir() if p.name.startswith("step_"))
    assert ckpts == ["step_000001", "step_000002"], ckpts
    steps = [m["step"] for m in cli.metrics(run_dir)]
    assert steps[:2] == [1, 2] and max(steps) <= 5, steps
    bad = [m for m in cli.metrics(run_dir) if m["step"] >= 3]
    assert bad and all(m["skipped"] for m in bad), bad
    # the kept checkpoint holds finite weights
    manifest = json.loads((run_dir / "checkpoints" / "step_000002" / "manifest.json").read_text())
    assert manifest["step"] == 2
