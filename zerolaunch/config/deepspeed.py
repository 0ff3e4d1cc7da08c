"""The DeepSpeed config vocabulary zerolaunch accepts, and what each key means here.

Every key of a DeepSpeed block falls in one of three kinds: USE (mapped onto the recipe / engine options by
auto.py and engine.py), `Note` (accepted, does nothing in zerolaunch; the reason is shown in the recipe table)
and `Unsupported` (an error naming the DeepSpeed feature, unless the value is one that turns it off). Anything
else is a misspelling and an error with a did-you-mean, at every level -- DeepSpeed itself silently ignores
unknown top-level keys. This module owns those lists and the name check; it builds no options.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from .errors import RecipeError, did_you_mean, dotted
from .tree import Path, RawTree

USE = "use"


@dataclass(frozen=True)
class Note:
    reason: str
    kind: str | None = None
    """The type DeepSpeed 0.19.8 itself demands (a key of `_NOTE_KINDS`): a key that does nothing here still
    refuses a value DeepSpeed would refuse, so a config that passes here also loads there. None: any."""


def _whole(value: Any) -> bool:
    """An int, or a float with no fraction (DeepSpeed configs write 1e9; pydantic takes it as an int)."""
    if isinstance(value, float):
        return math.isfinite(value) and value.is_integer()
    return isinstance(value, int) and not isinstance(value, bool)


def _fraction(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and 0 <= value <= 1


_NOTE_KINDS: dict[str, tuple[str, Callable[[Any], bool]]] = {
    "bool": ("true or false", lambda v: isinstance(v, bool)),
    "int": ("a whole number", _whole),
    "int_or_null": ("a whole number or null", lambda v: v is None or _whole(v)),
    "fraction": ("a number from 0 to 1", _fraction),
    "bool_or_int": ("true, false or a whole number", lambda v: isinstance(v, bool) or _whole(v)),
    "mapping": ("a mapping", lambda v: isinstance(v, dict)),
}


@dataclass(frozen=True)
class Removed:
    """A key DeepSpeed 0.19.8 itself refuses (the feature was removed there): refused with any value."""

    feature: str


@dataclass(frozen=True)
class Unsupported:
    feature: str
    off: Callable[[Any], bool] = lambda value: False
    """Values that turn the feature off are accepted (with a note) rather than refused."""


def _is(*values: Any) -> Callable[[Any], bool]:
    return lambda value: any(value == v and type(value) is type(v) for v in values)


def _disabled(value: Any) -> bool:
    if value is None or value is False or value == {}:
        return True
    return isinstance(value, dict) and value.get("enabled") is False


PARAM_BUFFER_COUNT = (
    "offload_param on nvme reads each unit's shard into a buffer of its own when the unit is gathered; "
    "there is no pool of staging buffers to size"
)
NO_EFFECT_CKPT = "zerolaunch checkpoints are always elastic (any world size / stage loads)"

OFFLOAD_OPTIMIZER: dict[str, Any] = {
    "device": USE,
    "nvme_path": USE,
    "pin_memory": USE,
    "buffer_count": USE,
    "overlap_step": USE,  # zerolaunch's own: the CPU step overlaps the next forward (stages 1/2)
    "pipeline_read": Note("zerolaunch always overlaps nvme reads with the CPU step", "bool"),
    "pipeline_write": Note("zerolaunch always overlaps nvme writes with the CPU step", "bool"),
    "fast_init": Note("not used by zerolaunch", "bool"),
    "cpuadam_cores_perc": Note("the CPU step uses torch's threads (set OMP_NUM_THREADS)", "fraction"),
    "ratio": Unsupported("partial optimizer offload (offload_optimizer.ratio < 1)", _is(1, 1.0)),
    "super_offload": Unsupported("SuperOffload", _is(False)),
}
OFFLOAD_PARAM: dict[str, Any] = {
    "device": USE,
    "nvme_path": USE,
    "pin_memory": USE,
    "buffer_count": Note(PARAM_BUFFER_COUNT, "int"),
    "buffer_size": Note("zerolaunch sizes its staging buffers from the largest stage-3 unit", "int"),
    "max_in_cpu": Note("not used by zerolaunch", "int"),
}
ZERO: dict[str, Any] = {
    "stage": USE,
    "reduce_bucket_size": USE,
    "allgather_bucket_size": Note(
        "stages 1/2 all-gather the updated params one reduce bucket at a time (reduce_bucket_size)", "int"
    ),
    "overlap_comm": USE,
    "contiguous_gradients": Note("gradients are always reduced into contiguous flat buckets", "bool"),
    "stage3_prefetch_bucket_size": USE,
    "stage3_param_persistence_threshold": USE,
    "stage3_max_live_parameters": USE,
    "stage3_max_reuse_distance": USE,
    "stage3_gather_16bit_weights_on_model_save": USE,
    "stage3_gather_fp16_weights_on_model_save": USE,  # DeepSpeed's deprecated spelling of the key above
    "stage3_units": USE,
    "offload_optimizer": OFFLOAD_OPTIMIZER,
    "offload_param": OFFLOAD_PARAM,
    "reduce_scatter": Note("zerolaunch always reduce-scatters gradients into their owners' shards", "bool"),
    "allgather_partitions": Note("zerolaunch always all-gathers updated shards", "bool"),
    "round_robin_gradients": Note("every rank owns one contiguous slice of each bucket", "bool"),
    "sub_group_size": Note("the optimizer steps bucket by bucket", "int"),
    "elastic_checkpoint": Note(NO_EFFECT_CKPT, "bool"),
    "load_from_fp32_weights": Note("zerolaunch always resumes from the fp32 master weights", "bool"),
    "ignore_unused_parameters": Note("unused parameters are always allowed (their grads are zero)", "bool"),
    "use_multi_rank_bucket_allreduce": Note("not used by zerolaunch", "bool"),
    "zeropp_loco_param": Removed("LoCo-ZeRO++ (zero_optimization.zeropp_loco_param)"),
    "stage3_model_persistence_threshold": Note("only stage3_param_persistence_threshold applies", "int"),
    "stage3_module_granularity_threshold": Note(
        "stage 3 units are repeated blocks (see stage3_units)", "int"
    ),
    "stage3_use_all_reduce_for_fetch_params": Note("stage 3 always all-gathers", "bool"),
    "stage3_allgather_sequential": Note("not used by zerolaunch", "bool"),
    "memory_efficient_linear": Note("not used by zerolaunch", "bool"),
    "override_module_apply": Note("not used by zerolaunch", "bool"),
    "log_trace_cache_warnings": Note("not used by zerolaunch", "bool"),
    "enable_sanity_checks": Note("not used by zerolaunch", "bool"),
    "parameter_alignment": Note("not used by zerolaunch", "bool"),
    "pipeline_loading_checkpoint": Note("not used by zerolaunch", "bool"),
    "compute_grad_norm": Unsupported("skipping the gradient norm (compute_grad_norm: false)", _is(True)),
    "legacy_stage1": Unsupported("legacy stage 1", _is(False)),
    "zero_quantized_weights": Unsupported("ZeRO++ quantized weights (zero_quantized_weights)", _is(False)),
    "zero_quantized_nontrainable_weights": Unsupported(
        "ZeRO++ quantized weights (zero_quantized_nontrainable_weights)", _is(False)
    ),
    "zero_quantized_gradients": Unsupported(
        "ZeRO++ quantized gradients (zero_quantized_gradients)", _is(False)
    ),
    "zero_hpz_partition_size": Unsupported(
        "ZeRO++ hierarchical partitioning (zero_hpz_partition_size)", _is(1)
    ),
    "mics_shard_size": Unsupported("MiCS (mics_shard_size)", _is(-1)),
    "mics_hierarchical_params_gather": Unsupported("MiCS (mics_hierarchical_params_gather)", _is(False)),
    "zenflow": Unsupported("ZenFlow", _disabled),
    "leaf_module": Unsupported("ZeRO-3 leaf modules (use zero_optimization.stage3_units)", _disabled),
    # cpu_offload / cpu_offload_param: true are mapped to offload_* {device: cpu} by load.py, noted.
    "cpu_offload": Unsupported(
        "the deprecated cpu_offload flag (use offload_optimizer: {device: cpu})", _is(False)
    ),
    "cpu_offload_param": Unsupported(
        "the deprecated cpu_offload_param flag (use offload_param: {device: cpu})", _is(False)
    ),
    "cpu_offload_use_pin_memory": Unsupported(
        "the deprecated cpu_offload_use_pin_memory flag (use offload_*.pin_memory)", _is(False)
    ),
}
FP16: dict[str, Any] = {
    "enabled": USE,
    "loss_scale": USE,
    "initial_scale_power": USE,
    "loss_scale_window": USE,
    "hysteresis": USE,
    "min_loss_scale": USE,
    "auto_cast": Unsupported("fp16 auto_cast of the model inputs", _is(False)),
    "consecutive_hysteresis": Unsupported("consecutive_hysteresis", _is(False)),
    "fp16_master_weights_and_grads": Unsupported(
        "fp16 master weights (fp16_master_weights_and_grads)", _is(False)
    ),
}
BF16: dict[str, Any] = {
    "enabled": USE,
    "immediate_grad_update": Note("grads are reduced into fp32 buckets", "bool"),
    "check_grad_overflow": Note("bf16 needs no loss scaling; overflow is never checked", "bool"),
    # both true: pure bf16 (engine precision.master_dtype bf16); config/engine_options.py checks the pair
    "bf16_master_weights_and_grads": USE,
    "bf16_optimizer_states": USE,
}
OPTIMIZER: dict[str, Any] = {
    "type": USE,
    "params": USE,
    "legacy_fusion": Note("not used by zerolaunch", "bool"),
}
SCHEDULER: dict[str, Any] = {"type": USE, "params": USE}

_OFF_BLOCK = _disabled
TOP: dict[str, Any] = {
    "train_batch_size": USE,
    "train_micro_batch_size_per_gpu": USE,
    "gradient_accumulation_steps": USE,
    "optimizer": OPTIMIZER,
    "scheduler": SCHEDULER,
    "gradient_clipping": USE,
    "zero_optimization": ZERO,
    "bf16": BF16,
    "fp16": FP16,
    "communication_data_type": USE,
    "zero_allow_untested_optimizer": Note(
        "zerolaunch shards any of its optimizers; nothing to allow", "bool"
    ),
    "zero_force_ds_cpu_optimizer": Note("offload always steps with torch's CPU optimizer", "bool"),
    "steps_per_print": Note("zerolaunch prints a progress line every train.log_every steps", "int_or_null"),
    "wall_clock_breakdown": Note("zerolaunch always reports step and communication time", "bool"),
    "memory_breakdown": Note("zerolaunch always reports memory per rank", "bool"),
    "dump_state": Note("not used by zerolaunch", "bool"),
    "dataloader_drop_last": Note("data comes from data.builder", "bool"),
    "timers": Note("not used by zerolaunch", "mapping"),
    "checkpoint": Note(NO_EFFECT_CKPT + "; use the recipe's checkpoint section", "mapping"),
    "aio": Note("nvme offload uses plain file I/O", "mapping"),
    "disable_python_gc": Note("not used by zerolaunch", "bool_or_int"),
    "prescale_gradients": Unsupported("prescale_gradients", _is(False)),
    "gradient_predivide_factor": Unsupported("gradient_predivide_factor", _is(1, 1.0)),
    "gradient_allreduce_op": Unsupported("gradient_allreduce_op", _is("mean")),
    "disable_allgather": Unsupported("disable_allgather", _is(False)),
    "seq_parallel_communication_data_type": Unsupported("sequence parallelism", _is("fp32")),
    "activation_checkpointing": Unsupported(
        "activation_checkpointing block (use train.activation_checkpointing: true)", _OFF_BLOCK
    ),
    "flops_profiler": Unsupported("flops_profiler (zerolaunch reports MFU itself)", _OFF_BLOCK),
    # Written by rank 0 (report/monitors.py); config/monitors.py resolves the blocks.
    "tensorboard": {"enabled": USE, "output_path": USE, "job_name": USE},
    "csv_monitor": {"enabled": USE, "output_path": USE, "job_name": USE},
    "wandb": {"enabled": USE, "group": USE, "team": USE, "project": USE},
    "comet": Unsupported("comet monitor (zerolaunch writes metrics.jsonl)", _OFF_BLOCK),
    "comms_logger": Unsupported("comms_logger (zerolaunch reports communication itself)", _OFF_BLOCK),
    "amp": Unsupported("amp (use bf16 or fp16)", _OFF_BLOCK),
    "torch_autocast": Unsupported("torch_autocast (use bf16 or fp16)", _OFF_BLOCK),
    "data_types": Unsupported("data_types", _OFF_BLOCK),
    "pipeline": Unsupported("pipeline parallelism", _OFF_BLOCK),
    "sparse_attention": Unsupported("sparse_attention", _OFF_BLOCK),
    "compression_training": Unsupported("compression_training", _OFF_BLOCK),
    "data_efficiency": Unsupported("data_efficiency", _OFF_BLOCK),
    "curriculum_learning": Unsupported("curriculum_learning", _OFF_BLOCK),
    "autotuning": Unsupported("autotuning", _OFF_BLOCK),
    "elasticity": Unsupported("elasticity (zerolaunch uses torch elastic restarts instead)", _OFF_BLOCK),
    "hybrid_engine": Unsupported("hybrid_engine", _OFF_BLOCK),
    "weight_quantization": Unsupported("weight_quantization", _OFF_BLOCK),
    "compile": Unsupported("compile", _OFF_BLOCK),
    "tensor_parallel": Unsupported("tensor parallelism", _OFF_BLOCK),
    "expert_parallel": Unsupported("expert parallelism", _OFF_BLOCK),
    "moe": Unsupported("mixture of experts", _OFF_BLOCK),
    "nebula": Unsupported("nebula checkpointing", _OFF_BLOCK),
    "datastates_ckpt": Unsupported("DataStates checkpointing", _OFF_BLOCK),
    "progressive_layer_drop": Removed("Progressive Layer Dropping (progressive_layer_drop)"),
    "quantize_training": Removed("Mixture-of-Quantization (quantize_training)"),
    "eigenvalue": Removed("eigenvalue-based MoQ (eigenvalue)"),
    "sparse_gradients": Removed("sparse embedding gradients (sparse_gradients)"),
    "graph_harvesting": Removed("graph harvesting (graph_harvesting)"),
}

# DeepSpeed's pydantic ZeRO model (runtime/zero/config.py, populate_by_name) accepts each stage3_* key under its
# field name too; load.py renames these to the prefixed key and notes it.
ZERO_FIELD_NAMES = {
    "prefetch_bucket_size": "stage3_prefetch_bucket_size",
    "param_persistence_threshold": "stage3_param_persistence_threshold",
    "model_persistence_threshold": "stage3_model_persistence_threshold",
    "max_live_parameters": "stage3_max_live_parameters",
    "max_reuse_distance": "stage3_max_reuse_distance",
    "gather_16bit_weights_on_model_save": "stage3_gather_16bit_weights_on_model_save",
    "module_granularity_threshold": "stage3_module_granularity_threshold",
    "use_all_reduce_for_fetch_params": "stage3_use_all_reduce_for_fetch_params",
    "allgather_sequential": "stage3_allgather_sequential",
}

OPTIMIZER_TYPES = {"adam": "adam", "adamw": "adamw", "sgd": "sgd"}
UNSUPPORTED_OPTIMIZERS = {
    "lamb": "Lamb",
    "onebitadam": "OneBitAdam",
    "onebitlamb": "OneBitLamb",
    "zerooneadam": "ZeroOneAdam",
    "adagrad": "Adagrad",
    "lion": "Lion",
    "muon": "Muon",
    "muadam": "MuAdam",
    "muadamw": "MuAdamW",
    "musgd": "MuSGD",
    "fusedadam": "FusedAdam",
    "cpuadam": "DeepSpeedCPUAdam",
}
_ADAM_PARAMS: dict[str, Any] = {
    "lr": USE,
    "betas": USE,
    "eps": USE,
    "weight_decay": USE,
    "adam_w_mode": USE,
    "torch_adam": Note("zerolaunch always runs torch's Adam/AdamW (fused where available)", "bool"),
    # passed on to torch.optim.AdamW by DeepSpeed with torch_adam: zerolaunch's step is the fused arithmetic
    "fused": Unsupported("torch's unfused Adam/AdamW (fused: false)", _is(True)),
    "amsgrad": Unsupported("AMSGrad", _is(False)),
    "bias_correction": Unsupported("Adam without bias correction", _is(True)),
}
OPTIMIZER_PARAMS = {
    "adam": _ADAM_PARAMS,
    "adamw": _ADAM_PARAMS,
    "sgd": {
        "lr": USE,
        "momentum": USE,
        "weight_decay": USE,
        "nesterov": Unsupported("Nesterov SGD", _is(False)),
        "dampening": Unsupported("SGD dampening", _is(0, 0.0)),
    },
}
SCHEDULER_TYPES = ("WarmupLR", "WarmupDecayLR", "WarmupCosineLR", "cosine")
UNSUPPORTED_SCHEDULERS = {"onecycle": "OneCycle", "lrrangetest": "LRRangeTest"}
_LAST = Note("zerolaunch resumes the schedule from the checkpoint's step", "int")
SCHEDULER_PARAMS = {
    "WarmupLR": ("warmup_min_lr", "warmup_max_lr", "warmup_num_steps", "warmup_type"),
    "WarmupDecayLR": ("warmup_min_lr", "warmup_max_lr", "warmup_num_steps", "warmup_type", "total_num_steps"),
    "WarmupCosineLR": (
        "total_num_steps",
        "warmup_min_ratio",
        "warmup_num_steps",
        "cos_min_ratio",
        "warmup_type",
    ),
    "cosine": ("warmup_num_steps", "total_num_steps", "cos_min_ratio", "warmup_type"),
}


def optimizer_name(tree: RawTree, ds: Path) -> str | None:
    """adam / adamw / sgd for the block's `type` (case-insensitive, as DeepSpeed), None without a block."""
    path = ds + ("optimizer", "type")
    if not tree.has(ds + ("optimizer",)):
        return None
    raw = tree.get(path)
    if not isinstance(raw, str):
        raise RecipeError(
            f"{tree.where(path)}: `{tree.key(path)}` must name the optimizer (Adam, AdamW or SGD), got {raw!r}."
        )
    key = raw.lower()
    if key in UNSUPPORTED_OPTIMIZERS:
        raise RecipeError(
            f"{tree.where(path)}: `{tree.key(path)}` {raw!r}: DeepSpeed's {UNSUPPORTED_OPTIMIZERS[key]} optimizer "
            "is not supported by zerolaunch. Use Adam, AdamW or SGD."
        )
    if key not in OPTIMIZER_TYPES:
        raise RecipeError(
            f"{tree.where(path)}: unknown optimizer type {raw!r} in `{tree.key(path)}`."
            + did_you_mean(raw, ["Adam", "AdamW", "SGD"])
        )
    return OPTIMIZER_TYPES[key]


