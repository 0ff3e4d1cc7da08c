"""Options of the ZeRO engine, as frozen dataclasses.

This module owns the engine's knobs and their defaults; it does not parse files, resolve "auto" or know any
recipe vocabulary (that is `zerolaunch.config`, which builds these objects). Field names follow DeepSpeed's
`zero_optimization` keys where one exists, so the mapping in `config/` is one-to-one.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal, get_args

OffloadDevice = Literal["none", "cpu", "nvme"]
Dtype = Literal["fp32", "bf16", "fp16"]
DTYPE_NAMES: tuple[str, ...] = get_args(Dtype)
"""The dtype names a recipe, a command line or the engine accepts, defined once (protocol.DTYPES maps them
to torch; zerolaunch/dtypes.py re-exports them for code outside zero/)."""
COMM_DTYPES: tuple[str, ...] = ("fp32", "fp16", "bf16")
"""The names `precision.communication_dtype` (DeepSpeed's communication_data_type) accepts: DTYPE_NAMES,
listed fp16 before bf16 as DeepSpeed documents that key (config/ offers them in this order)."""

MasterDtype = Literal["fp32", "bf16"]
MASTER_DTYPES: tuple[str, ...] = get_args(MasterDtype)

OptimizerName = Literal["adamw", "adam", "sgd"]
OPTIMIZER_NAMES: tuple[str, ...] = get_args(OptimizerName)
"""The optimizers the engine builds (zero/optim/torch_optim.py's STATE_KINDS has one entry for each)."""

OFFLOADED_BUCKET_NUMEL = 50_000_000
"""Largest gradient bucket while the optimizer is offloaded: each bucket is copied to the host as soon as it
is reduced, so only the last bucket's copy (200 MB of fp32, ~4 ms at PCIe 5 rates) is left after backward;
at DeepSpeed's 5e8 a third of a 1.3B model's 5 GB of grads was (~80 ms a step measured on an H200)."""


def bucket_numel(reduce_bucket_size: int, optimizer_offloaded: bool) -> int:
    """Elements per gradient bucket the engine plans (reduce_bucket_size is an upper bound, as in DeepSpeed)."""
    if optimizer_offloaded:
        return min(reduce_bucket_size, OFFLOADED_BUCKET_NUMEL)
    return reduce_bucket_size


@dataclass(frozen=True)
class OffloadOptions:
    device: OffloadDevice = "none"
    """Where the offloaded tensors live: none (on the accelerator), cpu (host RAM) or nvme (files)."""
    pin_memory: bool = False
    """Page-lock host buffers so host<->device copies run asynchronously."""
    nvme_path: str | None = None
    """Folder for the swap files when device is nvme."""
    buffer_count: int = 4
    """Pinned staging buffers used to stream nvme swap files (bounds host memory)."""
    overlap_step: bool = False
    """offload_optimizer, stages 1/2: the CPU step runs in the background while the next forward starts
    ([Note: overlapped step] in zero/optim/overlapped_step.py); params read outside a module's forward may be
    stale until `engine.wait_for_step()`."""


@dataclass(frozen=True)
class ZeroOptions:
    stage: int = 1
    """0 = plain data parallel (all-reduce), 1 = shard optimizer state, 2 = + gradients, 3 = + parameters."""
    reduce_bucket_size: int = 500_000_000
    """Elements per gradient bucket: one reduce-scatter per bucket."""
    overlap_comm: bool | None = None
    """Run collectives on a side stream during backward; None = DeepSpeed's default (on for stage 3 only)."""
    stage3_prefetch_bucket_size: int = 50_000_000
    """Elements gathered ahead of use in stage 3."""
    stage3_param_persistence_threshold: int = 100_000
    """Stage 3 params with fewer elements than this stay gathered on every rank."""
    stage3_max_live_parameters: int = 1_000_000_000
    """Upper bound on gathered (non-persistent) elements alive at once in stage 3."""
    stage3_max_reuse_distance: int = 0
    """Stage 3: a unit whose next use is within this many gathered elements stays gathered after its forward
    (DeepSpeed's rule, within stage3_max_live_parameters); 0 frees every unit after its forward. DeepSpeed's
    default is 1e9; a DeepSpeed config that leaves it out gets 0 here (zerolaunch's memory behaviour)."""
    stage3_gather_16bit_weights_on_model_save: bool = False
    """On save, also write the consolidated 16-bit model (streamed unit by unit)."""
    stage3_units: tuple[str, ...] = ()
    """Stage 3 unit override: module class names (or dotted module paths) that each become one unit."""
    offload_optimizer: OffloadOptions = field(default_factory=OffloadOptions)
    """fp32 master weights + optimizer state off the accelerator (stages 1-3)."""
    offload_param: OffloadOptions = field(default_factory=OffloadOptions)
    """Sharded parameters off the accelerator (stage 3 only)."""

    @property
    def bucket_numel(self) -> int:
        """The gradient bucket size the stage 0-2 engine plans: `bucket_numel(...)`."""
        return bucket_numel(self.reduce_bucket_size, self.offload_optimizer.device != "none")

    @property
    def overlap(self) -> bool:
        return self.stage == 3 if self.overlap_comm is None else self.overlap_comm


@dataclass(frozen=True)
class PrecisionOptions:
    dtype: Dtype = "fp32"
    """Compute dtype of the parameters the model sees."""
    master_dtype: MasterDtype = "fp32"
    """Dtype of the master weights and the optimizer state: fp32 (every ZeRO stage's and FSDP2's default), or
    bf16 with a bf16 model: pure bf16 training, DeepSpeed's bf16.bf16_master_weights_and_grads +
    bf16_optimizer_states ([Note: bf16 master] in optim/shard_optimizer.py)."""
    communication_dtype: Dtype | None = None
    """Dtype gradients are reduced in; None = fp32 (exact, FSDP2's choice)."""
    # fp16 dynamic loss scaling, DeepSpeed's semantics and defaults.
    loss_scale: float = 0.0
    """0 = dynamic; > 0 = a static scale."""
    initial_scale_power: int = 16
    """Dynamic scaling starts at 2**initial_scale_power."""
    loss_scale_window: int = 1000
    """Steps without overflow before the scale doubles."""
    hysteresis: int = 2
    """Overflows tolerated before the scale halves."""
    min_loss_scale: float = 1.0
    """The scale never drops below this."""


@dataclass(frozen=True)
class OptimizerOptions:
    name: OptimizerName = "adamw"
    """adamw (decoupled decay; DeepSpeed's "Adam" with adam_w_mode true), adam (L2 decay) or sgd."""
    lr: float = 1e-3
    betas: tuple[float, float] = (0.9, 0.999)
    eps: float = 1e-8
    weight_decay: float = 0.0
    """Decay of every group that does not set its own (client groups) or of the default groups."""
    decay_1d: bool = False
    """Default groups only: True = one group, every param decayed (DeepSpeed with model.parameters());
    False = nanoGPT's split, no decay on 1-D params (biases, norm gains)."""
    momentum: float = 0.0
    """SGD only."""
    fused_step: bool = False
    """Adam / AdamW only, optimizer on the device: each chunk's step and the write of its new values into the
    params (or the all-gather input) as one compiled kernel ([Note: fused step], optim/fused_step.py); the
    numerics of torch's fused AdamW. Recipes: train.compile_optimizer (on with train.compile)."""


SchedulerName = Literal["none", "WarmupLR", "WarmupDecayLR", "WarmupCosineLR", "cosine"]
SCHEDULER_NAMES: tuple[str, ...] = get_args(SchedulerName)
DECAYING_SCHEDULES: tuple[str, ...] = ("WarmupDecayLR", "WarmupCosineLR", "cosine")
"""The schedules that need total_num_steps."""


@dataclass(frozen=True)
class SchedulerOptions:
    name: SchedulerName = "none"
    warmup_min_lr: float | tuple[float, ...] = 0.0
    """WarmupLR / WarmupDecayLR: a number for every group, or a tuple of one per param group (DeepSpeed's
    `_format_param`; the length is checked when the engine builds its groups)."""
    warmup_max_lr: float | tuple[float, ...] | None = None
    """None = each group's own lr (the optimizer's lr); a number or a per-group tuple as warmup_min_lr."""
    warmup_num_steps: int = 0
    warmup_type: Literal["log", "linear"] = "log"
    total_num_steps: int | None = None
    """Needed by WarmupDecayLR, WarmupCosineLR and cosine."""
    cos_min_ratio: float = 0.0001
    """WarmupCosineLR / cosine: final lr as a fraction of the peak."""
    warmup_min_ratio: float = 0.0
    """WarmupCosineLR: first lr as a fraction of the peak."""


@dataclass(frozen=True)
class EngineOptions:
    zero: ZeroOptions = field(default_factory=ZeroOptions)
    precision: PrecisionOptions = field(default_factory=PrecisionOptions)
    optimizer: OptimizerOptions = field(default_factory=OptimizerOptions)
    scheduler: SchedulerOptions = field(default_factory=SchedulerOptions)
    gradient_clipping: float = 0.0
    """Clip the global gradient norm to this; 0 = off."""
    gradient_accumulation_steps: int = 1
    """Micro-steps per optimizer step."""
