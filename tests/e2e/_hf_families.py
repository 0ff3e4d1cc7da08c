"""Tiny configs of every Hugging Face causal LM family the suite trains, converts and reloads
(tests/e2e/test_hf_families.py; docs/hf-models.md lists them). 2 layers, 32 wide, vocab 64: each model builds
in milliseconds on CPU. MoE families route 2 of 4 experts per token.
Dropout is off where a family has it on by default (GPT-2, OPT), so both stages see the same forward."""

from __future__ import annotations

V, H, L, HEADS, KV = 64, 32, 2, 4, 2
DECODER = {
    "vocab_size": V,
    "hidden_size": H,
    "intermediate_size": 48,
    "num_hidden_layers": L,
    "num_attention_heads": HEADS,
    "num_key_value_heads": KV,
    "max_position_embeddings": 32,
}
MOE = {"num_experts_per_tok": 2}

FAMILIES: dict[str, dict] = {
    "llama-tied": {"model_type": "llama", **DECODER, "tie_word_embeddings": True},
    "llama-untied": {"model_type": "llama", **DECODER, "tie_word_embeddings": False},
    "mistral": {"model_type": "mistral", **DECODER},
    "qwen2": {"model_type": "qwen2", **DECODER},
    "qwen3": {"model_type": "qwen3", **DECODER, "head_dim": 8},
    "gemma": {"model_type": "gemma", **DECODER, "head_dim": 8},
    "gemma2": {"model_type": "gemma2", **DECODER, "head_dim": 8},
    "gemma3-text": {"model_type": "gemma3_text", **DECODER, "head_dim": 8},
    "phi3": {"model_type": "phi3", **DECODER, "pad_token_id": 0, "bos_token_id": 1, "eos_token_id": 2},
    "gpt2": {
        "model_type": "gpt2",
        "vocab_size": V,
        "n_embd": H,
        "n_layer": L,
        "n_head": HEADS,
        "n_positions": 32,
        "bos_token_id": 0,
        "eos_token_id": 0,
        # dropout off: the stages draw their dropout masks in different orders, the losses would differ
        "resid_pdrop": 0.0,
        "embd_pdrop": 0.0,
        "attn_pdrop": 0.0,
    },
    "opt": {
        "model_type": "opt",
        "vocab_size": V,
        "hidden_size": H,
        "ffn_dim": 48,
        "num_hidden_layers": L,
        "num_attention_heads": HEADS,
        "word_embed_proj_dim": H,
        "max_position_embeddings": 32,
        "pad_token_id": 1,
        "dropout": 0.0,
    },
    "olmo": {"model_type": "olmo", **DECODER, "pad_token_id": 1, "eos_token_id": 2},
    "olmo2": {"model_type": "olmo2", **DECODER, "pad_token_id": 1},
    "falcon": {
        "model_type": "falcon",
        "vocab_size": V,
        "hidden_size": H,
        "num_hidden_layers": L,
        "num_attention_heads": HEADS,
    },
    "stablelm": {"model_type": "stablelm", **DECODER},
    "mixtral": {"model_type": "mixtral", **DECODER, **MOE, "num_local_experts": 4},
    "qwen2-moe": {
        "model_type": "qwen2_moe",
        **DECODER,
        **MOE,
        "num_experts": 4,
        "moe_intermediate_size": 16,
        "shared_expert_intermediate_size": 24,
    },
    "qwen3-moe": {
        "model_type": "qwen3_moe",
        **DECODER,
        **MOE,
        "num_experts": 4,
        "moe_intermediate_size": 16,
    },
    "gpt-neox": {
        "model_type": "gpt_neox",
        "vocab_size": V,
        "hidden_size": H,
        "intermediate_size": 48,
        "num_hidden_layers": L,
        "num_attention_heads": HEADS,
        "max_position_embeddings": 32,
        "tie_word_embeddings": False,
    },
}
