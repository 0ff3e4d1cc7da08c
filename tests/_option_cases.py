"""One case per engine option rule: EngineOptions that break it, and a recipe that says the same thing.

Written from the rules' meaning (DeepSpeed's keys and zerolaunch's docs), not from zero/option_rules.py's
code: tests/unit/test_option_rules.py checks the engine rejects each `options`, the recipe loader rejects each
`recipe` at `key` (file line `line`), and that every rule in RULES has a case here; tests/e2e/
test_cli_option_rules.py runs each recipe through `zerolaunch recipe show`. Plain values; no fixtures.
"""

from __future__ import annotations

from dataclasses import dataclass

from zerolaunch.zero.options import (
    EngineOptions,
    OffloadOptions,
    OptimizerOptions,
    PrecisionOptions,
    SchedulerOptions,
    ZeroOptions,
)


@dataclass(frozen=True)
class Case:
    rule: str
    """The rule's key within EngineOptions."""
    options: EngineOptions
    recipe: str
    """YAML of a recipe that asks for the same thing."""
    key: str
    """The key as the user wrote it, which the recipe error must name."""
    line: int
    """Its line in `recipe`."""
    needle: str
    """A word of the expected values or the fix."""


def _zero_recipe(body: str) -> str:
    return "train:\n  steps: 2\ndeepspeed:\n  zero_optimization:\n" + body


def _fp16_recipe(line: str) -> str:
    return "deepspeed:\n  fp16:\n    enabled: true\n" + line


def _scheduler_recipe(kind: str, line: str = "") -> str:
    return f"deepspeed:\n  scheduler:\n    type: {kind}\n    params:\n{line}"


def _fp16(**kw) -> EngineOptions:
    return EngineOptions(precision=PrecisionOptions(dtype="fp16", **kw))


