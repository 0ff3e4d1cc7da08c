"""Pure bf16 (`bf16_master_weights_and_grads` + `bf16_optimizer_states`), and bf16 over an fp32 master, side by
side with DeepSpeed 0.19.8.

Runs tests/dist/_ds_bf16_master_run.py under both engines (2 CPU gloo ranks each, 5 AdamW steps with weight
decay, ZeRO stages 1-3, the model in bf16). Without clipping the weights are DeepSpeed's bit for bit. With
clipping both multiply the bf16 grads by the clip factor in fp32 and round ([Note: bf16 master]), but the
factor comes from a norm summed in another order (DeepSpeed: per-param norms, squared and summed; zerolaunch:
sums of squares of its flat shards), so its last fp32 bits may differ and, rarely, a rounded grad with them,
which Adam's moments carry on: compared to two bf16 ulps (2**-6 relative) or 1/32 of the lr (a step moves a
weight by about the lr), on 3% of the elements at most (11 of 598 after 5 steps, 2026-12-05). DeepSpeed's weights are made in this run,
not recorded.

bf16 compute over an fp32 master (`bf16: {enabled: true}` alone, the model built in fp32, no clipping, grads
reduced in bf16 as DeepSpeed does), stages 1-3: the fp32 master at init is DeepSpeed's bit for bit (both made
from the model rounded through bf16: zero/sharding.py master_start), and after 5 steps within two fp32 ulps
(2**-22 relative) on 1% of the elements at most: both run torch's fused AdamW, DeepSpeed over each param and
zerolaunch over flat shards, and on the CPU that kernel's last bit depends on where an element sits in its
tensor (the same values stepped alone or inside a longer tensor: 85 of 1000 elements an ulp apart after 3
steps), so a few elements move by an ulp (1 of 780 at stages 1-2, none at stage 3, 2026-12-06).
"""

from __future__ import annotations

from pathlib import Path

import _spawn
import pytest
import torch

pytest.importorskip("deepspeed")

SCRIPT = Path(__file__).with_name("_ds_bf16_master_run.py")
CASES = [(stage, clip) for stage in (1, 2, 3) for clip in (0.0, 0.05)]
LR = 0.01  # _ds_parity_run.config's


@pytest.fixture(scope="module")
def weights(tmp_path_factory):
    return _spawn.run_engines(SCRIPT, ("deepspeed", "zerolaunch"), tmp_path_factory.mktemp("ds_bf16_master"))


@pytest.mark.dist
@pytest.mark.parametrize("stage", [1, 2, 3])
def test_without_clipping_the_weights_are_deepspeeds(weights, stage):
    ours, ref = weights["zerolaunch"][(stage, 0.0)], weights["deepspeed"][(stage, 0.0)]
    assert sorted(ours) == sorted(ref)
    for name, expected in ref.items():
        assert expected.dtype == ours[name].dtype == torch.bfloat16
        torch.testing.assert_close(ours[name], expected, rtol=0, atol=0, msg=name)


@pytest.mark.dist
@pytest.mark.parametrize("stage", [1, 2, 3])
def test_with_clipping_within_bf16_rounding_of_deepspeed(weights, stage):
    ours, ref = weights["zerolaunch"][(stage, 0.05)], weights["deepspeed"][(stage, 0.05)]
    unclipped = weights["deepspeed"][(stage, 0.0)]
    differ = total = 0
    for name, expected in ref.items():
        torch.testing.assert_close(ours[name].float(), expected.float(), rtol=2**-6, atol=LR / 32)
        differ += int((ours[name] != expected).sum())
        total += expected.numel()
    assert differ <= 0.03 * total, f"{differ} of {total} elements differ"
    # clipping changed DeepSpeed's weights by more than that tolerance: the comparison can see a wrong clip
    assert any(
        not torch.allclose(unclipped[n].float(), e.float(), rtol=2**-6, atol=LR / 32) for n, e in ref.items()
    )


@pytest.mark.dist
@pytest.mark.parametrize("stage", [1, 2, 3])
def test_an_fp32_master_under_bf16_starts_and_trains_as_deepspeeds(weights, stage):
    ours, ref = weights["zerolaunch"][("fp32-master", stage)], weights["deepspeed"][("fp32-master", stage)]
    assert sorted(ours["init"]) == sorted(ref["init"])
    for name, expected in ref["init"].items():
        assert expected.dtype == ours["init"][name].dtype == torch.float32
        torch.testing.assert_close(ours["init"][name], expected, rtol=0, atol=0, msg=name)
    differ = total = 0
    for name, expected in ref["trained"].items():
        torch.testing.assert_close(ours["trained"][name], expected, rtol=2**-22, atol=0, msg=name)
        differ += int((ours["trained"][name] != expected).sum())
        total += expected.numel()
    assert differ <= 0.01 * total, f"{differ} of {total} elements differ"
    # the steps moved the master by far more than that tolerance: the comparison can see a wrong step
    assert any(not torch.allclose(ref["init"][n], e, rtol=2**-10, atol=0) for n, e in ref["trained"].items())
