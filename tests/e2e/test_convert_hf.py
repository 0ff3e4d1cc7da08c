"""A converted zerolaunch checkpoint of a Hugging Face model loads with `from_pretrained` (no unexpected or
missing keys: non-persistent buffers such as Llama's rotary cache are left out, config.json comes from
rank 0's extra) and gives the engine's logits exactly. One process, world size 1, stage 2.
"""

from __future__ import annotations

import pytest
import torch

transformers = pytest.importorskip("transformers")

import zerolaunch  # noqa: E402
from zerolaunch.checkpoint.convert import convert_checkpoint  # noqa: E402
from zerolaunch.models import hf  # noqa: E402

CONFIG = dict(
    model_type="llama",
    vocab_size=64,
    hidden_size=32,
    intermediate_size=40,
    num_hidden_layers=1,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=32,
    tie_word_embeddings=True,
)


def test_converted_hf_checkpoint_loads_with_from_pretrained(tmp_path):
    engine = zerolaunch.initialize(
        hf.build(config=CONFIG), {"zero_optimization": {"stage": 2}, "train_micro_batch_size_per_gpu": 2}
    )
    x = torch.randint(0, 64, (2, 16), generator=torch.Generator().manual_seed(0))
    for _ in range(2):
        engine.backward(engine(input_ids=x, labels=x).loss)
        engine.step()
    engine.save_checkpoint(tmp_path / "ck")
    out = convert_checkpoint(tmp_path / "ck", tmp_path / "out")
    assert sorted(p.name for p in out.iterdir()) == ["config.json", "model.safetensors"]
    model, info = transformers.AutoModelForCausalLM.from_pretrained(out, output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"], info
    with torch.no_grad():
        assert torch.equal(model(input_ids=x).logits, engine.module(input_ids=x).logits)
