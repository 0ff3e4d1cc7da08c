"""`zerolaunch train` with a `peft:` block over an HF model folder at stage 3 builds the base on the meta device:
the trainer's model holds no weights before the engine, the engine reads the files a unit at a time (its largest
init buffer is one unit, not the model), the base it holds equals the files, and the adapter starts as PEFT
starts it (B = 0). A `modules_to_save` copy starts as a copy of its pretrained original, as PEFT's deepcopy does
on real weights. One rank (gloo): the per-rank 1/N of the frozen base is tests/dist/test_zero3_frozen.py's.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from _helpers import save_tiny_llama_base

pytest.importorskip("peft")
pytest.importorskip("transformers")


def _recipe(folder, **peft):
    from zerolaunch.config.load import load_recipe

    corpus = folder.parent / "corpus.jsonl"
    corpus.write_text('{"text": "a lazy dog"}\n')
    return load_recipe(
        {
            "model": {"builder": "zerolaunch.models.hf:build", "args": {"path": str(folder)}},
            "data": {
                "builder": "zerolaunch.data.hf_text:build",
                "args": {"path": str(corpus), "seq_len": 16},
            },
            "train": {"steps": 1, "micro_batch_size": 1},
            "peft": {"r": 4, "lora_alpha": 8, "target_modules": ["q_proj", "v_proj"], **peft},
            "deepspeed": {"zero_optimization": {"stage": 3, "stage3_param_persistence_threshold": 0}},
        }
    )


def _trainer_model(recipe):
    """The model the trainer hands its engine (Trainer._build_model, without the rest of the run)."""
    from zerolaunch.train.context import RunContext
    from zerolaunch.train.loop import Trainer

    ctx = RunContext(rank=0, local_rank=0, world_size=1, device=torch.device("cpu"))
    return Trainer._build_model(SimpleNamespace(recipe=recipe, ctx=ctx))


def _base_name(peft_name: str) -> str:
    return (
        peft_name.removeprefix("base_model.model.")
        .replace(".base_layer.", ".")
        .replace(".original_module.", ".")
    )


def test_peft_recipe_builds_the_base_on_meta(group, tmp_path):
    from zerolaunch.build import build_engine

    files = save_tiny_llama_base(tmp_path / "base")
    recipe = _recipe(tmp_path / "base")
    model = _trainer_model(recipe)
    assert all(p.is_meta for p in model.parameters()), "the base was built with real weights"
    engine = build_engine(model, recipe.engine, device="cpu")
    layer_numel = sum(v.numel() for k, v in files.items() if k.startswith("model.layers.0."))
    whole = sum(v.numel() for v in files.values())
    assert 0 < engine.sharding.init_peak_numel < whole / 2  # unit by unit
    assert engine.sharding.init_peak_numel <= max(layer_numel, files["lm_head.weight"].numel() * 2) * 1.1
    state = dict(engine.iter_full_state(torch.float32))
    base = {_base_name(k): v for k, v in state.items() if "lora_" not in k}
    assert files.keys() <= base.keys()
    for name, value in files.items():
        assert torch.equal(base[name].float(), value.float()), name
    lora_b = [v for k, v in state.items() if "lora_B" in k]
    lora_a = [v for k, v in state.items() if "lora_A" in k]
    assert len(lora_a) == len(lora_b) == 3 * 2
    assert all(not v.any() for v in lora_b)
    assert all(v.std() > 0 for v in lora_a)
    assert {n for n, p in engine.module.named_parameters() if p.requires_grad} == {
        k for k in state if "lora_" in k
    }


def test_modules_to_save_starts_as_its_original(group, tmp_path):
    from zerolaunch.build import build_engine

    files = save_tiny_llama_base(tmp_path / "base")
    recipe = _recipe(tmp_path / "base", modules_to_save=["lm_head"])
    model = _trainer_model(recipe)
    assert all(p.is_meta for p in model.parameters())
    engine = build_engine(model, recipe.engine, device="cpu")
    state = dict(engine.iter_full_state(torch.float32))
    copy = state["base_model.model.lm_head.modules_to_save.default.weight"]
    assert torch.equal(copy.float(), files["lm_head.weight"].float())
    assert torch.equal(state["base_model.model.lm_head.original_module.weight"].float(), copy.float())
    trainable = {n for n, p in engine.module.named_parameters() if p.requires_grad}
    assert "base_model.model.lm_head.modules_to_save.default.weight" in trainable


def test_modules_to_save_of_a_whole_unit_is_refused(tmp_path):
    from zerolaunch.util.errors import UserError

    save_tiny_llama_base(tmp_path / "base")
    with pytest.raises(UserError) as err:
        _trainer_model(_recipe(tmp_path / "base", modules_to_save=["layers.1"]))
    message = str(err.value)
    assert "peft.modules_to_save" in message and "`model.layers.1`" in message
    assert "LlamaDecoderLayer" in message and "`model.layers.1.mlp`" in message
