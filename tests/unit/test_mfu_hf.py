"""Training FLOPs per token of a Hugging Face decoder, from its config."""

from __future__ import annotations

import pytest

from zerolaunch.report.mfu import hf_flops_per_token

TINY_LLAMA = {
    "model_type": "llama",
    "num_hidden_layers": 2,
    "hidden_size": 64,
    "intermediate_size": 176,
    "num_attention_heads": 8,
    "num_key_value_heads": 2,
    "vocab_size": 300,
}


def test_tiny_llama_against_a_hand_count():
    # per layer: q 64x64, o 64x64, k and v 64x(2 heads * 8) each, gate/up/down 64x176 each
    per_layer = 4096 + 4096 + 1024 + 1024 + 3 * 11264  # 44_032
    n_matmul = 2 * per_layer + 64 * 300  # + lm_head = 107_264
    attention = 12 * 2 * 8 * 8 * 128  # 12 * layers * heads * d_head * seq = 196_608
    assert hf_flops_per_token(TINY_LLAMA, 128) == 6 * n_matmul + attention == 840_192


def test_matmul_count_matches_the_built_model():
    transformers = pytest.importorskip("transformers")
    import torch

    cfg = transformers.LlamaConfig(**{k: v for k, v in TINY_LLAMA.items() if k != "model_type"})
    model = transformers.LlamaForCausalLM(cfg)
    n_linear = sum(m.weight.numel() for m in model.modules() if isinstance(m, torch.nn.Linear))
    attention = 12 * 2 * 8 * 8 * 128
    assert hf_flops_per_token(cfg.to_dict(), 128) == 6 * n_linear + attention


def test_explicit_head_dim_and_missing_kv_heads():
    cfg = {**TINY_LLAMA, "head_dim": 16}
    del cfg["num_key_value_heads"]  # absent: as many kv heads as heads
    per_layer = 4 * 64 * (8 * 16) + 3 * 64 * 176
    assert hf_flops_per_token(cfg, 10) == 6 * (2 * per_layer + 64 * 300) + 12 * 2 * 8 * 16 * 10


def test_unknown_shapes_give_none_not_a_guess():
    assert hf_flops_per_token({**TINY_LLAMA, "model_type": "gpt2"}, 128) is None
    incomplete = dict(TINY_LLAMA)
    del incomplete["intermediate_size"]
    assert hf_flops_per_token(incomplete, 128) is None
