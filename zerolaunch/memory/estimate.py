"""Per-rank memory of every ZeRO stage x offload choice for one model on one cluster shape.

This module owns the estimate: the engine's model-state bytes (the same keys as `Engine.memory_bytes()`:
params, grads, master, optimizer, buckets), the activation bytes of a GPT-style decoder with and without
activation checkpointing, the per-GPU peak, the per-node host bytes, DeepSpeed's published figures for the
same configuration, and the recommendation. The layout arithmetic is layout.py's (via engine_layout.py);
nothing here allocates, and nothing here imports torch.

[Note: peak]
peak per GPU = the engine's resident bytes (model states + buffers, what memory_bytes() reports between
steps) + the largest of the transients that never overlap: the loss (all activations + stage 3's gathered
units), the rest of backward (activations without the loss tensors + gathered units + stage 3's staging
buffers) and the optimizer step (the fp32 reduce copies of stages 0/1 and the compute-dtype
publish copies all-gathered back into the params).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

from zerolaunch.memory import engine_layout as el
from zerolaunch.memory.activations import activation_profile
from zerolaunch.memory.deepspeed import deepspeed_bytes
from zerolaunch.memory.shape import ModelShape
from zerolaunch.memory.sizes import DTYPE_BYTES, EstimateError, normalize_dtype, positive_int
from zerolaunch.memory.stage3 import stage3_states
from zerolaunch.zero.options import bucket_numel

OFFLOADS = ("none", "optimizer-cpu", "optimizer+params-cpu", "optimizer-nvme")
STATE_KEYS = ("params", "grads", "master", "optimizer", "buckets")
# Per-element optimizer state (fp32): Adam keeps exp_avg + exp_avg_sq, SGD a momentum buffer if any.
_STATE_TENSORS = {"adamw": 2, "adam": 2, "sgd": 1}


@dataclass(frozen=True)
class Setup:
    gpus_per_node: int = 1
    nodes: int = 1
    dtype: str = "bf16"
    micro_batch: int = 1
    seq_len: int = 1024
    activation_checkpointing: bool = False
    """Which activation figure the total uses (both are always shown)."""
    optimizer: str = "adamw"
    momentum: float = 0.0
    communication_dtype: str | None = None
    """Dtype grads are reduced in; None = fp32, as the engine."""
    reduce_bucket_size: int = 500_000_000
    overlap_comm: bool | None = None
    stage3_prefetch_bucket_size: int = 50_000_000
    stage3_param_persistence_threshold: int = 100_000
    stage3_max_live_parameters: int = 1_000_000_000
    nvme_buffer_count: int = 4
    gpu_memory_bytes: int | None = None
    cpu_memory_bytes: int | None = None
    """Host RAM per node; when given, a row also has to fit there."""

    def __post_init__(self):
        positive_int(self.gpus_per_node, "--gpus")
        positive_int(self.nodes, "--nodes")
        positive_int(self.micro_batch, "--micro-batch")
        positive_int(self.seq_len, "--seq-len")
        positive_int(self.reduce_bucket_size, "zero.reduce_bucket_size")
        positive_int(self.stage3_prefetch_bucket_size, "zero.stage3_prefetch_bucket_size")
        positive_int(self.nvme_buffer_count, "offload nvme buffer_count")
        if self.stage3_param_persistence_threshold < 0:
            raise EstimateError("zero.stage3_param_persistence_threshold must be >= 0")
        object.__setattr__(self, "dtype", normalize_dtype(self.dtype))
        if self.communication_dtype is not None:
            object.__setattr__(self, "communication_dtype", normalize_dtype(self.communication_dtype))
        if self.optimizer not in _STATE_TENSORS:
            raise EstimateError(f"optimizer {self.optimizer!r} is unknown; use one of adamw, adam, sgd")

    @property
    def world_size(self) -> int:
        return self.gpus_per_node * self.nodes

    @property
    def dtype_bytes(self) -> int:
        return DTYPE_BYTES[self.dtype]

    @property
    def comm_bytes(self) -> int:
        return DTYPE_BYTES[self.communication_dtype or "fp32"]

    @property
    def optimizer_state_tensors(self) -> int:
        if self.optimizer == "sgd" and self.momentum == 0:
            return 0
        return _STATE_TENSORS[self.optimizer]

    def overlap(self, stage: int) -> bool:
        return stage == 3 if self.overlap_comm is None else self.overlap_comm


@dataclass
class Row:
    stage: int
    offload: str
    supported: bool
    """False where the engine refuses the combination (then `note` says why); never recommended."""
    note: str
    gpu: dict[str, int]
    """Per GPU (rank), by STATE_KEYS."""
    host: dict[str, int]
    """Per rank on the host (offloaded states), by STATE_KEYS."""
    step_transient_bytes: int
    buffer_peak_bytes: int
    """Engine buffers alive only inside forward/backward (stage 3: gathered units + staging, not all at the
    activation peak: see [Note: peak])."""
    activation_bytes: int | None
    activation_ckpt_bytes: int | None
    gpu_total_bytes: int
    gpu_total_ckpt_bytes: int
    cpu_node_bytes: int
    """Host bytes of one node: gpus_per_node ranks' offloaded states (+ nvme staging)."""
    fits: bool | None
    fits_ckpt: bool | None
    deepspeed_gpu_bytes: int | None = None
    deepspeed_cpu_node_bytes: int | None = None
    nvme_bytes: int = 0
    """Per rank on disk: the swap file of offload_optimizer nvme (fp32 master + optimizer moments)."""

    @property
    def label(self) -> str:
        return f"stage {self.stage}" + ("" if self.offload == "none" else f" + {self.offload}")


