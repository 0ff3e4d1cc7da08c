"""Assembly of `zerolaunch.zero.options.EngineOptions` from the resolved train section and the DeepSpeed block.

With no DeepSpeed block the engine takes zerolaunch's defaults (ZeRO stage 1) and the train section. With
one, DeepSpeed's defaults apply where a key is absent (stage 0, overlap_comm on for stage 3 only, pinned
offload buffers, WarmupLR's 1000 warmup steps and 0.001 peak), as a DeepSpeed user expects. Bucket "auto"s
come from the hidden size h as in Hugging Face: reduce h*h, stage-3 prefetch 0.9*h*h, persistence 10*h (h
from config/hidden.py, or the model a caller hands over). This module owns that mapping. The engine's rules
(stage range, offload_param needs stage 3, ...) are not repeated here: `resolve_engine_options` runs
zero/option_rules.py's `option_problems` on the options it built and reports the first at the key the user
wrote (its file and line or --set flag), so the recipe check and the engine's cannot drift. What stays here is
the recipe's own: types, choices, "auto" and the limits no engine rule has.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from zerolaunch.zero.options import COMM_DTYPES

from .deepspeed import optimizer_name, scheduler_name
from .errors import RecipeError
from .hidden import ModelHidden, hidden_size
from .schema import TrainSection
from .tree import Path
from .values import DS, Resolver

if TYPE_CHECKING:
    from zerolaunch.zero.option_rules import OptionProblem
    from zerolaunch.zero.options import EngineOptions, OffloadOptions, ZeroOptions

Z: Path = DS + ("zero_optimization",)


def resolve_engine_options(
    r: Resolver, train: TrainSection, model: ModelHidden | None = None
) -> EngineOptions:
    """The engine's options of the recipe; `model`: the hidden size of the model a caller trains, for the
    bucket "auto"s, in place of the recipe's model section."""
    from zerolaunch.zero.options import EngineOptions, OptimizerOptions, PrecisionOptions

    # A block made only by --set keeps zerolaunch's defaults: `--set zero_optimization.x=...` must not
    # silently drop the stage to DeepSpeed's 0.
    has_ds = isinstance(r.raw(DS), dict) and r.tree.from_file(DS)
    zero = _zero(r, has_ds, model)
    fp16: Path = DS + ("fp16",)
    k = "engine.precision."
    precision = PrecisionOptions(
        dtype=train.precision,
        master_dtype=_master_dtype(r, train),
        communication_dtype=r.value(
            k + "communication_dtype", DS + ("communication_data_type",), "choice", None, choices=COMM_DTYPES
        ),
        # their limits are the engine's rules (zero/option_rules.py), checked on the built options
        loss_scale=r.value(k + "loss_scale", fp16 + ("loss_scale",), "float", 0.0),
        initial_scale_power=r.value(k + "initial_scale_power", fp16 + ("initial_scale_power",), "int", 16),
        loss_scale_window=r.value(k + "loss_scale_window", fp16 + ("loss_scale_window",), "int", 1000),
        hysteresis=r.value(k + "hysteresis", fp16 + ("hysteresis",), "int", 2),
        min_loss_scale=r.value(k + "min_loss_scale", fp16 + ("min_loss_scale",), "float", 1.0),
    )
    name = optimizer_name(r.tree, DS) or "adamw"
    params: Path = DS + ("optimizer", "params")
    if name == "adam":
        # DeepSpeed's "Adam" is AdamW unless adam_w_mode is false.
        w_mode = r.value("engine.optimizer.adam_w_mode", params + ("adam_w_mode",), "bool", True)
        name = "adamw" if w_mode else "adam"
        r.notes.setdefault(
            "engine.optimizer.name", f"DeepSpeed's Adam with adam_w_mode {str(w_mode).lower()}"
        )
        r.origins.pop("engine.optimizer.adam_w_mode", None)
    r.record(
        "engine.optimizer.name",
        r.tree.origin(DS + ("optimizer", "type")) if r.given(DS + ("optimizer",)) else "default",
    )
    momentum = 0.0
    if name == "sgd":
        momentum = r.value("engine.optimizer.momentum", params + ("momentum",), "float", 0.0)
    else:
        r.record("engine.optimizer.momentum", "default", "SGD only")
    r.record(
        "engine.optimizer.decay_1d",
        r.origins.get("train.weight_decay_1d", "default"),
        "= train.weight_decay_1d",
    )
    optimizer = OptimizerOptions(
        name=name,
        lr=train.lr,
        betas=train.betas,
        eps=train.eps,
        weight_decay=train.weight_decay,
        decay_1d=train.weight_decay_1d,
        momentum=momentum,
    )
    options = EngineOptions(
        zero=zero,
        precision=precision,
        optimizer=optimizer,
        scheduler=_scheduler(r, train),
        gradient_clipping=train.gradient_clipping,
        gradient_accumulation_steps=train.gradient_accumulation_steps,
    )
    check_engine_options(r, options)
    return options


