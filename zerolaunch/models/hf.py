"""Any Hugging Face `transformers` causal LM as a zerolaunch model (`model.builder: zerolaunch.models.hf:build`).

This module owns turning recipe arguments into an `AutoModelForCausalLM`: from a local directory
(`path:`, `from_pretrained`) or from a config given inline (`config: {model_type: llama, ...}`, `from_config`,
random init). It never downloads (HF_HUB_OFFLINE=1 and local_files_only=True), rejects config keys the model's
config class does not know (transformers itself would silently keep them), and says which module class makes
a ZeRO-3 unit (the decoder layer, from `_no_split_modules`). It does not know the engine or the data; the
model returns HF's output object whose `.loss` the loop reads (labels == input_ids, HF shifts them itself).
"""

from __future__ import annotations

import difflib
import functools
import json
import os
from dataclasses import replace
from pathlib import Path

import torch
from torch import nn

from zerolaunch.dtypes import DTYPES, torch_dtype
from zerolaunch.models.hf_chunked_loss import enable_chunked_loss
from zerolaunch.models.hf_load import build_meta
from zerolaunch.models.kinds import is_hf_model
from zerolaunch.models.peft import is_peft_model, meta_adapter_init
from zerolaunch.util.hf_env import hf_offline


def _transformers():
    """Import transformers offline, or fail with the install command."""
    hf_offline()  # before the import: huggingface_hub reads HF_HUB_OFFLINE once, when first imported
    try:
        import transformers
    except ImportError:
        raise ImportError(
            "model.builder zerolaunch.models.hf needs transformers: pip install 'zerolaunch[hf]'"
        ) from None
    return transformers


def _dtype_kwarg(transformers, dtype: torch.dtype) -> dict:
    # transformers 4.56 renamed from_pretrained's torch_dtype to dtype; 4.40-4.55 only know torch_dtype.
    major, minor = (int(x) for x in transformers.__version__.split(".")[:2])
    return {"dtype": dtype} if (major, minor) >= (4, 56) else {"torch_dtype": dtype}


def make_config(config: dict):
    """An HF config object from an inline dict with `model_type`; unknown keys are an error with a hint."""
    transformers = _transformers()
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    if not isinstance(config, dict):
        raise ValueError(
            f"model.args.config must be a mapping (model_type: llama, ...), got {type(config).__name__}"
        )
    fields = dict(config)
    model_type = fields.pop("model_type", None)
    if model_type is None:
        raise ValueError("model.args.config needs a model_type key (e.g. llama, gpt2, mistral, qwen2)")
    if model_type not in CONFIG_MAPPING:
        close = difflib.get_close_matches(str(model_type), list(CONFIG_MAPPING.keys()), n=3)
        hint = f"; did you mean {', '.join(close)}?" if close else ""
        raise ValueError(
            f"model.args.config.model_type {model_type!r} is not a model type transformers "
            f"{transformers.__version__} knows{hint}"
        )
    config_class = CONFIG_MAPPING[model_type]
    known = set(vars(config_class())) | set(getattr(config_class, "attribute_map", {}))
    unknown = sorted(k for k in fields if k not in known)
    if unknown:
        key = unknown[0]
        close = difflib.get_close_matches(key, sorted(known), n=1)
        hint = f"; did you mean {close[0]!r}?" if close else ""
        raise ValueError(f"model.args.config.{key}: {config_class.__name__} has no such field{hint}")
    return config_class(**fields)


def check_local_dir(path: str | os.PathLike) -> Path:
    """The directory of a saved model, or a clear error: zerolaunch never downloads."""
    p = Path(path)
    if not p.is_dir():
        raise FileNotFoundError(
            f"model.args.path: {p} is not a local directory (zerolaunch never downloads models; give a "
            "directory written by save_pretrained or by `zerolaunch convert-checkpoint`, holding config.json "
            "and model.safetensors)"
        )
    if not (p / "config.json").is_file():
        raise FileNotFoundError(
            f"model.args.path: {p} has no config.json; is it a Hugging Face model directory?"
        )
    return p


def unit_class_names(model: nn.Module) -> tuple[str, ...]:
    """Module class names that make one ZeRO-3 unit each: HF's `_no_split_modules` (the decoder layers)."""
    names = tuple(getattr(model, "_no_split_modules", None) or ())
    present = {type(m).__name__ for m in model.modules()}
    return tuple(n for n in names if n in present)


