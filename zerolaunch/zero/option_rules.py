"""The engine's option rules, written once: what `EngineOptions` the engine accepts, torch-free.

`option_problems(options)` lists every broken rule as an `OptionProblem` (the dotted key within
EngineOptions, the problem, the fix). Two readers turn them into errors: `protocol.validate_options`, which
the engine runs at construction (ValueError, first problem), and the recipe loader (`zerolaunch.config`),
which names the recipe file, line and the key the user wrote. So a recipe that passes `recipe show` cannot
fail the engine's check in every worker.

Texts are written in words both vocabularies share ("ZeRO stage", "offload_optimizer.device"): the engine's
keys (`zero.stage`, `precision.hysteresis`) and DeepSpeed's (`zero_optimization.stage`, `fp16.hysteresis`)
differ in their sections, not their names. This module
owns those rules; it does not own type checks, "auto" or key names (config/), nor the checks that need the
model (stage-3 units, param group counts: the engine and zero/sched.py).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from .options import (
    COMM_DTYPES,
    DECAYING_SCHEDULES,
    DTYPE_NAMES,
    MASTER_DTYPES,
    OPTIMIZER_NAMES,
    SCHEDULER_NAMES,
    EngineOptions,
    OffloadOptions,
    PrecisionOptions,
    SchedulerOptions,
)


@dataclass(frozen=True)
class OptionProblem:
    key: str
    """The dotted path within EngineOptions, e.g. "zero.offload_optimizer.overlap_step"."""
    problem: str
    """What is wrong, as it reads after the key: "must be >= 0, got -1"."""
    fix: str
    """What to do, one sentence without the final period: "Use 0 or more elements"."""

    def message(self) -> str:
        """The engine's wording: `key problem; fix` (the recipe loader writes its own, with file and line)."""
        return f"{self.key} {self.problem}; {self.fix[:1].lower()}{self.fix[1:]}"


@dataclass(frozen=True)
class Rule:
    key: str
    check: Callable[[EngineOptions], tuple[str, str] | None]
    """(problem, fix) when `options` break the rule, else None."""


def _stage(o: EngineOptions) -> tuple[str, str] | None:
    if o.zero.stage not in (0, 1, 2, 3):
        return f"must be 0, 1, 2 or 3 (got {o.zero.stage!r})", "Use a ZeRO stage between 0 and 3"
    return None


def _dtype(o: EngineOptions) -> tuple[str, str] | None:
    if o.precision.dtype not in DTYPE_NAMES:
        return f"must be one of {', '.join(DTYPE_NAMES)}, got {o.precision.dtype!r}", "Use one of them"
    return None


def _comm_dtype(o: EngineOptions) -> tuple[str, str] | None:
    value = o.precision.communication_dtype
    if value is not None and value not in COMM_DTYPES:
        return (
            f"must be one of {', '.join(COMM_DTYPES)}, got {value!r}",
            "Use one of them, or leave it out (fp32)",
        )
    return None


def _master_dtype(o: EngineOptions) -> tuple[str, str] | None:
    master = o.precision.master_dtype
    if master not in MASTER_DTYPES:
        return f"must be one of {', '.join(MASTER_DTYPES)}, got {master!r}", "Use one of them"
    if master == "fp32":
        return None
    if o.precision.dtype != master:
        return (
            f"is {master}, but the model computes in {o.precision.dtype}",
            f"Train in {master} (bf16.enabled), or keep an fp32 master",
        )
    if o.zero.offload_optimizer.device != "none":
        return (
            f"is {master} with offload_optimizer on {o.zero.offload_optimizer.device}: the CPU step keeps an "
            "fp32 master and fp32 state",
            "Keep an fp32 master, or remove offload_optimizer",
        )
    return None


def _optimizer(o: EngineOptions) -> tuple[str, str] | None:
    if o.optimizer.name not in OPTIMIZER_NAMES:
        return (
            f"{o.optimizer.name!r} is not supported",
            f"Use one of: {', '.join(OPTIMIZER_NAMES)}",
        )
    return None


def fused_step_blocker(optimizer: str, offload_device: str) -> tuple[str, str] | None:
    """(why optimizer.fused_step cannot run with this optimizer and offload_optimizer.device, the fix) or None
    where it can. The one statement of the condition: the engine's rule, the config's default for
    train.compile_optimizer and ShardOptimizer's own guard all ask it, so they never disagree."""
    if optimizer not in ("adam", "adamw"):
        return f"the fused step is Adam / AdamW's and the optimizer is {optimizer}", "use Adam or AdamW"
    if offload_device != "none":
        return (
            f"offload_optimizer steps on the CPU, where there is no kernel to fuse (device is {offload_device})",
            "remove offload_optimizer",
        )
    return None