def _master_dtype(r: Resolver, train: TrainSection) -> str:
    """DeepSpeed's bf16.bf16_master_weights_and_grads + bf16.bf16_optimizer_states, both true: a bf16 master and
    bf16 optimizer state (pure bf16; [Note: bf16 master] in zero/optim/shard_optimizer.py). DeepSpeed refuses
    the optimizer states without the master; the master alone it keeps with fp32 states on the CPU
    (ZeRO-Offload and DeepSpeedCPUAdam), which zerolaunch does not: refused, naming both ways out."""
    bf16: Path = DS + ("bf16",)
    master_path, states_path = bf16 + ("bf16_master_weights_and_grads",), bf16 + ("bf16_optimizer_states",)
    key = "engine.precision.master_dtype"
    master = r.value(key, master_path, "bool", False)
    states = r.value("engine.precision.bf16_optimizer_states", states_path, "bool", False)
    r.origins.pop("engine.precision.bf16_optimizer_states", None)
    if states and not master:
        raise r.fail(
            states_path,
            "is true, but bf16_master_weights_and_grads is not (DeepSpeed refuses this too)",
            "Set bf16_master_weights_and_grads: true as well (pure bf16), or remove bf16_optimizer_states",
        )
    if master and not states:
        raise r.fail(
            master_path,
            "is true without bf16_optimizer_states: DeepSpeed then keeps fp32 optimizer states on the CPU "
            "(ZeRO-Offload, DeepSpeedCPUAdam), which zerolaunch does not",
            "Set bf16_optimizer_states: true as well (pure bf16 on the GPU), or remove both for an fp32 master",
        )
    if not master:
        return "fp32"
    if train.precision != "bf16":
        raise r.fail(
            master_path,
            f"is true, but the model trains in {train.precision} (bf16.enabled is not true)",
            "Set bf16.enabled: true, or remove bf16_master_weights_and_grads and bf16_optimizer_states",
        )
    r.record(key, r.tree.origin(master_path), "bf16 master weights, grads and optimizer state (pure bf16)")
    return "bf16"


def check_engine_options(r: Resolver, options: EngineOptions) -> None:
    """Raise the first of the engine's option problems as a RecipeError at the recipe key behind it."""
    from zerolaunch.zero.option_rules import option_problems

    problems = option_problems(options)
    if problems:
        raise option_error(r, problems[0])


def option_error(r: Resolver, problem: OptionProblem) -> RecipeError:
    """The problem at the path the user wrote for `engine.<problem.key>`; an option they set by a block
    (offload_param) is found through its leaves (offload_param.device). An option nobody wrote (a default,
    or derived) is named by its engine key, with the recipe's source."""
    key = f"engine.{problem.key}"
    end = "" if problem.fix.endswith(".") else "."
    path = r.paths.get(key)
    if path is not None:
        return r.fail(path, problem.problem, problem.fix)
    for leaf, leaf_path in r.paths.items():
        if leaf.startswith(key + "."):
            # where: the leaf's line or --set flag (the block itself may have neither); key: the block's
            block = leaf_path[: len(leaf_path) - leaf[len(key) + 1 :].count(".") - 1]
            return RecipeError(
                f"{r.where(leaf_path)}: `{r.tree.key(block)}` {problem.problem}. {problem.fix}{end}"
            )
    return RecipeError(
        f"{r.where(())}: `{key}` ({r.origins.get(key, 'default')}) {problem.problem}. {problem.fix}{end}"
    )


