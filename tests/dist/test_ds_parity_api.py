"""zerolaunch.initialize against deepspeed.initialize: the same config, script and data give the same weights.

Runs tests/dist/_ds_parity_run.py under both engines (2 CPU gloo ranks each, fp32, 5 AdamW steps with weight
decay and clipping, ZeRO stages 1-3) and compares every weight to 1e-5 relative. Cases: model_parameters =
model.parameters() (DeepSpeed decays every param, 1-D ones too), two group dicts with their own weight decay
and lr, and zerolaunch with no model_parameters (must equal DeepSpeed given model.parameters()). DeepSpeed's
weights are made in this run, not recorded. Not covered: bf16/fp16, offload, schedulers (other tests).
"""

from __future__ import annotations

from pathlib import Path

import _spawn
import pytest
import torch

pytest.importorskip("deepspeed")

SCRIPT = Path(__file__).with_name("_ds_parity_run.py")


@pytest.fixture(scope="module")
def weights(tmp_path_factory):
    return _spawn.run_engines(SCRIPT, ("deepspeed", "zerolaunch"), tmp_path_factory.mktemp("ds_parity"))


@pytest.mark.parametrize("stage", [1, 2, 3])
@pytest.mark.parametrize("mode", ["params", "groups", "none"])
def test_same_weights_as_deepspeed(weights, stage, mode):
    ours = weights["zerolaunch"][f"stage{stage}_{mode}"]
    ref = weights["deepspeed"][f"stage{stage}_{'params' if mode == 'none' else mode}"]
    assert sorted(ours) == sorted(ref)
    for name, expected in ref.items():
        torch.testing.assert_close(ours[name], expected, rtol=1e-5, atol=1e-5 * expected.abs().max().item())


def test_cases_are_distinguishable(weights):
    """The groups case must move the weights elsewhere than one decayed group (else the test proves little),
    and 5 steps must move them at all."""
    ds = weights["deepspeed"]
    for name, w in ds["stage1_params"].items():
        if w.dim() < 2:  # the 1-D params: decayed in one case, not (and at 2x lr) in the other
            assert (w - ds["stage1_groups"][name]).abs().max() > 1e-3
