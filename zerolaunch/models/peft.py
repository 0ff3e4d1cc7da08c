"""A recipe's `peft:` block applied to the built model (PEFT's LoraConfig + get_peft_model), and the checks
that go with it; also what a checkpoint keeps so that convert-checkpoint can rebuild the PeftModel.

Owns: telling a PeftModel apart (without importing peft when nothing did), the LoraConfig a `PeftSection`
stands for, the did-you-mean check of `target_modules` against the model's module names (PEFT's own error
names no close match), and the JSON record of a PeftModel's adapter (its config dict). It does not train, gather, rebuild or
write: checkpoint/peft_adapter.py writes adapter folders, checkpoint/peft_convert.py rebuilds a run's model.
"""

from __future__ import annotations

import sys

from zerolaunch.models.kinds import is_hf_model
from zerolaunch.util.errors import UserError

PEFT_MISSING = (
    "the recipe has a `peft:` block, but the peft package is not installed. pip install peft (LoRA adapters "
    "come from it), or remove the `peft:` block to train every weight"
)


def is_peft_model(model) -> bool:
    """True for a peft PeftModel (without importing peft when nothing imported it)."""
    peft = sys.modules.get("peft")
    return peft is not None and isinstance(model, peft.PeftModel)


def import_peft():
    try:
        import peft
    except ImportError:
        raise UserError(PEFT_MISSING) from None
    return peft


def lora_kwargs(section, *, causal_lm: bool) -> dict:
    """LoraConfig's keyword arguments for a recipe's PeftSection (the same names)."""
    targets = section.target_modules
    return {
        "r": section.r,
        "lora_alpha": section.lora_alpha,
        "lora_dropout": section.lora_dropout,
        "target_modules": list(targets) if isinstance(targets, tuple) else targets,
        "bias": section.bias,
        "modules_to_save": list(section.modules_to_save) or None,
        "task_type": "CAUSAL_LM" if causal_lm else None,
    }


def module_names(model) -> list[str]:
    return [name for name, _ in model.named_modules() if name]


def target_problem(model, section) -> str | None:
    """Why `peft.target_modules` / `peft.modules_to_save` name something the model does not have (with a
    did-you-mean over the model's module names), or None. A name matches a module whose full name is it or
    ends in `.name`, PEFT's rule for a list; a single string other than all-linear is a regex PEFT checks."""
    names = module_names(model)
    leaves = {n.rsplit(".", 1)[-1] for n in names}
    targets = section.target_modules
    for key, wanted in (("target_modules", targets), ("modules_to_save", section.modules_to_save)):
        if not isinstance(wanted, tuple):
            continue
        for target in wanted:
            if not any(n == target or n.endswith(f".{target}") for n in names):
                return f"peft.{key} names `{target}`, which is no module of the model.{_hint(target, leaves)}"
    if targets == "all-linear" and not is_hf_model(model):
        return (
            "peft.target_modules is all-linear, which PEFT resolves for transformers models only; list the "
            f"linear layers by name instead (the model's module names: {', '.join(sorted(leaves)[:12])})"
        )
    return None


def _hint(word: str, leaves: set[str]) -> str:
    import difflib

    close = difflib.get_close_matches(word, sorted(leaves), n=1, cutoff=0.6)
    if close:
        return f" Did you mean `{close[0]}`?"
    shown = sorted(leaves)
    return f" The model's module names: {', '.join(shown[:12])}{', ...' if len(shown) > 12 else ''}."


def apply_peft(model, section, where: str = "the recipe"):
    """get_peft_model(model, LoraConfig(...)) for a recipe's `peft:` block; a UserError (exit 2) when peft is
    missing or a target does not exist."""
    problem = target_problem(model, section)
    if problem is not None:
        raise UserError(f"{where}: {problem}")
    peft = import_peft()
    config = peft.LoraConfig(**lora_kwargs(section, causal_lm=_is_causal_lm(model)))
    return peft.get_peft_model(model, config)


def _is_causal_lm(model) -> bool:
    if not is_hf_model(model):
        return False
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    return type(model).__name__ in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.values()


def adapter_record(model) -> dict:
    """JSON of the default adapter's PeftConfig (what adapter_config.json holds), for a checkpoint's extra:
    convert-checkpoint rebuilds the PeftModel from it and the base's HF config."""
    import json

    # plain JSON, as adapter_config.json holds it: target_modules is a set once PEFT resolved it
    config = json.loads(json.dumps(model.peft_config["default"].to_dict(), default=_jsonable))
    return {"config": config}


def _jsonable(value):
    if isinstance(value, (set, frozenset)):
        return sorted(value)
    raise TypeError(f"{type(value).__name__} in a PEFT config is not JSON")


# LoRA's own init choices that need nothing but the adapter's shape; the others (pissa, olora, loftq, eva,
# corda, DoRA's magnitude) are computed from the base weights, which a meta-built model does not have yet.
META_LORA_INITS = (True, False, "gaussian")