def scheduler_name(tree: RawTree, ds: Path) -> str | None:
    path = ds + ("scheduler", "type")
    if not tree.has(ds + ("scheduler",)):
        return None
    raw = tree.get(path)
    if isinstance(raw, str) and raw.lower() in UNSUPPORTED_SCHEDULERS:
        raise RecipeError(
            f"{tree.where(path)}: `{tree.key(path)}` {raw!r}: DeepSpeed's {UNSUPPORTED_SCHEDULERS[raw.lower()]} "
            f"scheduler is not supported by zerolaunch. Use one of {', '.join(SCHEDULER_TYPES)}."
        )
    by_lower = {t.lower(): t for t in SCHEDULER_TYPES}
    if not isinstance(raw, str) or raw.lower() not in by_lower:
        raise RecipeError(
            f"{tree.where(path)}: unknown scheduler type {raw!r} in `{tree.key(path)}`."
            + did_you_mean(str(raw), SCHEDULER_TYPES)
        )
    return by_lower[raw.lower()]


def check_names(tree: RawTree, ds: Path, notes: dict[str, str]) -> None:
    """Refuse misspelled and unsupported keys anywhere in the DeepSpeed block; note the no-effect ones."""
    _check_block(tree, ds, TOP, notes)
    optimizer = optimizer_name(tree, ds)
    if optimizer is not None:
        _check_block(tree, ds + ("optimizer", "params"), OPTIMIZER_PARAMS[optimizer], notes)
    scheduler = scheduler_name(tree, ds)
    if scheduler is not None:
        params = {key: USE for key in SCHEDULER_PARAMS[scheduler]}
        params["last_batch_iteration"] = _LAST
        _check_block(tree, ds + ("scheduler", "params"), params, notes)


