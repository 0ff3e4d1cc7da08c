"""Loading a local Hugging Face model directory under ZeRO-3 without ever materializing the whole model.

This module owns: finding the weights files of a directory save_pretrained wrote (model.safetensors, or shards
named by model.safetensors.index.json), building the model on the meta device from its config.json, checking
up front that every persistent tensor is in the files (tied weights count once), and the `CheckpointInit`
that stage 3 calls as `init_fn(module)` for each module of one unit at a time: it reads just that module's
tensors from the files (safetensors `get_tensor`, one group at a time: a tensor, or the per-expert tensors
of one fused MoE tensor, mapped by transformers' own conversion mapping in models/hf_mapping.py, converted to
the param's dtype) and recomputes non-persistent buffers (rotary tables) with the model's own `_init_weights`,
never from the file. It does not know the engine; hf.py calls it.
"""

from __future__ import annotations

import contextlib
import json
from pathlib import Path

import torch
from torch import nn

from zerolaunch.models.hf_mapping import LoadPlan, _core

INDEX_FILE = "model.safetensors.index.json"
SINGLE_FILE = "model.safetensors"


def weight_files(local: Path) -> dict[str, Path]:
    """{tensor name: file holding it} for a save_pretrained directory, or a clear error."""
    index = local / INDEX_FILE
    if index.is_file():
        try:
            weight_map = json.loads(index.read_text())["weight_map"]
        except (ValueError, KeyError, TypeError) as e:
            raise ValueError(f"model.args.path: {index} is not a safetensors index ({e})") from None
        files = {name: local / f for name, f in weight_map.items()}
        absent = sorted({str(f) for f in files.values() if not f.is_file()})
        if absent:
            raise FileNotFoundError(
                f"model.args.path: {index} names weights files that are missing: {absent}"
            )
        return files
    single = local / SINGLE_FILE
    if single.is_file():
        from safetensors import safe_open

        with safe_open(str(single), framework="pt") as f:
            return dict.fromkeys(f.keys(), single)
    raise FileNotFoundError(
        f"model.args.path: {local} has no {SINGLE_FILE} nor {INDEX_FILE}; ZeRO-3 loads safetensors weights "
        "(save the model with save_pretrained(..., safe_serialization=True))"
    )


def tied_names(model: nn.Module) -> dict[str, list[str]]:
    """name -> every name of the same tensor (a tied lm_head / embed_tokens weight has two)."""
    by_id: dict[int, list[str]] = {}
    for name, t in [
        *model.named_parameters(remove_duplicate=False),
        *model.named_buffers(remove_duplicate=False),
    ]:
        by_id.setdefault(id(t), []).append(name)
    return {n: names for names in by_id.values() for n in names}