def meta_adapter_init(model, base_init):
    """init_fn(module) for a PeftModel built on the meta device under ZeRO-3: `base_init` for the base
    model's modules, PEFT's own init for each LoRA layer's adapter (A as PEFT draws it, B = 0), so the adapted
    model starts as its base. A ValueError for an adapter whose init needs the base weights."""
    from peft.tuners.lora import LoraLayer
    from torch import nn

    adapter_modules: set[int] = set()
    copies = _saved_module_copies(model)
    for layer in model.modules():
        if not isinstance(layer, LoraLayer):
            continue
        for attr in layer.adapter_layer_names:
            holder = getattr(layer, attr, None)
            if isinstance(holder, nn.Module):
                adapter_modules.update(id(m) for m in holder.modules())
        for adapter in layer.lora_A.keys() | layer.lora_embedding_A.keys():
            _check_meta_init(model, adapter, layer)

    def init(module):
        if id(module) in copies:
            _copy_from_original(module, copies[id(module)])
            return
        if id(module) in adapter_modules:
            return  # the LoRA layer above it initializes it
        if isinstance(module, LoraLayer):
            for adapter in module.lora_A.keys() | module.lora_embedding_A.keys():
                _init_adapter(model, module, adapter)
            return
        base_init(module)

    return init


def _init_mode(model, adapter: str):
    return model.peft_config[adapter].init_lora_weights


def _check_meta_init(model, adapter: str, layer) -> None:
    mode = _init_mode(model, adapter)
    if mode not in META_LORA_INITS or layer.use_dora.get(adapter, False):
        what = "use_dora" if layer.use_dora.get(adapter, False) else f"init_lora_weights={mode!r}"
        raise ValueError(
            f"the LoRA adapter {adapter!r} ({what}) is initialized from the base model's weights, which a "
            "model built on the meta device does not have; build the base with real weights (or from_pretrained) "
            f"before get_peft_model, or use init_lora_weights in {META_LORA_INITS}"
        )


def _init_adapter(model, layer, adapter: str) -> None:
    from torch import nn

    mode = _init_mode(model, adapter)
    if mode is False:  # PEFT keeps the modules' own init (B not zero: the adapter changes the model)
        for attr in ("lora_A", "lora_B"):
            if adapter in getattr(layer, attr):
                getattr(layer, attr)[adapter].reset_parameters()
        for attr in ("lora_embedding_A", "lora_embedding_B"):
            if adapter in getattr(layer, attr):
                nn.init.normal_(getattr(layer, attr)[adapter])
        return
    layer.reset_lora_parameters(adapter, mode)


def saved_unit_problem(model, unit_names) -> str | None:
    """Why a `modules_to_save` module cannot start as its original on a meta-built base: it is a ZeRO-3 unit
    of its own (a decoder layer), sharded before its copy (another unit) is filled from it; else None."""
    from peft.utils.other import ModulesToSaveWrapper

    for name, wrapper in model.named_modules():
        if isinstance(wrapper, ModulesToSaveWrapper) and type(wrapper.original_module).__name__ in unit_names:
            short = name.removeprefix("base_model.model.")
            return (
                f"peft.modules_to_save names `{short}`, a whole ZeRO-3 unit ({type(wrapper.original_module).__name__}): "
                "at stage 3 the base is built on the meta device and each unit sharded in turn, so its trainable "
                "copy could not start as the pretrained original. Save a module inside a unit instead (e.g. "
                f"`{short}.mlp`), or train at stage 2"
            )
    return None


def _saved_module_copies(model) -> dict:
    """id(module of a modules_to_save copy) -> the module of the original it copies. PEFT deep-copies each
    `modules_to_save` module when it wraps it, so the trained copy starts as the pretrained original; on meta
    there was nothing to copy yet, and the copy is filled from the original once the original is initialized
    (before it in the unit's pre-order: the wrapper holds `original_module` first)."""
    from peft.utils.other import ModulesToSaveWrapper

    copies = {}
    for wrapper in model.modules():
        if not isinstance(wrapper, ModulesToSaveWrapper):
            continue
        originals = dict(wrapper.original_module.named_modules())
        for copy in wrapper.modules_to_save.values():
            for name, sub in copy.named_modules():
                if name in originals:
                    copies[id(sub)] = originals[name]
    return copies


def _copy_from_original(module, original) -> None:
    for kind in ("_parameters", "_buffers"):
        source = getattr(original, kind)
        for key, tensor in getattr(module, kind).items():
            value = source.get(key)
            if tensor is None or value is None or tensor is value:
                continue  # a tied copy shares the original's tensor (PEFT's tied_module): nothing to fill
            if value.is_meta or value.untyped_storage().nbytes() == 0:
                raise ValueError(
                    "peft.modules_to_save: the copy of a module built on the meta device is filled from its "
                    "original, whose values this rank no longer holds whole (the module is a ZeRO-3 unit of "
                    "its own); save a module inside a unit (lm_head, a score head), or build the base with "
                    "real weights before get_peft_model"
                )
            tensor.copy_(value.to(tensor.dtype))
