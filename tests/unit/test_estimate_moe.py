"""estimate-memory on a mixture-of-experts HF model (a tiny Mixtral on meta): what it assumes is stated.

Covers: the shape counts every expert's weights (no expert parallelism), the model line says so and names
the top-k activation caveat; a dense model gets no such note. Leaves out: the memory arithmetic itself
(test_memory.py), which treats expert weights like any other.
"""

import pytest
import torch

transformers = pytest.importorskip("transformers")

from zerolaunch.memory.shape import from_module  # noqa: E402

H, FF, E, LAYERS, V = 32, 48, 4, 2, 64


def _meta(model_type, **extra):
    config = transformers.AutoConfig.for_model(
        model_type,
        vocab_size=V,
        hidden_size=H,
        intermediate_size=FF,
        num_hidden_layers=LAYERS,
        num_attention_heads=4,
        num_key_value_heads=2,
        **extra,
    )
    with torch.device("meta"):
        return transformers.AutoModelForCausalLM.from_config(config)


def test_moe_shape_counts_every_expert_and_says_what_it_assumes():
    shape = from_module(_meta("mixtral", num_local_experts=E, num_experts_per_tok=2), source="mixtral")
    # by hand: attention q,o (H x H) + k,v (H/2 x H), router (E x H), E experts of w1, w3 (FF x H) and w2 (H x
    # FF), two norms per layer; embeddings, untied head and the final norm.
    layer = 2 * H * H + 2 * (H // 2) * H + E * H + E * 3 * FF * H + 2 * H
    assert shape.numel == LAYERS * layer + 2 * V * H + H
    assert "MoE: 4 experts, top-2" in shape.source and "no expert parallelism" in shape.source
    assert "low by about 2x" in shape.source


def test_dense_model_has_no_moe_note():
    assert "MoE" not in from_module(_meta("llama"), source="llama").source