def _check_block(tree: RawTree, path: Path, vocabulary: dict[str, Any], notes: dict[str, str]) -> None:
    block = tree.get(path)
    if block is None or not isinstance(block, dict):
        if tree.has(path) and block is not None and isinstance(vocabulary, dict) and path[-1] != "deepspeed":
            raise RecipeError(
                f"{tree.where(path)}: `{tree.key(path)}` must be a mapping of DeepSpeed keys, got {block!r}."
            )
        return
    for key, value in block.items():
        sub = path + (key,)
        kind = vocabulary.get(key)
        if kind is None:
            hint = ""
            if len(path) == 1:
                hint = " (DeepSpeed would silently ignore it; zerolaunch refuses so that a typo cannot change the run.)"
            raise RecipeError(
                f"{tree.where(sub)}: unknown DeepSpeed key `{tree.key(sub)}`."
                + did_you_mean(key, vocabulary)
                + hint
            )
        if isinstance(kind, Removed):
            raise RecipeError(
                f"{tree.where(sub)}: `{tree.key(sub)}`: DeepSpeed 0.19.8 removed {kind.feature} and refuses this "
                "key itself; zerolaunch has no such feature either. Remove the key."
            )
        if isinstance(kind, Note):
            if kind.kind is not None:
                expected, holds = _NOTE_KINDS[kind.kind]
                if not holds(value):
                    raise RecipeError(
                        f"{tree.where(sub)}: `{tree.key(sub)}` must be {expected} (DeepSpeed's type for it), "
                        f"got {value!r}. It has no effect in zerolaunch, so you may also remove it."
                    )
            notes[dotted(sub)] = f"{_json(value)} accepted, no effect: {kind.reason}"
        elif isinstance(kind, Unsupported):
            if not kind.off(value):
                raise RecipeError(
                    f"{tree.where(sub)}: DeepSpeed's {kind.feature} is not supported by zerolaunch "
                    f"(`{tree.key(sub)}` = {value!r}). Remove the key."
                )
            notes[dotted(sub)] = f"{_json(value)} accepted: it keeps the unsupported feature off"
        elif isinstance(kind, dict):
            _check_block(tree, sub, kind, notes)


def _json(value: Any) -> str:
    try:
        return json.dumps(value)
    except (TypeError, ValueError):
        return repr(value)
