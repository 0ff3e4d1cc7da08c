"""convert-checkpoint of a PEFT run (a recipe's `peft:` block): the adapter folder, or the merged model.

The checkpoint's rank 0 extra holds the base model's HF config and the adapter's PeftConfig
(models/peft.py adapter_record), so the PeftModel the run trained is rebuilt here and PEFT does the rest,
as it would after training: `save_pretrained(state_dict=...)` writes the adapter (built on the meta device,
only the adapter's tensors read from the checkpoint), and `merge_and_unload()` folds W + (alpha / r) B @ A
into the base weights, whose `save_pretrained` writes a plain HF folder that AutoModelForCausalLM loads.
The merge holds the whole model in host memory once (the checkpoint's tensors are read into it one by
one); the adapter holds the adapter only. Either output is built under a temp name and renamed into place.
"""

from __future__ import annotations

from pathlib import Path

import torch

from zerolaunch.checkpoint.errors import CheckpointError
from zerolaunch.checkpoint.hf_folder import load_tokenizer
from zerolaunch.checkpoint.hf_out import _config_object
from zerolaunch.checkpoint.peft_adapter import adapter_source_names
from zerolaunch.models.peft import import_peft
from zerolaunch.util.atomic import TMP_PREFIX, fsync_path, publish, remove_path


def write_peft_folder(
    source, out: Path, *, merge: bool, fmt: str, dtype: torch.dtype, max_shard_bytes: int | None
) -> None:
    record, config = source.peft_record(), source.hf_config()
    if config is None:
        raise CheckpointError(f"{source.description} holds a PEFT adapter but no base model config")
    tmp = out.with_name(f"{TMP_PREFIX}{out.name}")
    remove_path(tmp)
    try:
        if merge:
            model = rebuild(config, record, meta=False)
            _load_all(source, model)
            merged = model.merge_and_unload().to(dtype)
            kw = {"safe_serialization": fmt == "safetensors"}
            if max_shard_bytes is not None:
                kw["max_shard_size"] = max_shard_bytes
            merged.save_pretrained(str(tmp), **kw)
        else:
            model = rebuild(config, record, meta=True)
            by_name = {t.name: t for t in source.tensors()}
            state = {n: _read(source, by_name, n, dtype) for n in sorted(adapter_source_names(model))}
            model.save_pretrained(str(tmp), state_dict=state, safe_serialization=fmt == "safetensors")
        tokenizer = source.hf_tokenizer_dir()
        if tokenizer is not None:
            load_tokenizer(tokenizer).save_pretrained(str(tmp))
        for path in tmp.iterdir():
            fsync_path(path)
    except BaseException:
        remove_path(tmp)
        raise
    publish(tmp, out)


def _read(source, by_name: dict, name: str, dtype: torch.dtype) -> torch.Tensor:
    if name not in by_name:
        raise CheckpointError(f"{source.description} has no tensor {name!r}, which the adapter needs")
    tensor = source.read(by_name[name].source)
    return tensor.to(dtype) if tensor.is_floating_point() else tensor


def _load_all(source, model) -> None:
    """Every checkpoint tensor into the rebuilt PeftModel, by name; a name the model lacks, or a param the
    checkpoint lacks, is an error (a checkpoint of another model)."""
    state = model.state_dict()
    seen = set()
    with torch.no_grad():
        for t in source.tensors():
            if t.name not in state:
                raise CheckpointError(
                    f"{source.description}: tensor {t.name!r} is not in the PEFT model rebuilt from the "
                    "checkpoint's configs"
                )
            state[t.name].copy_(source.read(t.source))
            seen.add(t.name)
    missing = sorted(set(state) - seen)
    if missing:
        raise CheckpointError(
            f"{source.description} lacks {len(missing)} tensors of its PEFT model (e.g. {missing[0]!r})"
        )


def rebuild(base_config: dict, adapter: dict, *, meta: bool):
    """The PeftModel a checkpoint was trained as: the HF causal LM of `base_config` (on meta, or on the CPU
    with its init) under the recorded adapter config."""
    peft = import_peft()
    config_class, transformers = _config_object(base_config)
    if config_class is None:
        raise CheckpointError(
            f"the checkpoint's base model type {base_config.get('model_type')!r} is unknown to the installed "
            "transformers, so its PeftModel cannot be rebuilt; install the transformers the run used"
        )
    fields = {k: v for k, v in base_config.items() if k not in ("model_type", "transformers_version")}
    with torch.device("meta" if meta else "cpu"):
        base = transformers.AutoModelForCausalLM.from_config(config_class(**fields))
        config = peft.PeftConfig.from_peft_type(**adapter["config"])
        config.inference_mode = False
        return peft.get_peft_model(base, config)
