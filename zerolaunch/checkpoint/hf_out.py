"""What a Hugging Face model folder holds besides the weights, as `model.save_pretrained` writes it.

Shared by `convert-checkpoint` (from the config dict rank 0 saved) and `api.save_hf_pretrained` (from the live
model): config.json with `architectures` and `dtype` set and the training-time `use_cache: false` (models/hf.py
sets it for training) put back to the config class's default, generation_config.json for models that
generate, which tied aliases to leave out (HF re-ties them on load, and save_pretrained stores them once), and
the index's metadata. transformers is imported only when a folder is written.

Also the weights' names and files as save_pretrained writes them: `save_plan` reverses transformers'
conversion mapping (fused MoE experts back to per-expert tensors, `lm_head` back to GPT-NeoX's `embed_out`;
models/hf_mapping.py), and `plan_shards` runs huggingface_hub's `split_torch_state_dict_into_shards` (the
function save_pretrained calls) over meta tensors of the output's shapes and dtypes, so the files split
where save_pretrained's do without any tensor in memory; the default size is save_pretrained's own default.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from zerolaunch.models.hf import _transformers
from zerolaunch.models.hf_mapping import SavePlan
from zerolaunch.util.atomic import write_text_atomic


def _config_object(config: dict):
    transformers = _transformers()
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    model_type = config.get("model_type")
    if model_type not in CONFIG_MAPPING:
        return None, transformers
    return CONFIG_MAPPING[model_type], transformers


def _causal_lm_class_name(model_type: str | None) -> str | None:
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    return MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.get(model_type) if model_type else None


def output_config(config: dict, weights_dtype: torch.dtype | None, architecture: str | None = None) -> dict:
    """config.json's dict: `architectures` (the live model's class, else the model type's causal LM class),
    `dtype` of the written weights, and `use_cache` back at the config class's default. For a model type
    this transformers knows, the dict goes through its config class and `to_json_string(use_diff=True)`, which
    is what save_pretrained writes (it drops `_name_or_path` and the like)."""
    out = dict(config)
    config_class, _ = _config_object(out)
    if architecture is not None:
        out["architectures"] = [architecture]
    elif not out.get("architectures"):
        name = _causal_lm_class_name(out.get("model_type"))
        if name is not None:
            out["architectures"] = [name]
    dtype_name = None if weights_dtype is None else str(weights_dtype).removeprefix("torch.")
    if config_class is None:
        if dtype_name is not None:
            # transformers 5 writes "dtype", 4.x "torch_dtype"; set whichever this config has (both if neither).
            for key in [k for k in ("dtype", "torch_dtype") if k in out] or ["dtype", "torch_dtype"]:
                out[key] = dtype_name
        return out
    fields = {
        k: v for k, v in out.items() if k not in ("model_type", "transformers_version", "_name_or_path")
    }
    if dtype_name is not None:
        fields.pop("torch_dtype", None)
        fields["dtype"] = dtype_name
    default_use_cache = getattr(config_class(), "use_cache", None)
    if default_use_cache is not None:
        fields["use_cache"] = default_use_cache
    return _keys_older_transformers_read(
        json.loads(config_class(**fields).to_json_string(use_diff=True)), config_class
    )


def _keys_older_transformers_read(out: dict, config_class) -> dict:
    """config.json plus the keys under which transformers 4.x reads what 5.x stores under a new name, so a
    4.x from_pretrained builds the same model: a field 5.x declares but stores through `attribute_map`
    (Qwen3-MoE's num_experts -> num_local_experts; without it 4.57 builds 128 experts), and `rope_theta`,
    which 5.x keeps only inside `rope_parameters` (4.x would fall back to its default theta). transformers
    5 reads both spellings to the same values."""
    import inspect

    declared = set(getattr(config_class, "__dataclass_fields__", {}))
    declared |= set(inspect.signature(config_class.__init__).parameters)
    for alias, target in getattr(config_class, "attribute_map", {}).items():
        if alias in declared and alias not in out and target in out:
            out[alias] = out[target]
    rope = out.get("rope_parameters")
    if isinstance(rope, dict) and "rope_theta" in rope and "rope_theta" not in out:
        out["rope_theta"] = rope["rope_theta"]
    return out


def generation_config_dict(config: dict, live_model=None) -> dict | None:
    """generation_config.json's dict, as save_pretrained writes it for a model that can generate."""
    config_class, transformers = _config_object(config)
    if live_model is not None:
        gen = getattr(live_model, "generation_config", None)
        can = getattr(live_model, "can_generate", lambda: False)()
        if gen is None or not can:
            return None
    else:
        if config_class is None or _causal_lm_class_name(config.get("model_type")) is None:
            return None
        fields = {k: v for k, v in config.items() if k not in ("model_type", "transformers_version")}
        gen = transformers.GenerationConfig.from_model_config(config_class(**fields))
    return json.loads(gen.to_json_string(use_diff=True))


def tied_aliases_to_drop(config: dict | None, aliases: list[str]) -> set[str]:
    """Aliases of a tied weight (e.g. lm_head.weight) that save_pretrained leaves out; none for non-HF output
    or a config that unties them (then HF would not re-tie on load, so the copy must stay)."""
    if config is None or not config.get("tie_word_embeddings", True):
        return set()
    return set(aliases)


def meta_model(config: dict | None):
    """The causal LM of an HF config dict on the meta device (no memory), to read its conversion mapping;
    None for a config this transformers cannot build."""
    if config is None:
        return None
    config_class, transformers = _config_object(config)
    if config_class is None:
        return None
    fields = {k: v for k, v in config.items() if k not in ("model_type", "transformers_version")}
    try:
        with torch.device("meta"):
            return transformers.AutoModelForCausalLM.from_config(config_class(**fields))
    except (ValueError, KeyError, TypeError):
        return None  # not a causal LM: its names are written as they are


def save_plan(model, names: list[str]):
    """models/hf_mapping.SavePlan of `names` (in-memory names, tied aliases already dropped), listed in the
    model's state_dict order as save_pretrained lists them; the identity for no model."""
    if model is None:
        return SavePlan(None, names)
    order = {n: i for i, n in enumerate(model.state_dict())}
    return SavePlan(model, sorted(names, key=lambda n: order.get(n, len(order))))


def default_max_shard_size(hf_model: bool) -> int | str:
    """save_pretrained's default max_shard_size in the installed transformers ("50GB" in 5.x) for an HF
    model; for other weights huggingface_hub's own default (no transformers import: convert of a plain
    checkpoint stays light)."""
    import inspect

    if hf_model:
        fn = _transformers().PreTrainedModel.save_pretrained
    else:
        from huggingface_hub import split_torch_state_dict_into_shards as fn
    return inspect.signature(fn).parameters["max_shard_size"].default


def plan_shards(
    outputs: dict[str, torch.Tensor], max_shard_bytes: int | None, *, hf_model: bool = True
) -> list[list[str]]:
    """Names per weight file, as save_pretrained splits them: huggingface_hub's
    split_torch_state_dict_into_shards over `outputs` (meta tensors: only sizes count), at
    `max_shard_bytes` or the default (default_max_shard_size)."""
    from huggingface_hub import split_torch_state_dict_into_shards

    size = default_max_shard_size(hf_model) if max_shard_bytes is None else max_shard_bytes
    split = split_torch_state_dict_into_shards(outputs, max_shard_size=size)
    return [list(names) for names in split.filename_to_tensors.values()]


def index_dict(weight_map: dict[str, str], total_bytes: int, total_numel: int) -> dict:
    return {
        "metadata": {"total_parameters": total_numel, "total_size": total_bytes},
        "weight_map": dict(sorted(weight_map.items())),
    }


def write_side_files(
    folder: Path,
    config: dict,
    weights_dtype: torch.dtype | None,
    *,
    architecture: str | None = None,
    live_model=None,
) -> None:
    """config.json and (when the model generates) generation_config.json into `folder`."""
    folder = Path(folder)
    out_config = output_config(config, weights_dtype, architecture)
    write_text_atomic(folder / "config.json", json.dumps(out_config, indent=2, sort_keys=True) + "\n")
    gen = generation_config_dict(out_config, live_model)
    if gen is not None:
        write_text_atomic(folder / "generation_config.json", json.dumps(gen, indent=2, sort_keys=True) + "\n")