def build(
    *,
    path: str | None = None,
    config: dict | None = None,
    dtype: str = "fp32",
    attn_implementation: str | None = None,
    meta: bool = False,
    loss_chunk: int = 0,
) -> nn.Module:
    """The model builder.

    path: a local HF model directory (weights loaded). config: an inline config with model_type (random init).
    dtype: fp32 | bf16 | fp16 for the weights as built (the engine casts to precision.dtype anyway).
    attn_implementation: eager | sdpa | flash_attention_2 ..., None = transformers' default.
    meta: build on the meta device (no memory; for ZeRO-3 to materialize unit by unit). With `path`, the
      weights are read unit by unit from the directory's safetensors files (models/hf_load.py).
    loss_chunk: tokens per chunk of a training loss that never holds the logits (models/hf_chunked_loss.py);
      0 = HF's own loss.
    """
    if (path is None) == (config is None):
        raise ValueError(
            "model.args needs exactly one of path (a local HF model directory) or config (an inline "
            "config with model_type)"
        )
    if isinstance(loss_chunk, bool) or not isinstance(loss_chunk, int) or loss_chunk < 0:
        raise ValueError(
            f"model.args.loss_chunk must be an int >= 0 (tokens per loss chunk, 0 = off), got {loss_chunk!r}"
        )
    if dtype not in DTYPES:
        raise ValueError(f"model.args.dtype must be one of {', '.join(DTYPES)}, got {dtype!r}")
    transformers = _transformers()
    extra = {} if attn_implementation is None else {"attn_implementation": attn_implementation}
    if path is not None and meta:
        # ZeRO-3: the engine fills each unit from the files through model.zerolaunch_init_fn.
        model = build_meta(check_local_dir(path), transformers, torch_dtype(dtype), extra)
    elif path is not None:
        local = check_local_dir(path)
        model = transformers.AutoModelForCausalLM.from_pretrained(
            str(local), local_files_only=True, **_dtype_kwarg(transformers, torch_dtype(dtype)), **extra
        )
    else:
        cfg = make_config(config)
        if meta:
            with torch.device("meta"):
                model = transformers.AutoModelForCausalLM.from_config(cfg, **extra)
        else:
            model = transformers.AutoModelForCausalLM.from_config(cfg, **extra)
        model = model.to(torch_dtype(dtype))
    # training: no KV cache (it only costs memory, and some models warn when it meets labels).
    model.config.use_cache = False
    # from_pretrained hands back eval mode (dropout off); this builder builds models to train.
    model.train()
    # train.activation_checkpointing calls model.enable_activation_checkpointing(); HF spells it
    # activation_checkpointing_enable (gradient_checkpointing_enable before transformers 5.x, deprecated
    # since). Non-reentrant: it re-runs ZeRO-3's gather hooks in the recomputation.
    if hasattr(model, "activation_checkpointing_enable"):
        enable = functools.partial(
            model.activation_checkpointing_enable, activation_checkpointing_kwargs={"use_reentrant": False}
        )
    else:
        enable = functools.partial(
            model.gradient_checkpointing_enable, gradient_checkpointing_kwargs={"use_reentrant": False}
        )
    model.enable_activation_checkpointing = enable
    if loss_chunk:
        enable_chunked_loss(model, loss_chunk)
    return model


# train/loop.py passes meta=True under ZeRO-3 to a builder that names its meta argument here (the builder
# builds on the meta device itself: from_pretrained must not run under torch.device("meta")).
build.meta_arg = "meta"


# Helpers for an HF model under the engine (used by api.initialize, train/loop.py and train/checkpointing.py).


def meta_init_fn(model, options):
    """An HF model built on the meta device (model.args.meta) under ZeRO-3 is initialized unit by unit with
    HF's own per-module init (`_init_weights`: normal(0, initializer_range), norms at 1, rotary tables),
    not torch's reset_parameters defaults."""
    if options.zero.stage != 3 or not any(t.is_meta for t in [*model.parameters(), *model.buffers()]):
        return None
    # a meta model built from a local directory (models/hf_load.py) is filled from its weights files.
    from_files = getattr(model, "zerolaunch_init_fn", None)
    base_init = from_files
    if base_init is None and is_hf_model(model) and hasattr(model, "_init_weights"):
        base_init = model._init_weights

    if base_init is not None and is_peft_model(model):
        # HF's init would draw a LoRA B like any Linear: the adapter must start as PEFT starts it (B = 0)
        return meta_adapter_init(model, base_init)
    return base_init


def hf_stage3_units(model, options):
    """HF models under ZeRO-3 with no unit override: the decoder layer classes become the units."""
    if options.zero.stage != 3 or options.zero.stage3_units:
        return options
    units = unit_class_names(model) if is_hf_model(model) else ()
    if not units:
        return options
    return replace(options, zero=replace(options.zero, stage3_units=units))


# ---- entrypoint scripts -------------------------------------------------------------------------------------


def hf_config_dict(model) -> dict | None:
    """The JSON dict of an HF model's config (what config.json holds), or None for other models."""
    if not is_hf_model(model):
        return None
    config = json.loads(model.config.to_json_string(use_diff=False))
    # a model built from a config has architectures None; save_pretrained writes the class that saved it
    config["architectures"] = [type(model).__name__]
    return config