def _zero(r: Resolver, has_ds: bool, model: ModelHidden | None) -> ZeroOptions:
    from zerolaunch.zero.options import ZeroOptions

    base = ZeroOptions()
    k = "engine.zero."
    stage_default = 0 if has_ds else base.stage
    note = "DeepSpeed's default without zero_optimization" if has_ds else "zerolaunch's default"
    stage = r.value(k + "stage", Z + ("stage",), "int", stage_default, default_note=note)

    def bucket(key: str, factor: float, power: int) -> int:
        """A bucket size whose "auto" is factor * h**power, h the model's hidden size (Hugging Face's rule)."""

        def auto() -> tuple[int, str]:
            h, source = hidden_size(r, Z + (key,), model)
            value = int(factor * h**power)
            formula = {1: "h", 2: "h*h"}[power]
            return value, f"{'' if factor == 1 else f'{factor:g}*'}{formula} with h={h} ({source})"

        return r.value(k + key, Z + (key,), "int", getattr(base, key), auto=auto)

    reduce_bucket = bucket("reduce_bucket_size", 1, 2)
    prefetch = bucket("stage3_prefetch_bucket_size", 0.9, 2)
    persistence = bucket("stage3_param_persistence_threshold", 10, 1)
    overlap = r.value(
        k + "overlap_comm",
        Z + ("overlap_comm",),
        "bool",
        stage == 3,
        default_note="DeepSpeed's default: on for stage 3 only",
    )
    offload_optimizer = _offload(r, "offload_optimizer", has_ds, 4)
    offload_param = _offload(r, "offload_param", has_ds, 5)
    return ZeroOptions(
        stage=stage,
        reduce_bucket_size=reduce_bucket,
        overlap_comm=overlap,
        stage3_prefetch_bucket_size=prefetch,
        stage3_param_persistence_threshold=persistence,
        stage3_max_live_parameters=_max_live(r, base.stage3_max_live_parameters),
        stage3_max_reuse_distance=_max_reuse(r, base.stage3_max_reuse_distance),
        stage3_units=r.value(k + "stage3_units", Z + ("stage3_units",), "str_list", ()),
        stage3_gather_16bit_weights_on_model_save=_gather_16bit(r),
        offload_optimizer=offload_optimizer,
        offload_param=offload_param,
    )


def _gather_16bit(r: Resolver) -> bool:
    """stage3_gather_16bit_weights_on_model_save (or its deprecated fp16 spelling): a model.safetensors in
    each checkpoint. "auto" is false: DeepSpeed drops "auto" in this block and keeps its default."""
    key = "engine.zero.stage3_gather_16bit_weights_on_model_save"
    path = Z + ("stage3_gather_16bit_weights_on_model_save",)
    legacy = Z + ("stage3_gather_fp16_weights_on_model_save",)
    if not r.given(path) and r.given(legacy):
        path = legacy
    value = r.value(
        key, path, "bool", False, auto=lambda: (False, "DeepSpeed drops it and keeps its default")
    )
    if value:
        r.notes[key] = (
            "true: each checkpoint folder also gets model.safetensors (the model, gathered, 16-bit)"
        )
    return value


def _max_live(r: Resolver, default: int) -> int:
    key = "engine.zero.stage3_max_live_parameters"
    value = r.value(key, Z + ("stage3_max_live_parameters",), "int", default)
    if value == 0:
        r.notes[key] = "0: no prefetch beyond the unit in use (that unit is always gathered)"
    return value


def _max_reuse(r: Resolver, default: int) -> int:
    key = "engine.zero.stage3_max_reuse_distance"
    value = r.value(key, Z + ("stage3_max_reuse_distance",), "int", default)
    if value > 0:
        r.notes[key] = (
            f"{value}: a stage-3 unit reused within {value} gathered elements (the last ones of the forward) "
            "stays gathered into its backward, within stage3_max_live_parameters"
        )
    return value