Z = "deepspeed.zero_optimization"
P = "deepspeed.scheduler.params"
CASES: tuple[Case, ...] = (
    Case(
        "zero.stage",
        EngineOptions(zero=ZeroOptions(stage=4)),
        _zero_recipe("    stage: 4\n"),
        f"{Z}.stage",
        5,
        "0, 1, 2 or 3",
    ),
    Case(
        "zero.reduce_bucket_size",
        EngineOptions(zero=ZeroOptions(reduce_bucket_size=0)),
        _zero_recipe("    stage: 2\n    reduce_bucket_size: 0\n"),
        f"{Z}.reduce_bucket_size",
        6,
        ">= 1",
    ),
    # The disagreement of issue #18: the engine let a negative value through below stage 3.
    Case(
        "zero.stage3_max_live_parameters",
        EngineOptions(zero=ZeroOptions(stage=1, stage3_max_live_parameters=-1)),
        _zero_recipe("    stage: 1\n    stage3_max_live_parameters: -1\n"),
        f"{Z}.stage3_max_live_parameters",
        6,
        ">= 0",
    ),
    Case(
        "zero.stage3_max_reuse_distance",
        EngineOptions(zero=ZeroOptions(stage=3, stage3_max_reuse_distance=-5)),
        _zero_recipe("    stage: 3\n    stage3_max_reuse_distance: -5\n"),
        f"{Z}.stage3_max_reuse_distance",
        6,
        ">= 0",
    ),
    Case(
        "gradient_accumulation_steps",
        EngineOptions(gradient_accumulation_steps=0),
        "train:\n  steps: 2\n  gradient_accumulation_steps: 0\n",
        "train.gradient_accumulation_steps",
        3,
        ">= 1",
    ),
    Case(
        "gradient_clipping",
        EngineOptions(gradient_clipping=-1.0),
        "train:\n  steps: 2\ndeepspeed:\n  gradient_clipping: -1.0\n",
        "deepspeed.gradient_clipping",
        4,
        ">= 0",
    ),
    Case(
        "precision.dtype",
        EngineOptions(precision=PrecisionOptions(dtype="fp8")),
        "train:\n  steps: 2\n  precision: fp8\n",
        "train.precision",
        3,
        "fp32, bf16, fp16",
    ),
    Case(
        "precision.communication_dtype",
        EngineOptions(precision=PrecisionOptions(communication_dtype="fp8")),
        "deepspeed:\n  communication_data_type: fp8\n",
        "deepspeed.communication_data_type",
        2,
        "fp32, fp16, bf16",
    ),
    Case(
        "optimizer.name",
        EngineOptions(optimizer=OptimizerOptions(name="lamb")),
        "deepspeed:\n  optimizer:\n    type: Lamb\n",
        "deepspeed.optimizer.type",
        3,
        "not supported",
    ),
    Case(
        "zero.offload_optimizer",
        EngineOptions(zero=ZeroOptions(stage=0, offload_optimizer=OffloadOptions(device="cpu"))),
        _zero_recipe("    stage: 0\n    offload_optimizer:\n      device: cpu\n"),
        f"{Z}.offload_optimizer",
        7,  # the line of device: cpu
        "stage 1, 2 or 3",
    ),
    # [Note: bf16 master]: pure bf16 stays on the device (a bf16 master with an fp32 model: refused by the recipe
    # loader before the engine's rule, tests/unit/test_bf16_master.py)
    Case(
        "precision.master_dtype",
        EngineOptions(
            zero=ZeroOptions(stage=2, offload_optimizer=OffloadOptions(device="cpu")),
            precision=PrecisionOptions(dtype="bf16", master_dtype="bf16"),
        ),
        "train:\n  steps: 2\ndeepspeed:\n  bf16:\n    enabled: true\n    bf16_master_weights_and_grads: true\n"
        "    bf16_optimizer_states: true\n  zero_optimization:\n    stage: 2\n    offload_optimizer:\n"
        "      device: cpu\n",
        "deepspeed.bf16.bf16_master_weights_and_grads",
        6,
        "remove offload_optimizer",
    ),
    # [Note: fused step]: Adam / AdamW over a master on the device (offload: tests/e2e/test_compile_optimizer.py)
    Case(
        "optimizer.fused_step",
        EngineOptions(optimizer=OptimizerOptions(name="sgd", fused_step=True)),
        "train:\n  steps: 2\n  compile_optimizer: true\ndeepspeed:\n  optimizer:\n    type: SGD\n",
        "train.compile_optimizer",
        3,
        "use Adam or AdamW",
    ),
    Case(
        "zero.offload_optimizer.overlap_step",
        EngineOptions(
            zero=ZeroOptions(stage=3, offload_optimizer=OffloadOptions(device="cpu", overlap_step=True))
        ),
        _zero_recipe("    stage: 3\n    offload_optimizer:\n      device: cpu\n      overlap_step: true\n"),
        f"{Z}.offload_optimizer.overlap_step",
        8,
        "stages 1 and 2",
    ),
    Case(
        "zero.offload_optimizer.device",
        EngineOptions(zero=ZeroOptions(stage=2, offload_optimizer=OffloadOptions(device="nvme"))),
        _zero_recipe("    stage: 2\n    offload_optimizer:\n      device: nvme\n"),
        f"{Z}.offload_optimizer.device",
        7,
        "nvme_path",
    ),
    Case(
        "zero.offload_param",
        EngineOptions(zero=ZeroOptions(stage=2, offload_param=OffloadOptions(device="cpu"))),
        _zero_recipe("    stage: 2\n    offload_param:\n      device: cpu\n"),
        f"{Z}.offload_param",
        7,
        "stage 3",
    ),
    Case(
        "zero.offload_param.device",
        EngineOptions(zero=ZeroOptions(stage=3, offload_param=OffloadOptions(device="nvme"))),
        _zero_recipe("    stage: 3\n    offload_param:\n      device: nvme\n"),
        f"{Z}.offload_param.device",
        7,
        "nvme_path",
    ),
    Case(
        "precision.loss_scale",
        _fp16(loss_scale=-1.0),
        _fp16_recipe("    loss_scale: -1\n"),
        "deepspeed.fp16.loss_scale",
        4,
        ">= 0",
    ),
    Case(
        "precision.initial_scale_power",
        _fp16(initial_scale_power=65),
        _fp16_recipe("    initial_scale_power: 65\n"),
        "deepspeed.fp16.initial_scale_power",
        4,
        "between 0 and 64",
    ),
    Case(
        "precision.loss_scale_window",
        _fp16(loss_scale_window=0),
        _fp16_recipe("    loss_scale_window: 0\n"),
        "deepspeed.fp16.loss_scale_window",
        4,
        ">= 1",
    ),
    Case(
        "precision.hysteresis",
        _fp16(hysteresis=0),
        _fp16_recipe("    hysteresis: 0\n"),
        "deepspeed.fp16.hysteresis",
        4,
        ">= 1",
    ),
    Case(
        "precision.min_loss_scale",
        _fp16(min_loss_scale=0.0),
        _fp16_recipe("    min_loss_scale: 0\n"),
        "deepspeed.fp16.min_loss_scale",
        4,
        "> 0",
    ),
    Case(
        "scheduler.name",
        EngineOptions(scheduler=SchedulerOptions(name="OneCycle")),
        "deepspeed:\n  scheduler:\n    type: OneCycle\n",
        "deepspeed.scheduler.type",
        3,
        "WarmupLR",
    ),
    Case(
        "scheduler.warmup_num_steps",
        EngineOptions(scheduler=SchedulerOptions(name="WarmupLR", warmup_num_steps=-1)),
        "train:\n  warmup_steps: -1\n",
        "train.warmup_steps",
        2,
        ">= 0",
    ),
    Case(
        "scheduler.warmup_type",
        EngineOptions(scheduler=SchedulerOptions(name="WarmupLR", warmup_type="cubic")),
        _scheduler_recipe("WarmupLR", "      warmup_type: cubic\n"),
        f"{P}.warmup_type",
        5,
        "log",
    ),
    Case(
        "scheduler.total_num_steps",
        EngineOptions(scheduler=SchedulerOptions(name="WarmupDecayLR", total_num_steps=0)),
        _scheduler_recipe("WarmupDecayLR", "      total_num_steps: 0\n"),
        f"{P}.total_num_steps",
        5,
        ">= 1",
    ),
    Case(
        "scheduler.cos_min_ratio",
        EngineOptions(
            scheduler=SchedulerOptions(name="WarmupCosineLR", total_num_steps=9, cos_min_ratio=1.5)
        ),
        _scheduler_recipe("WarmupCosineLR", "      cos_min_ratio: 1.5\n"),
        f"{P}.cos_min_ratio",
        5,
        "between 0 and 1",
    ),
    Case(
        "scheduler.warmup_min_ratio",
        EngineOptions(
            scheduler=SchedulerOptions(name="WarmupCosineLR", total_num_steps=9, warmup_min_ratio=-0.1)
        ),
        _scheduler_recipe("WarmupCosineLR", "      warmup_min_ratio: -0.1\n"),
        f"{P}.warmup_min_ratio",
        5,
        "between 0 and 1",
    ),
    Case(
        "zero.stage3_prefetch_bucket_size",
        EngineOptions(zero=ZeroOptions(stage=3, stage3_prefetch_bucket_size=-1)),
        _zero_recipe("    stage: 3\n    stage3_prefetch_bucket_size: -1\n"),
        f"{Z}.stage3_prefetch_bucket_size",
        6,
        ">= 0",
    ),
    Case(
        "zero.stage3_param_persistence_threshold",
        EngineOptions(zero=ZeroOptions(stage=3, stage3_param_persistence_threshold=-1)),
        _zero_recipe("    stage: 3\n    stage3_param_persistence_threshold: -1\n"),
        f"{Z}.stage3_param_persistence_threshold",
        6,
        ">= 0",
    ),
    Case(
        "zero.offload_optimizer.buffer_count",
        EngineOptions(
            zero=ZeroOptions(stage=2, offload_optimizer=OffloadOptions(device="cpu", buffer_count=0))
        ),
        _zero_recipe("    stage: 2\n    offload_optimizer:\n      device: cpu\n      buffer_count: 0\n"),
        f"{Z}.offload_optimizer.buffer_count",
        8,
        ">= 1",
    ),
    Case(
        "optimizer.lr",
        EngineOptions(optimizer=OptimizerOptions(lr=-1.0)),
        "deepspeed:\n  optimizer:\n    type: AdamW\n    params:\n      lr: -1\n",
        "deepspeed.optimizer.params.lr",
        5,
        "must be",  # the recipe is stricter (> 0: a zero lr in a recipe is a mistake), the engine takes 0
    ),
    Case(
        "optimizer.momentum",
        EngineOptions(optimizer=OptimizerOptions(name="sgd", momentum=-0.5)),
        "deepspeed:\n  optimizer:\n    type: SGD\n    params:\n      momentum: -0.5\n",
        "deepspeed.optimizer.params.momentum",
        5,
        ">= 0",
    ),
)
