"""`stage3_gather_16bit_weights_on_model_save`: each checkpoint folder also holds the gathered 16-bit model.

Tests (2 gloo ranks): a bf16 ZeRO-3 engine (and a ZeRO-2 one) saves after 2 steps; the step folder's
model.safetensors holds every param once (tied aliases not repeated, as DeepSpeed's consolidated state dict)
and every buffer, and each tensor equals the fp32 master weights, gathered independently through
iter_full_state(fp32), cast to bf16. With the flag off nothing is written.
Leaves out: the recipe keys that set the flag (tests/unit/test_config_deepspeed.py).
"""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
from _spawn import run_ranks
from safetensors.torch import load_file
from test_zero3_parity import Net3, options, train

from zerolaunch.checkpoint import save_checkpoint
from zerolaunch.zero import Engine
from zerolaunch.zero.options import PrecisionOptions


def _case(rank, world_size, root, stage, gather):
    base = options(persist=20)
    opts = replace(
        base,
        zero=replace(base.zero, stage=stage, stage3_gather_16bit_weights_on_model_save=gather),
        precision=PrecisionOptions(dtype="bf16"),
    )
    model = Net3(rank)
    engine = Engine(model, opts)
    train(engine, model, {}, rank, world_size, 2)
    folder = save_checkpoint(engine, root, step=2)
    master = dict(engine.iter_full_state(torch.float32))
    aliases = [a for spec in engine.param_specs() for a in spec.aliases]
    return str(folder), master, aliases


@pytest.mark.dist
@pytest.mark.parametrize("stage", [3, 2])
def test_checkpoint_carries_the_16bit_model(tmp_path, stage):
    folder, master, aliases = run_ranks(_case, 2, str(tmp_path), stage, True)[0]
    saved = load_file(f"{folder}/model.safetensors")
    assert aliases and not set(aliases) & set(saved)  # the tied weight is stored once
    assert sorted(saved) == sorted(master)
    for name, full in master.items():
        want = full.to(torch.bfloat16) if full.is_floating_point() else full
        assert saved[name].dtype == want.dtype, name
        torch.testing.assert_close(saved[name], want, rtol=0, atol=0, msg=name)


@pytest.mark.dist
def test_no_16bit_model_when_off(tmp_path):
    folder, _, _ = run_ranks(_case, 2, str(tmp_path), 3, False)[0]
    assert (tmp_path / "step_000002" / "manifest.json").exists()
    assert not list(tmp_path.rglob("model.safetensors"))
    assert folder.endswith("step_000002")