def _offload(r: Resolver, name: str, has_ds: bool, buffer_count: int) -> OffloadOptions:
    from zerolaunch.zero.options import OffloadOptions

    from .deepspeed import PARAM_BUFFER_COUNT

    path = Z + (name,)
    k = f"engine.zero.{name}."
    block = r.raw(path)
    if r.given(path) and block is not None and not isinstance(block, dict):
        raise r.fail(
            path, f"must be a mapping like {{device: cpu}}, got {block!r}", "Write device: cpu|nvme|none"
        )
    device = r.value(k + "device", path + ("device",), "choice", "none", choices=("none", "cpu", "nvme"))
    nvme_path = r.value(k + "nvme_path", path + ("nvme_path",), "optional_str", None)
    # DeepSpeed pins offload buffers unless told otherwise; an offload block here follows it.
    pin = r.value(k + "pin_memory", path + ("pin_memory",), "bool", has_ds and isinstance(block, dict))
    count = buffer_count
    overlap_step = False
    if name == "offload_optimizer":
        count = r.value(k + "buffer_count", path + ("buffer_count",), "int", buffer_count)
        overlap_step = r.value(k + "overlap_step", path + ("overlap_step",), "bool", False)
    else:
        r.record(k + "buffer_count", "default", f"no effect: {PARAM_BUFFER_COUNT}")
        r.record(k + "overlap_step", "default", "offload_optimizer only")
    _note_idle_offload_keys(r, name, device)
    return OffloadOptions(
        device=device, pin_memory=pin, nvme_path=nvme_path, buffer_count=count, overlap_step=overlap_step
    )


def _note_idle_offload_keys(r: Resolver, name: str, device: str) -> None:
    """Keys of an offload block that the chosen device never reads, when the user wrote them: noted on their
    rows, so that `recipe show` does not present them as in use."""
    path = Z + (name,)
    k = f"engine.zero.{name}."
    idle: dict[str, str] = {}
    if device != "nvme":
        idle["nvme_path"] = f"read with device nvme only (device is {device})"
        if name == "offload_optimizer":
            idle["buffer_count"] = f"the nvme swap file's staging buffers (device is {device})"
    if device == "none":
        idle["pin_memory"] = "nothing is offloaded (device is none)"
    for key, why in idle.items():
        if r.given(path + (key,)):
            r.notes[k + key] = f"no effect: {why}"


def _schedule_note(r: Resolver, train: TrainSection) -> str:
    """The scheduler row's note. A `deepspeed:` block silently trades zerolaunch's cosine for DeepSpeed's
    constant lr, and its WarmupLR formula runs the first two steps at warmup_min_lr (0): said on the row, as
    a user coming from zerolaunch's defaults would not expect either."""
    note = f"from train.lr_schedule {train.lr_schedule!r}"
    ds_default = (
        isinstance(r.raw(DS), dict)
        and r.tree.from_file(DS)
        and r.origins.get("train.lr_schedule") == "default"
    )
    if not ds_default:
        return note
    note = (
        "CHANGED DEFAULT: the deepspeed: block makes the lr constant (DeepSpeed's default: no scheduler), "
        "not zerolaunch's cosine; set train.lr_schedule: cosine to keep it"
    )
    if train.warmup_steps:
        note += (
            f". train.warmup_steps {train.warmup_steps} runs as DeepSpeed's WarmupLR from lr 0: steps 1 and 2 "
            "train at lr 0"
        )
    return note


