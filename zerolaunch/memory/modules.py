"""Facts read off a real `nn.Module` for the estimate: stage-3 units, linear layers, DeepSpeed's largest layer,
GPT sizes.

Imported only on the recipe / --model paths (it needs torch); `--params` never loads it.
"""

from __future__ import annotations

from zerolaunch.memory.arch import Arch, Linear, Unit
from zerolaunch.util.sizes import EstimateError

_ARCH_KEYS = {
    "n_layer": ("n_layer", "num_hidden_layers", "n_layers", "num_layers"),
    "d_model": ("d_model", "n_embd", "hidden_size", "dim"),
    "n_head": ("n_head", "num_attention_heads", "n_heads"),
    "vocab_size": ("vocab_size",),
    "d_ff": ("d_ff", "intermediate_size", "ffn_dim", "n_inner"),
}


def largest_layer_numel(model) -> int:
    """DeepSpeed's `model_to_params` definition: the most elements any one module holds itself."""
    return max((sum(p.numel() for p in m.parameters(recurse=False)) for m in model.modules()), default=0)


def detect_units(model, override: tuple[str, ...] = ()) -> tuple[Unit, ...]:
    """Stage-3 units exactly as the engine forms them (zero/stage3/partition.py): the root unit first."""
    from zerolaunch.zero.stage3.partition import partition

    try:
        part = partition(model, tuple(override), persistence_threshold=0)
    except ValueError as e:
        raise EstimateError(str(e)) from None
    return tuple(Unit(u.name, tuple(n for n, _ in u.params + u.frozen)) for u in part.units)


def detect_linears(model) -> tuple[Linear, ...]:
    """Every nn.Linear (and transformers' Conv1D, which PEFT's all-linear also adapts) in module order, the
    output head (`get_output_embeddings()`, else a module named lm_head) marked."""
    from torch import nn

    get_head = getattr(model, "get_output_embeddings", None)
    head = get_head() if callable(get_head) else None
    out = []
    for path, module in model.named_modules():
        if isinstance(module, nn.Linear):
            n_in, n_out = module.in_features, module.out_features
        elif type(module).__name__ == "Conv1D" and hasattr(module, "nx"):
            n_in, n_out = module.nx, module.nf  # weight (nx, nf)
        else:
            continue
        is_head = module is head if head is not None else path.rsplit(".", 1)[-1] == "lm_head"
        out.append(Linear(path, n_in, n_out, is_head))
    return tuple(out)


def _read(obj, keys):
    for k in keys:
        v = getattr(obj, k, None)
        if isinstance(v, int) and not isinstance(v, bool):
            return v
    return None


def detect_arch(model) -> Arch | None:
    """GPT sizes from the model or its `.config` (our GPT, nanoGPT, Hugging Face); None if not found."""
    for obj in (getattr(model, "config", None), getattr(model, "cfg", None), model):
        if obj is None:
            continue
        got = {k: _read(obj, keys) for k, keys in _ARCH_KEYS.items()}
        if got["n_layer"] and got["d_model"] and got["n_head"] and got["vocab_size"]:
            # Hugging Face's gated MLPs (Llama, Mistral, Qwen) are the ones whose activation is silu.
            gated = str(getattr(obj, "hidden_act", "")).lower() in ("silu", "swish", "swiglu")
            return Arch(
                got["n_layer"],
                got["d_model"],
                got["n_head"],
                got["vocab_size"],
                got["d_ff"] or 4 * got["d_model"],
                gated,
                _loss_chunk_rows(model, got["vocab_size"]),
                _linear_loss_rows(model),
            )
    return None


def moe_note(model) -> str | None:
    """What the estimate assumes for a mixture-of-experts model (an HF config with experts), shown with the
    model's source; None for a dense model.

    Weights: every expert is a parameter of every rank (no expert parallelism), so params, grads, master and
    optimizer state count all experts, sharded by ZeRO like any weight; at stage 3 a decoder layer's unit
    gathers all its experts at once (transformers 5 fuses them into 3-D tensors). Activations: modelled as
    one dense MLP of `intermediate_size` per token, while top-k routing runs k experts per token, so the
    MLP share is low by about k; router logits and dispatch indices are not counted."""
    config = getattr(model, "config", None)
    experts = _read(config, ("num_local_experts", "num_experts", "n_routed_experts")) if config else None
    if not experts or experts < 2:
        return None
    top_k = _read(config, ("num_experts_per_tok", "moe_topk")) or 1
    return (
        f"MoE: {experts} experts, top-{top_k}; every expert's weights counted on every rank (ZeRO-sharded, "
        f"no expert parallelism); activations as one dense MLP per token (low by about {top_k}x in the MLP)"
    )


def _loss_chunk_rows(model, vocab_size: int) -> int | None:
    """The built-in GPT's cross-entropy chunk (its own rule); None for other models (one unchunked loss)."""
    from zerolaunch.models.gpt import CE_CHUNK_ELEMENTS, GPT

    base = model.get_base_model() if hasattr(model, "get_base_model") else model  # under a PeftModel
    return max(1, CE_CHUNK_ELEMENTS // vocab_size) if isinstance(base, GPT) else None


def _linear_loss_rows(model) -> int | None:
    """`model.args.loss_chunk` of the built-in GPT or an HF model (models/hf_chunked_loss.py); None when off."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model  # under a PeftModel
    rows = getattr(base, "zerolaunch_loss_chunk", None) or getattr(
        getattr(base, "config", None), "loss_chunk", 0
    )
    return rows if isinstance(rows, int) and not isinstance(rows, bool) and rows > 0 else None