class CheckpointInit:
    """`init_fn(module)` for the stage 3 engine: fill the module's own tensors from the checkpoint files,
    through transformers' conversion mapping (models/hf_mapping.py): a fused MoE tensor is built from its
    per-expert file tensors when its module is materialized, the group's file tensors read just then."""

    def __init__(self, model: nn.Module, files: dict[str, Path]):
        self.files = files
        self.plan = LoadPlan(model, files)
        self.aliases = tied_names(model)
        self.prefix = {id(m): f"{p}." if p else "" for p, m in model.named_modules(remove_duplicate=False)}
        # a bound method keeps the model alive; that is fine, the init lives as long as the model.
        self.init_weights = getattr(model, "_init_weights", None)
        self.loaded_names: list[str] = []
        """Every tensor name read so far, in order (tests check which unit's tensors were read when)."""
        self._ready: dict[str, torch.Tensor] = {}
        """Outputs of a one-to-many group that belong to a module not materialized yet."""
        missing = self.missing(model)
        if missing:
            raise ValueError(
                f"model.args.path: the weights files lack {len(missing)} tensor(s) the model needs "
                f"(names after transformers' conversion mapping): {', '.join(missing[:20])}"
                f"{' ...' if len(missing) > 20 else ''}; is the directory from another model, or does "
                "config.json not match the weights?"
            )

    def source(self, name: str) -> str | None:
        """The model name whose file tensors fill `name` (itself or a tied alias), None when absent."""
        return next((n for n in self.aliases.get(name, [name]) if n in self.plan.by_target), None)

    def missing(self, model: nn.Module) -> list[str]:
        return [n for n in model.state_dict() if self.source(n) is None]

    @torch.no_grad()
    def __call__(self, module: nn.Module) -> None:
        prefix = self.prefix.get(id(module))
        if prefix is None:
            # a module added after the meta build: a container (PEFT's wrappers) has nothing to fill; one with
            # tensors (an adapter) was built on meta too, and by now its params are views into the unit's buffer
            # with no values
            own = [*module._parameters.values(), *module._buffers.values()]
            if not any(t is not None for t in own):
                return
            raise ValueError(
                f"{type(module).__name__} was added to a model built on the meta device (from_pretrained under "
                "stage-3 zerolaunch TrainingArguments, or models.hf.build(meta=True)) and has no values: PEFT's "
                "get_peft_model puts adapters on their base layer's device. Pass peft_config= to the Trainer, "
                "or load the model with `with zerolaunch.hf.plain_from_pretrained(): ...` before adding adapters"
            )
        if module._non_persistent_buffers_set and self.init_weights is not None:
            # rotary inv_freq and the like: computed by the model's own init, not stored in the file.
            self.init_weights(module)
        tensors = [*module._parameters.items()]
        tensors += [(k, b) for k, b in module._buffers.items() if k not in module._non_persistent_buffers_set]
        from safetensors import safe_open

        with contextlib.ExitStack() as stack:
            opened: dict[Path, object] = {}

            def read(file_name: str) -> torch.Tensor:
                path = self.files[file_name]
                if path not in opened:
                    opened[path] = stack.enter_context(safe_open(str(path), framework="pt"))
                return opened[path].get_tensor(file_name)

            for key, t in tensors:
                if t is None:
                    continue
                name = prefix + key
                src = self.source(name)
                if src is None:
                    raise ValueError(f"model.args.path: the weights files lack tensor {name!r}")
                if src not in self._ready:
                    self._ready.update(self.plan.load(self.plan.group_of(src), read))
                value = self._ready.pop(src)
                if tuple(value.shape) != tuple(t.shape):
                    files = sorted({self.files[f].name for f, _ in self.plan.group_of(src).sources})
                    raise ValueError(
                        f"model.args.path: {', '.join(files)} hold(s) {src!r} with shape "
                        f"{tuple(value.shape)}, the model built from config.json wants {tuple(t.shape)}"
                    )
                t.copy_(value)  # converts to t's dtype as it copies: no converted copy of the tensor
                self.loaded_names.append(name)


def build_meta(
    local: Path, transformers, dtype: torch.dtype, extra: dict, *, model_class=None, config=None
) -> nn.Module:
    """The model of `local` on the meta device, with a CheckpointInit as `model.zerolaunch_init_fn`.
    model_class: a PreTrainedModel class (from_pretrained's `cls`), else AutoModelForCausalLM; config: the
    config object to build from, else the folder's config.json."""
    files = weight_files(local)
    if config is None:
        config = transformers.AutoConfig.from_pretrained(str(local), local_files_only=True)
    with torch.device("meta"):
        if model_class is None:
            model = transformers.AutoModelForCausalLM.from_config(config, **extra)
        else:
            model = model_class._from_config(config, **extra)
    model = model.to(dtype)
    # an instance attribute, not a submodule: nn.Module keeps plain callables in __dict__.
    init = CheckpointInit(model, files)
    model.zerolaunch_init_fn = init
    # as from_pretrained does: the transforms that matched are the ones save_pretrained reverses

    if _core() is not None:
        model._weight_conversions = init.plan.used_transforms()
    return model
