"""A PEFT adapter folder (`adapter_config.json` + `adapter_model.safetensors`) from a model the engine trains.

A PeftModel's `save_pretrained` writes only the adapter: the tensors PEFT's `get_peft_model_state_dict`
selects (LoRA A/B, modules_to_save copies, ...), with the adapter name (`.default`) removed from the keys.
Under ZeRO-3 the model's own tensors are shards, so, as transformers' Trainer does under DeepSpeed ZeRO-3
(`accelerator.get_state_dict`, then `save_pretrained(state_dict=...)`), the adapter's tensors are gathered
first and handed to PEFT's own `save_pretrained`, which names, filters and writes them as it always does.
Only the adapter's tensors are kept on rank 0: which ones is asked of PEFT up front, with a placeholder per
state_dict entry, so the base model's weights pass through the gather and are dropped at once.

peft is imported only when a PeftModel is in hand (it is then imported already).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from pathlib import Path

import torch

from zerolaunch.checkpoint.contract import ParamSpecLike
from zerolaunch.checkpoint.hf_folder import load_tokenizer
from zerolaunch.models.peft import is_peft_model
from zerolaunch.util.atomic import TMP_PREFIX, fsync_path, publish, remove_path
from zerolaunch.zero import comm

__all__ = ["adapter_source_names", "is_peft_model", "save_peft_adapter"]


def adapter_source_names(model) -> set[str]:
    """The model's state_dict names whose tensors PEFT saves, for every adapter the model holds.

    Asked of `get_peft_model_state_dict` itself, with one distinct empty placeholder per name: the
    placeholders it returns are the tensors it would save (its selection is by key), so PEFT's rules stay
    PEFT's, for every tuner type."""
    from peft import get_peft_model_state_dict

    names = list(model.state_dict(keep_vars=True))
    placeholders = {name: torch.empty(0) for name in names}
    by_id = {id(t): name for name, t in placeholders.items()}
    wanted: set[str] = set()
    for adapter in model.peft_config:
        selected = get_peft_model_state_dict(model, state_dict=placeholders, adapter_name=adapter)
        wanted.update(by_id[id(t)] for t in selected.values() if id(t) in by_id)
    return wanted


def save_peft_adapter(
    model,
    full_state: Iterable[tuple[str, torch.Tensor]],
    param_specs: Sequence[ParamSpecLike],
    group,
    out_dir,
    *,
    tokenizer=None,
) -> Path:
    """COLLECTIVE: write what `PeftModel.save_pretrained(out_dir)` writes, from the engine's full tensors.

    `full_state` is the engine's iter_full_state(dtype) (the dtype of the written tensors), which every rank
    iterates (at stage 3 it gathers unit by unit); `param_specs` its param_specs() (for tied aliases); `group`
    its process group. Rank 0 keeps a copy of the adapter's tensors only and hands them to the model's own
    save_pretrained, into a temp folder that is renamed into place (a reader sees the previous folder or the
    whole new one). tokenizer: a tokenizer or processor, or a folder holding one, written in by its own
    save_pretrained."""
    rank0 = comm.rank(group) == 0
    wanted = adapter_source_names(model)
    # a tied alias is yielded once, under its source's name
    source_of = {alias: spec.name for spec in param_specs for alias in spec.aliases}
    sources = {source_of.get(n, n): n for n in wanted}
    kept: dict[str, torch.Tensor] = {}
    for name, tensor in full_state:
        if rank0 and name in sources:
            # a copy: a gathered tensor may be a view of a buffer the next gather overwrites
            kept[sources[name]] = tensor.detach().to("cpu", copy=True)
    out = Path(out_dir)
    if rank0:
        tmp = out.with_name(f"{TMP_PREFIX}{out.name}")
        out.parent.mkdir(parents=True, exist_ok=True)
        remove_path(tmp)
        try:
            model.save_pretrained(str(tmp), state_dict=kept, is_main_process=True)
            if tokenizer is not None:
                _save_tokenizer(tokenizer, tmp)
            for path in tmp.iterdir():
                fsync_path(path)
            publish(tmp, out)
        except BaseException:
            remove_path(tmp)
            raise
    comm.barrier(group)
    return out


def _save_tokenizer(tokenizer, folder: Path) -> None:
    if not hasattr(tokenizer, "save_pretrained"):
        tokenizer = load_tokenizer(Path(tokenizer))
    tokenizer.save_pretrained(str(folder))