def _scheduler(r: Resolver, train: TrainSection) -> Any:
    from zerolaunch.zero.options import SchedulerOptions

    kind = scheduler_name(r.tree, DS)
    k = "engine.scheduler."
    if kind is None:
        for key in (
            "warmup_min_lr",
            "warmup_min_ratio",
            "cos_min_ratio",
            "warmup_type",
            "warmup_max_lr",
            "warmup_num_steps",
            "total_num_steps",
        ):
            r.record(
                k + key,
                "derived" if key in ("warmup_max_lr", "warmup_num_steps", "total_num_steps") else "default",
            )
        r.record(k + "name", "derived", _schedule_note(r, train))
        if train.lr_schedule == "cosine":
            return SchedulerOptions(
                name="cosine",
                warmup_max_lr=train.lr,
                warmup_num_steps=train.warmup_steps,
                warmup_type="linear",
                total_num_steps=train.steps,
            )
        name = "WarmupLR" if train.warmup_steps else "none"
        return SchedulerOptions(
            name=name,
            # None: each param group warms up to its own lr (train.lr unless model_parameters gave one)
            warmup_max_lr=None,
            warmup_num_steps=train.warmup_steps,
            warmup_type="linear",
            total_num_steps=train.steps,
        )
    p: Path = DS + ("scheduler", "params")
    r.record(k + "name", r.tree.origin(DS + ("scheduler", "type")))
    r.record(k + "warmup_num_steps", r.origins["train.warmup_steps"], "= train.warmup_steps")
    if "train.warmup_steps" in r.paths:
        r.paths[k + "warmup_num_steps"] = r.paths["train.warmup_steps"]
    if r.is_auto(p + ("warmup_num_steps",)):
        r.record(k + "warmup_num_steps", "auto", "auto: = train.warmup_steps")
    wants_total = kind != "WarmupLR"
    total = r.value(
        k + "total_num_steps",
        p + ("total_num_steps",),
        "int",
        train.steps if wants_total else None,
        auto=lambda: (train.steps, "= train.steps"),
        default_note="= train.steps" if wants_total else None,
    )
    if kind != "cosine" and train.warmup_steps < 2:
        # DeepSpeed clamps warmup to 2 steps (log(1) = 0); 0.19.8's WarmupLR/WarmupCosineLR raise for 0.
        r.notes[k + "warmup_num_steps"] = (
            f"{train.warmup_steps}: DeepSpeed's schedules warm up over at least 2 steps (DeepSpeed 0.19.8 "
            "refuses 0); the lr peaks at the 3rd step (log) or 4th (linear)"
        )
    if total is not None and total < train.warmup_steps:
        # DeepSpeed only warns here; the decay part of the schedule is never reached.
        r.notes[k + "total_num_steps"] = f"fewer than the {train.warmup_steps} warmup steps: no decay phase"
    peak = r.value(
        k + "warmup_max_lr",
        p + ("warmup_max_lr",),
        "float_or_list",
        # DeepSpeed 0.19.8: WarmupDecayLR defaults to 0.001, WarmupLR to the optimizer's lr (None here).
        0.001 if kind == "WarmupDecayLR" else None,
        auto=lambda: (train.lr, "= train.lr"),
        default_note="DeepSpeed's default"
        if kind == "WarmupDecayLR"
        else "DeepSpeed's default: the optimizer's lr",
        gt=0,
    )
    for ratio in ("warmup_min_ratio", "cos_min_ratio"):
        if isinstance(r.raw(p + (ratio,)), (list, tuple)):
            # DeepSpeed 0.19.8's WarmupCosineLR uses them as numbers (`1. - self.warmup_min_ratio`), a list fails
            raise r.fail(
                p + (ratio,),
                f"is a list ({r.raw(p + (ratio,))!r}), but DeepSpeed's WarmupCosineLR takes one {ratio} for "
                "every param group (each group's own lr is scaled by the same ratio)",
                "Write one number from 0 to 1",
            )
    return SchedulerOptions(
        name=kind,
        warmup_min_lr=r.value(
            k + "warmup_min_lr",
            p + ("warmup_min_lr",),
            "float_or_list",
            0.0,
            auto=lambda: (0.0, "0 (Hugging Face's choice)"),
            min=0,
        ),
        warmup_max_lr=peak,
        warmup_num_steps=train.warmup_steps,
        warmup_type=r.value(
            k + "warmup_type",
            p + ("warmup_type",),
            "choice",
            "linear" if kind == "cosine" else "log",
            choices=("log", "linear"),
        ),
        total_num_steps=total,
        cos_min_ratio=r.value(k + "cos_min_ratio", p + ("cos_min_ratio",), "float", 0.0001),
        warmup_min_ratio=r.value(k + "warmup_min_ratio", p + ("warmup_min_ratio",), "float", 0.0),
    )