def why_not_fused(o: EngineOptions) -> tuple[str, str] | None:
    """fused_step_blocker of the options `o`."""
    return fused_step_blocker(o.optimizer.name, o.zero.offload_optimizer.device)


def _fused_step(o: EngineOptions) -> tuple[str, str] | None:
    blocker = why_not_fused(o) if o.optimizer.fused_step else None
    if blocker is None:
        return None
    why, fix = blocker
    return f"is on, but {why}", f"Turn it off, or {fix}"


def _offload_optimizer(o: EngineOptions) -> tuple[str, str] | None:
    if o.zero.stage == 0 and o.zero.offload_optimizer.device != "none":
        return (
            "needs ZeRO stage 1, 2 or 3 (stage is 0, which keeps everything replicated)",
            "Set the ZeRO stage to 1, 2 or 3, or remove offload_optimizer",
        )
    return None


def _overlap_step(o: EngineOptions) -> tuple[str, str] | None:
    z = o.zero
    if z.offload_optimizer.overlap_step and (z.stage not in (1, 2) or z.offload_optimizer.device == "none"):
        return (
            "runs an offloaded optimizer step during the next forward, for ZeRO stages 1 and 2 with "
            f"offload_optimizer.device cpu or nvme (stage is {z.stage}, device is {z.offload_optimizer.device})",
            "Remove overlap_step, or set the stage and offload_optimizer.device",
        )
    return None


def _offload_param(o: EngineOptions) -> tuple[str, str] | None:
    if o.zero.stage != 3 and o.zero.offload_param.device != "none":
        return (
            f"offloads parameters, which only ZeRO stage 3 shards (stage is {o.zero.stage}; stages 0-2 keep "
            "the parameters on the device)",
            "Set the ZeRO stage to 3, or use offload_optimizer instead",
        )
    return None


def _nvme_path(name: str) -> Callable[[EngineOptions], tuple[str, str] | None]:
    def check(o: EngineOptions) -> tuple[str, str] | None:
        offload: OffloadOptions = getattr(o.zero, name)
        if offload.device == "nvme" and not offload.nvme_path:
            return "is nvme but no nvme_path is given", f"Add {name}.nvme_path: /local/nvme"
        return None

    return check


def _field(key: str, bad: Callable[[Any], bool], need: str, fix: str) -> Rule:
    """A rule on one field: the option at dotted `key` must be `need` (a value for which `bad` is false)."""

    def check(o: EngineOptions) -> tuple[str, str] | None:
        value: Any = o
        for name in key.split("."):
            value = getattr(value, name)
        return (f"must be {need}, got {value!r}", fix) if bad(value) else None

    return Rule(key, check)


def _total_steps(o: EngineOptions) -> tuple[str, str] | None:
    s = o.scheduler
    if s.total_num_steps is None and s.name in DECAYING_SCHEDULES:
        return f"is required (>= 1) for {s.name}", "Set it to the number of optimizer steps of the run"
    if s.total_num_steps is not None and s.total_num_steps < 1:
        return (
            f"must be >= 1, got {s.total_num_steps!r}",
            "Set it to the number of optimizer steps of the run",
        )
    return None


def _fraction(value: float) -> bool:
    return not 0.0 <= value <= 1.0


# The precision rules hold for every dtype (only fp16 scales the loss), as the recipe's fp16 block has them.
PRECISION_RULES: tuple[Rule, ...] = (
    _field(
        "precision.loss_scale",
        lambda v: v < 0,
        ">= 0 (0 = dynamic)",
        "Use 0 for dynamic loss scaling, or a positive static scale",
    ),
    _field(
        "precision.initial_scale_power",
        lambda v: not 0 <= v <= 64,
        "between 0 and 64 (dynamic scaling starts at 2**initial_scale_power)",
        "Use a power from 0 to 64, e.g. 16 (DeepSpeed's default)",
    ),
    _field("precision.loss_scale_window", lambda v: v < 1, ">= 1", "Use 1 or more steps, e.g. 1000"),
    _field("precision.hysteresis", lambda v: v < 1, ">= 1", "Use 1 or more overflows, e.g. 2"),
    _field("precision.min_loss_scale", lambda v: not v > 0, "> 0", "Use a positive floor, e.g. 1"),
)
SCHEDULER_RULES: tuple[Rule, ...] = (
    _field(
        "scheduler.name",
        lambda v: v not in SCHEDULER_NAMES,
        f"one of {', '.join(SCHEDULER_NAMES)}",
        "Use one of them",
    ),
    _field("scheduler.warmup_num_steps", lambda v: v < 0, ">= 0", "Use 0 (no warmup) or more steps"),
    _field(
        "scheduler.warmup_type",
        lambda v: v not in ("log", "linear"),
        "'log' or 'linear'",
        "Use log or linear",
    ),
    Rule("scheduler.total_num_steps", _total_steps),
    _field(
        "scheduler.cos_min_ratio",
        _fraction,
        "between 0 and 1 (the final lr as a fraction of the peak)",
        "Use a value from 0 to 1",
    ),
    _field(
        "scheduler.warmup_min_ratio",
        _fraction,
        "between 0 and 1 (the first lr as a fraction of the peak)",
        "Use a value from 0 to 1",
    ),
)