@dataclass
class Estimate:
    source: str
    exact: bool
    numel: int
    largest_layer_numel: int
    setup: Setup
    rows: list[Row] = field(default_factory=list)
    recommendation: str = ""
    recommended: tuple[int, str, bool] | None = None
    """(stage, offload, activation checkpointing) of the recommended row, or None."""

    def row(self, stage: int, offload: str = "none") -> Row:
        for r in self.rows:
            if r.stage == stage and r.offload == offload:
                return r
        raise KeyError((stage, offload))

    def to_json(self) -> dict:
        out = {
            "model": {
                "source": self.source,
                "exact": self.exact,
                "params": self.numel,
                "largest_layer_params": self.largest_layer_numel,
            },
            "setup": asdict(self.setup) | {"world_size": self.setup.world_size},
            "rows": [asdict(r) | {"label": r.label} for r in self.rows],
            "recommendation": self.recommendation,
        }
        out["recommended"] = (
            None
            if self.recommended is None
            else dict(zip(("stage", "offload", "activation_checkpointing"), self.recommended, strict=True))
        )
        return out


def _zero_states() -> dict[str, int]:
    return dict.fromkeys(STATE_KEYS, 0)


def stage012_states(shape: ModelShape, setup: Setup, stage: int, offload: str):
    """(gpu, host, step transient) bytes of the stage 0-2 engine (engine.py, flat.py). The stage-2 staging
    buffers are allocated once and kept, so they are resident ("buckets")."""
    b, c, world = setup.dtype_bytes, setup.comm_bytes, setup.world_size
    lay = el.stage012_layout(
        shape.specs, stage, world, bucket_numel(setup.reduce_bucket_size, offload != "none")
    )
    shard = el.shard_numel(lay)
    gpu, host = _zero_states(), _zero_states()
    # flat_params.buffers (padded, compute dtype) + frozen params, cast to the compute dtype by model.to().
    gpu["params"] = b * lay.padded_numel + b * shape.frozen_numel
    # master, fp32 grad shard and optimizer state all live on the master device (the host when offloaded).
    states = gpu if offload == "none" else host
    states["master"] = 4 * shard
    states["grads"] = 4 * shard
    # the step count shared by every element is a Python int (shard_optim.py), not a tensor.
    states["optimizer"] = 4 * shard * setup.optimizer_state_tensors
    if stage in (0, 1):
        gpu["grads"] += b * lay.padded_numel  # full_grads: param.grad are views into it
        # reduce_full_grads issues every bucket before awaiting: all fp32 copies alive at once (none when the
        # grads already are in the comm dtype), plus stage 1's reduce-scatter outputs.
        copies = c * lay.padded_numel if c != b else 0
        reduce_transient = copies + (c * shard if stage == 1 else 0)
    else:
        count = el.stage2_staging_buffers(lay, [s.name for s in shape.specs], setup.overlap(stage))
        gpu["buckets"] = count * el.max_padded_bucket(lay) * c
        reduce_transient = 0
    if offload == "optimizer-nvme":
        # shard_optim.py + nvme.py: master + moments in the swap file (Row.nvme_bytes); the host keeps the fp32
        # grad shard and buffer_count staging buffers of one bucket's shard x (master + moments), which the
        # engine reports as "optimizer".
        host["master"] = 0
        host["optimizer"] = el.nvme_staging_bytes(
            setup, max((bk.shard_numel for bk in lay.buckets), default=0)
        )
    # _step_and_publish keeps every bucket's compute-dtype copy of its master slice until all gathers land;
    # stage 0 and world size 1 write the params in place.
    publish_transient = 0 if stage == 0 or world == 1 else b * shard
    return gpu, host, max(reduce_transient, publish_transient)


def _supported(stage: int, offload: str) -> tuple[bool, str]:
    if stage == 0 and offload != "none":
        return False, "offload needs stage >= 1"
    if offload == "optimizer+params-cpu" and stage != 3:
        return False, "param offload needs stage 3"
    return True, ""


def _rows_wanted():
    for stage in (0, 1, 2, 3):
        for offload in OFFLOADS:
            ok, _ = _supported(stage, offload)
            if ok:
                yield stage, offload


def _fits(gpu_total: int, cpu_node: int, setup: Setup) -> bool | None:
    if setup.gpu_memory_bytes is None:
        return None
    ok = gpu_total <= setup.gpu_memory_bytes
    if setup.cpu_memory_bytes is not None:
        ok = ok and cpu_node <= setup.cpu_memory_bytes
    return ok


