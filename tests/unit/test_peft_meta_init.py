"""A PeftModel whose base was built on the meta device, wrapped at stage 3 (zerolaunch.initialize): the engine
initializes each unit with HF's init for the base and PEFT's for the adapter, so LoRA's B starts at zero (the
adapted model is its base) and A is drawn as PEFT draws it (kaiming-uniform, bound 1/sqrt(in_features)), not as
HF draws any Linear. An adapter whose init reads the base weights is refused, naming the option."""

from __future__ import annotations

import math

import pytest
import torch

peft = pytest.importorskip("peft")
transformers = pytest.importorskip("transformers")

DS = {
    "train_micro_batch_size_per_gpu": 1,
    "gradient_accumulation_steps": 1,
    "bf16": {"enabled": True},
    "zero_optimization": {"stage": 3},
    "optimizer": {"type": "AdamW", "params": {"lr": 1e-4}},
}
HIDDEN = 64


def _meta_peft_model(**lora):
    config = transformers.LlamaConfig(
        hidden_size=HIDDEN,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=256,
    )
    with torch.device("meta"):
        model = transformers.LlamaForCausalLM(config).to(torch.bfloat16)
    targets = ["q_proj", "v_proj", "down_proj"]
    return peft.get_peft_model(model, peft.LoraConfig(r=8, lora_alpha=16, target_modules=targets, **lora))


def test_meta_lora_starts_as_peft_starts_it(group):
    import zerolaunch

    engine = zerolaunch.initialize(_meta_peft_model(), DS, device="cpu")
    state = engine.consolidated_state_dict()
    b = {k: v for k, v in state.items() if "lora_B" in k}
    a = {k: v for k, v in state.items() if "lora_A" in k}
    assert len(a) == len(b) == 2 * 3
    assert all(not v.any() for v in b.values()), "LoRA's B must start at zero"
    for name, v in a.items():
        bound = 1 / math.sqrt(v.shape[1])  # kaiming_uniform_(a=sqrt(5)) of PEFT's A
        assert v.abs().max() <= bound + 1e-6 and v.std() > bound / 4, name
    base = [v for k, v in state.items() if k.endswith("q_proj.base_layer.weight")]
    assert base and all(v.std() > 0.01 for v in base)  # the base still gets HF's init


def test_meta_lora_init_from_base_weights_is_refused(group):
    import zerolaunch

    model = _meta_peft_model()
    model.peft_config["default"].init_lora_weights = "pissa"  # as if asked for: PiSSA reads the base's SVD
    with pytest.raises(ValueError, match="init_lora_weights='pissa'.*meta|meta.*pissa"):
        zerolaunch.initialize(model, DS, device="cpu")