RULES: tuple[Rule, ...] = (
    Rule("zero.stage", _stage),
    _field(
        "zero.reduce_bucket_size",
        lambda v: v < 1,
        ">= 1 element",
        "Use a positive number of elements, e.g. 5e8",
    ),
    # DeepSpeed refuses a negative value at every stage (pydantic ge=0), though only stage 3 reads it.
    _field(
        "zero.stage3_max_live_parameters",
        lambda v: v < 0,
        ">= 0 (0 = no prefetch beyond the unit in use)",
        "Use 0 or more elements (DeepSpeed's default is 1e9)",
    ),
    _field(
        "zero.stage3_max_reuse_distance",
        lambda v: v < 0,
        ">= 0 (0 = every stage-3 unit is freed after its forward)",
        "Use 0 or more elements",
    ),
    _field(
        "zero.stage3_prefetch_bucket_size",
        lambda v: v < 0,
        ">= 0 (0 = no prefetch)",
        "Use 0 or more elements",
    ),
    _field(
        "zero.stage3_param_persistence_threshold",
        lambda v: v < 0,
        ">= 0 (0 = no param stays gathered)",
        "Use 0 or more elements",
    ),
    _field(
        "zero.offload_optimizer.buffer_count",
        lambda v: v < 1,
        ">= 1",
        "Use 1 or more staging buffers, e.g. 4",
    ),
    _field("gradient_accumulation_steps", lambda v: v < 1, ">= 1", "Use 1 or more micro-steps per step"),
    _field(
        "gradient_clipping",
        lambda v: v < 0,
        ">= 0 (0 = off)",
        "Use 0 to turn clipping off, or a positive max grad norm, e.g. 1.0",
    ),
    Rule("precision.dtype", _dtype),
    Rule("precision.communication_dtype", _comm_dtype),
    Rule("optimizer.name", _optimizer),
    _field("optimizer.lr", lambda v: v < 0, ">= 0", "Use a learning rate of 0 or more, e.g. 3e-4"),
    _field("optimizer.momentum", lambda v: v < 0, ">= 0 (SGD's)", "Use 0 (no momentum) or more, e.g. 0.9"),
    *PRECISION_RULES,
    *SCHEDULER_RULES,
    Rule("zero.offload_optimizer", _offload_optimizer),
    Rule("precision.master_dtype", _master_dtype),
    Rule("optimizer.fused_step", _fused_step),
    Rule("zero.offload_optimizer.overlap_step", _overlap_step),
    Rule("zero.offload_optimizer.device", _nvme_path("offload_optimizer")),
    Rule("zero.offload_param", _offload_param),
    Rule("zero.offload_param.device", _nvme_path("offload_param")),
)
"""Every rule, in the order problems are reported (single-key rules before the ones across keys)."""


def option_problems(options: EngineOptions) -> list[OptionProblem]:
    """Every rule `options` break, in RULES order (empty when the engine accepts them)."""
    return _section_problems(RULES, options)


def _section_problems(rules: tuple[Rule, ...], options: EngineOptions) -> list[OptionProblem]:
    return [OptionProblem(rule.key, *found) for rule in rules if (found := rule.check(options)) is not None]


def precision_problems(options: PrecisionOptions) -> list[OptionProblem]:
    """The precision rules alone (the loss scaler checks its options with them)."""
    return _section_problems(PRECISION_RULES, EngineOptions(precision=options))


def scheduler_problems(options: SchedulerOptions) -> list[OptionProblem]:
    """The scheduler rules alone (LRSchedule checks its options with them)."""
    return _section_problems(SCHEDULER_RULES, EngineOptions(scheduler=options))