def _peak(resident: int, profile, gathered: int, staging: int, step_transient: int) -> int:
    """Per-GPU peak; see [Note: peak]. profile = (activations at the loss, after it) or None."""
    at_loss, after_loss = profile or (0, 0)
    return resident + max(at_loss + gathered, after_loss + gathered + staging, step_transient)


def estimate(shape: ModelShape, setup: Setup) -> Estimate:
    profiles = {ckpt: activation_profile(shape.arch, setup, checkpointing=ckpt) for ckpt in (False, True)}
    act, act_ckpt = ((p[0] if p else None) for p in (profiles[False], profiles[True]))
    est = Estimate(shape.source, shape.exact, shape.numel, shape.largest_layer_numel, setup)
    for stage, offload in _rows_wanted():
        supported, note = _supported(stage, offload)

        def states(offload, stage=stage):
            if stage == 3:
                return stage3_states(shape, setup, offload)
            return (*stage012_states(shape, setup, stage, offload), 0, 0)

        gpu, host, transient, gathered, staging = states(offload)
        nvme = 0
        if offload == "optimizer-nvme":
            # the swap file holds what optimizer-cpu keeps in host memory (and the engine asserts it)
            in_memory = states("optimizer-cpu")[1]
            nvme = in_memory["master"] + in_memory["optimizer"]
        resident = sum(gpu.values())
        total, total_ckpt = (
            _peak(resident, profiles[ckpt], gathered, staging, transient) for ckpt in (False, True)
        )
        cpu_node = setup.gpus_per_node * sum(host.values())
        ds_gpu, ds_cpu = deepspeed_bytes(shape.numel, shape.largest_layer_numel, stage, offload, setup)
        est.rows.append(
            Row(
                stage,
                offload,
                supported,
                note,
                gpu,
                host,
                transient,
                gathered + staging,
                act,
                act_ckpt,
                total,
                total_ckpt,
                cpu_node,
                _fits(total, cpu_node, setup) if supported else False,
                _fits(total_ckpt, cpu_node, setup) if supported else False,
                ds_gpu,
                ds_cpu,
                nvme,
            )
        )
    _recommend(est)
    return est


_OFFLOAD_SLOWNESS = {"none": 0, "optimizer-cpu": 1, "optimizer+params-cpu": 2, "optimizer-nvme": 3}


def speed_order(rows: list[Row], ckpt_already_on: bool) -> list[tuple[Row, bool]]:
    """Fastest first: no offload before offload (cpu, then cpu+params, then nvme), lower stage first, and a
    configuration without activation checkpointing (~30% more compute) before the same one with it."""
    plain = sorted(rows, key=lambda r: (_OFFLOAD_SLOWNESS[r.offload], r.stage))
    out = []
    for slowness in sorted(set(_OFFLOAD_SLOWNESS.values())):
        group = [r for r in plain if _OFFLOAD_SLOWNESS[r.offload] == slowness]
        out += [(r, ckpt_already_on) for r in group]
        if not ckpt_already_on:
            out += [(r, True) for r in group]
    return out


def _recommend(est: Estimate) -> None:
    setup = est.setup
    if setup.gpu_memory_bytes is None:
        est.recommendation = (
            "No GPU memory given (and no GPU visible): pass --gpu-memory 80GiB to check fits."
        )
        return
    for row, ckpt in speed_order([r for r in est.rows if r.supported], setup.activation_checkpointing):
        if row.fits_ckpt if ckpt else row.fits:
            est.recommended = (row.stage, row.offload, ckpt)
            extra = " with activation checkpointing" if ckpt and not setup.activation_checkpointing else ""
            total = row.gpu_total_ckpt_bytes if ckpt else row.gpu_total_bytes
            est.recommendation = (
                f"Recommended: zero stage {row.stage}"
                + ("" if row.offload == "none" else f", offload {row.offload}")
                + f"{extra} ({total / 2**30:.1f} of {setup.gpu_memory_bytes / 2**30:.1f} GiB per GPU)."
            )
            return
    est.recommendation = (
        f"Nothing fits in {setup.gpu_memory_bytes / 2**30:.1f} GiB per GPU: use more GPUs (--gpus/--nodes), "
        "a smaller --micro-batch or --seq-len, or a smaller model."
    )


def setup_fields_from_engine(options) -> dict:
    """Setup keyword arguments taken from a recipe's `EngineOptions` (zero/options.py)."""
    z, p, o = options.zero, options.precision, options.optimizer
    return {
        "dtype": p.dtype,
        "communication_dtype": p.communication_dtype,
        "optimizer": o.name,
        "momentum": o.momentum,
        "reduce_bucket_size": z.reduce_bucket_size,
        "overlap_comm": z.overlap_comm,
        "stage3_prefetch_bucket_size": z.stage3_prefetch_bucket_size,
        "stage3_param_persistence_threshold": z.stage3_param_persistence_threshold,
        "stage3_max_live_parameters": z.stage3_max_live_parameters,
        "nvme_buffer_count": z.offload_optimizer.buffer_count,
    }
