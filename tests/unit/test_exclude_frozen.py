"""save_checkpoint(exclude_frozen_parameters=True) with a real engine, one process, stages 1 and 3.

The frozen param (requires_grad False) is in neither the manifest's params nor its replicated tensors, the
manifest names it (`excluded_frozen`); a strict load is refused naming load_module_strict; a non-strict load
gives back the saved trainable weights and optimizer state while the frozen param keeps the model's value
(here changed after the save); convert-checkpoint writes the other tensors. A checkpoint saved without the flag
has no `excluded_frozen` key. DeepSpeed's side by side check: tests/dist/test_ds_api_methods.py.
"""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file

from zerolaunch.checkpoint.convert import convert_checkpoint
from zerolaunch.checkpoint.errors import CheckpointError
from zerolaunch.checkpoint.load import load_checkpoint
from zerolaunch.checkpoint.save import save_checkpoint
from zerolaunch.zero import Engine
from zerolaunch.zero.options import EngineOptions, OptimizerOptions, ZeroOptions


def _engine(stage: int) -> tuple[Engine, torch.nn.Module]:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(5, 7), torch.nn.Tanh(), torch.nn.Linear(7, 3))
    model[0].bias.requires_grad_(False)
    options = EngineOptions(
        zero=ZeroOptions(stage=stage, stage3_param_persistence_threshold=0),
        optimizer=OptimizerOptions(name="adamw", lr=0.01),
    )
    return Engine(model, options), model


def _train(engine, steps: int, seed: int) -> None:
    for i in range(steps):
        x = torch.randn(4, 5, generator=torch.Generator().manual_seed(seed + i))
        engine.backward(engine(x).pow(2).mean())
        engine.step()


@pytest.mark.parametrize("stage", [1, 3])
def test_exclude_frozen_parameters_round_trip(tmp_path, stage):
    engine, model = _engine(stage)
    _train(engine, 2, 0)
    plain = save_checkpoint(engine, tmp_path / "plain", step=2)
    assert "excluded_frozen" not in json.loads((plain / "manifest.json").read_text())
    folder = save_checkpoint(engine, tmp_path / "ck", step=2, exclude_frozen_parameters=True)
    manifest = json.loads((folder / "manifest.json").read_text())
    assert manifest["excluded_frozen"] == ["0.bias"]
    assert "0.bias" not in {p["name"] for p in manifest["params"]} | {
        r["name"] for r in manifest["replicated"]
    }
    saved = {n: t.clone() for n, t in engine.iter_full_state()}

    _train(engine, 1, 100)  # move the trainable weights on, and the frozen one by hand
    if stage == 3:  # sharded like a trainable param: its value lives in the shards, not in .data
        engine.load_frozen_state(lambda name, start, stop: torch.full((stop - start,), 0.5))
    else:
        with torch.no_grad():
            model[0].bias.fill_(0.5)
    with pytest.raises(CheckpointError, match="load_module_strict=False"):
        load_checkpoint(engine, tmp_path / "ck")
    load_checkpoint(engine, tmp_path / "ck", strict=False)
    loaded = dict(engine.iter_full_state())
    assert engine.global_steps == 2
    for name, tensor in saved.items():
        expected = torch.full_like(tensor, 0.5) if name == "0.bias" else tensor
        torch.testing.assert_close(loaded[name], expected, rtol=0, atol=0, msg=name)

    out = convert_checkpoint(tmp_path / "ck", tmp_path / "out.safetensors")
    converted = load_file(out)
    assert sorted(converted) == sorted(n for n in saved if n != "0.bias")
    torch.testing.assert_close(converted["2.weight"], saved["2.weight"], rtol=0, atol=0)
