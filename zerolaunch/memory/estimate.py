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
publish copies all-gathered back into the params). Stages 0-2 without offload free their fp32 grad shard
between steps ([Note: released grad shards] in zero/grad_shards.py): it is counted with the rest of
backward (written from the backward hooks: stage 2 and world size 1) and with the step, not under the loss.
"""

from __future__ import annotations

import dataclasses
from dataclasses import asdict, dataclass, field, replace

from zerolaunch.memory import engine_layout as el
from zerolaunch.memory.activation_offload import offloaded_host_bytes, profile_for
from zerolaunch.memory.deepspeed import deepspeed_bytes
from zerolaunch.memory.shape import ModelShape
from zerolaunch.memory.stage3 import largest_unit_shard, offload_devices, stage3_states
from zerolaunch.util.sizes import DTYPE_BYTES, EstimateError, positive_int
from zerolaunch.zero import plan
from zerolaunch.zero.option_rules import option_problems
from zerolaunch.zero.options import EngineOptions, bucket_numel

OFFLOADS = ("none", "optimizer-cpu", "optimizer+params-cpu", "optimizer-nvme", "optimizer+params-nvme")
STATE_KEYS = ("params", "grads", "master", "optimizer", "buckets")
# Per-element optimizer state (fp32): Adam keeps exp_avg + exp_avg_sq, SGD a momentum buffer if any.
_STATE_TENSORS = {"adamw": 2, "adam": 2, "sgd": 1}


@dataclass(frozen=True)
class Setup:
    gpus_per_node: int = 1
    nodes: int = 1
    micro_batch: int = 1
    seq_len: int = 1024
    activation_checkpointing: bool = False
    """Which activation figure the total uses (both are always shown)."""
    engine: EngineOptions = field(default_factory=EngineOptions)
    """The engine's options the rows price (a recipe's `engine` as it is), with the engine's defaults: the
    dtypes, the optimizer (its state tensors; `decay_1d`: one param group or two, each its own padded flat
    buffer with its own buckets; `fused_step`: [Note: compute-dtype grads] in zero/grad_shards.py), the
    buckets, the stage-3 budgets and offload_optimizer.buffer_count. Each row sets its own stage and offload.
    A bf16 `precision.master_dtype` is never offloaded, so only the rows without offload are estimated."""
    activation_offload: bool = False
    """train.activation_offload: the saved activations are priced in host memory (memory/activation_offload.py)."""
    gpu_memory_bytes: int | None = None
    cpu_memory_bytes: int | None = None
    """Host RAM per node; when known, a row also has to fit there."""
    headroom: float = 0.1
    """Fraction of GPU memory and host RAM a recommended row leaves free (fragmentation, CUDA context,
    the allocator's cache, other processes)."""

    def __post_init__(self):
        positive_int(self.gpus_per_node, "--gpus")
        positive_int(self.nodes, "--nodes")
        positive_int(self.micro_batch, "--micro-batch")
        positive_int(self.seq_len, "--seq-len")
        if isinstance(self.headroom, bool) or not 0 <= self.headroom < 1:
            raise EstimateError(
                f"--headroom must be a fraction in [0, 1), e.g. 0.1 for 10%, got {self.headroom!r}"
            )
        # the engine's own rules: options it would refuse are not priced
        problems = option_problems(self.engine)
        if problems:
            raise EstimateError(f"engine option {problems[0].message()}")

    @property
    def dtype(self) -> str:
        """The compute dtype (the engine's `precision.dtype`)."""
        return self.engine.precision.dtype

    @property
    def world_size(self) -> int:
        return self.gpus_per_node * self.nodes

    @property
    def dtype_bytes(self) -> int:
        return DTYPE_BYTES[self.dtype]

    def grad_bytes(self, stage: int, offload: str) -> int:
        """Bytes per element of the engine's grad shard at `stage` / `offload`: 4, or the compute dtype's at
        world size 1 ([Note: compute-dtype grads] in zero/grad_shards.py)."""
        p = self.engine.precision
        return el.grad_shard_bytes(
            stage,
            self.world_size,
            offload,
            p.dtype,
            p.communication_dtype,
            self.engine.optimizer.fused_step,
            p.master_dtype,
        )

    @property
    def master_bytes(self) -> int:
        """Bytes per element of the master and of each optimizer state tensor."""
        return DTYPE_BYTES[self.engine.precision.master_dtype]

    @property
    def comm_bytes(self) -> int:
        return DTYPE_BYTES[self.engine.precision.communication_dtype or "fp32"]

    @property
    def optimizer_state_tensors(self) -> int:
        o = self.engine.optimizer
        if o.name == "sgd" and o.momentum == 0:
            return 0
        return _STATE_TENSORS[o.name]

    @property
    def usable_gpu_bytes(self) -> int | None:
        """GPU memory a row may use: all of it less the headroom (None when unknown)."""
        g = self.gpu_memory_bytes
        return None if g is None else int(g * (1 - self.headroom))

    @property
    def usable_cpu_bytes(self) -> int | None:
        c = self.cpu_memory_bytes
        return None if c is None else int(c * (1 - self.headroom))

    def overlap(self, stage: int) -> bool:
        """The engine's overlap_comm at `stage` (None: DeepSpeed's default, on for stage 3 only)."""
        return replace(self.engine.zero, stage=stage).overlap


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
    """Peak within the usable GPU memory and host bytes within the usable host RAM (None: GPU unknown)."""
    fits_ckpt: bool | None
    deepspeed_gpu_bytes: int | None = None
    deepspeed_cpu_node_bytes: int | None = None
    nvme_bytes: int = 0
    """Per rank on disk: the swap files (offload_optimizer nvme: fp32 master + optimizer moments;
    offload_param nvme: the compute-dtype shards of the stage-3 units)."""
    misfit: str = ""
    """What does not fit without checkpointing: "", "GPU", "host RAM" or "GPU, host RAM"."""
    misfit_ckpt: str = ""
    max_micro_batch: int | None = None
    """Largest micro-batch whose peak fits the usable GPU memory (0: not even 1; None: GPU memory or model
    sizes unknown). Host bytes do not depend on it."""
    max_micro_batch_ckpt: int | None = None

    @property
    def label(self) -> str:
        return f"stage {self.stage}" + ("" if self.offload == "none" else f" + {self.offload}")


@dataclass
class Estimate:
    source: str
    exact: bool
    numel: int
    """Trainable elements."""
    largest_layer_numel: int
    setup: Setup
    rows: list[Row] = field(default_factory=list)
    recommendation: str = ""
    recommended: tuple[int, str, bool] | None = None
    """(stage, offload, activation checkpointing) of the recommended row, or None."""
    frozen_numel: int = 0
    """Frozen floating-point elements (a LoRA base): no grad, master or optimizer state."""

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
                "frozen_params": self.frozen_numel,
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
    """(gpu, host, step transient, released grads, released grads written in backward) bytes of the stage 0-2
    engine (zero/engine.py, zero/flat/reducer.py). The stage-2 staging buffers are allocated once and kept, so
    they are resident ("buckets"). gpu["grads"] counts the fp32 grad shard, which the engine holds only from
    the first gradient write of a window to the step when it is on the device ([Note: released grad shards]
    in zero/grad_shards.py): those bytes are returned as "released", for the peak to place them."""
    b, c, world = setup.dtype_bytes, setup.comm_bytes, setup.world_size
    precision = setup.engine.precision
    lay = el.stage012_layout(
        shape.specs,
        stage,
        world,
        bucket_numel(setup.engine.zero.reduce_bucket_size, offload != "none"),
        decay_1d=setup.engine.optimizer.decay_1d,
    )
    shard = el.shard_numel(lay)
    gpu, host = _zero_states(), _zero_states()
    # flat_params.buffers (padded, compute dtype) + frozen params, whole on every rank and cast to the compute
    # dtype by model.to() (a non-float one keeps its dtype), as DeepSpeed keeps them at stages 0-2.
    gpu["params"] = b * lay.padded_numel + b * shape.frozen_numel + shape.frozen_fixed_bytes
    # zero/flat/reducer.py [Note: world size 1]: one rank, no offload and a comm dtype that rounds nothing:
    # grads go straight into the fp32 shard (no full grads, staging or reduce copies; stages 0/1 as the engine
    # does for one micro-step per window, which is what this estimate assumes), in the compute dtype with the
    # fused step or a bf16 master ([Note: compute-dtype grads] in zero/grad_shards.py).
    direct = el.accumulates_directly(stage, world, offload, precision.dtype, precision.communication_dtype)
    grad_bytes = setup.grad_bytes(stage, offload)
    # master, grad shard and optimizer state all live on the master device (the host when offloaded); the
    # master is the params themselves at stage 0 or one rank when it has their dtype ([Note: master is
    # params] in zero/flat/flat_sharding.py).
    states = gpu if offload == "none" else host
    master_is_params = el.master_is_params(stage, world, offload, precision.dtype, precision.master_dtype)
    states["master"] = 0 if master_is_params else setup.master_bytes * shard
    states["grads"] = grad_bytes * shard
    # the step count shared by every element is a Python int (zero/optim/shard_optimizer.py), not a tensor.
    states["optimizer"] = setup.master_bytes * shard * setup.optimizer_state_tensors
    if direct:
        reduce_transient = 0
    elif stage in (0, 1):
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
        # zero/optim/shard_optimizer.py + nvme_store.py: master + moments in the swap file (Row.nvme_bytes);
        # the host keeps the fp32 grad shard and buffer_count staging buffers of one bucket's shard x (master
        # + moments), which the engine reports as "optimizer".
        host["master"] = 0
        host["optimizer"] = el.nvme_staging_bytes(
            setup, max((bk.shard_numel for bk in lay.buckets), default=0)
        )
    # the flat step (zero/flat/flat_sharding.py) keeps every bucket's compute-dtype copy of its master slice
    # until all gathers land; stage 0 and world size 1 write the params in place.
    publish_transient = 0 if stage == 0 or world == 1 else b * shard
    released = grad_bytes * shard if offload == "none" else 0
    # written from the backward hooks (direct, stage 2) or only by the step's reduction (stages 0/1). Under the
    # peak just after the loss only the first segments backward writes are held: a layer's weight and bias
    # open one in each param group, so the largest segment of each group stands for them (the others are
    # allocated while backward frees more activations than they take).
    segments = el.grad_segments(lay, direct)
    first = sum(
        max((g.numel for g in segments if g.group == k), default=0) for k in {g.group for g in segments}
    )
    in_backward = grad_bytes * first if released and (direct or stage == 2) else 0
    return gpu, host, max(reduce_transient, publish_transient), released, in_backward


def _supported(stage: int, offload: str) -> tuple[bool, str]:
    if stage == 0 and offload != "none":
        return False, "offload needs stage >= 1"
    if offload.startswith("optimizer+params") and stage != 3:
        return False, "param offload needs stage 3"
    return True, ""


def _rows_wanted(setup: Setup):
    for stage in (0, 1, 2, 3):
        for offload in OFFLOADS:
            ok, _ = _supported(stage, offload)
            if ok and (offload == "none" or setup.engine.precision.master_dtype == "fp32"):
                yield stage, offload


def _misfit(gpu_total: int, cpu_node: int, setup: Setup) -> str | None:
    """What does not fit ("" = all fits); None when the GPU memory is unknown."""
    gpu, cpu = setup.usable_gpu_bytes, setup.usable_cpu_bytes
    if gpu is None:
        return None
    short = (("GPU", gpu_total > gpu), ("host RAM", cpu is not None and cpu_node > cpu))
    return ", ".join(name for name, over in short if over)


def _peak(resident: int, profile, gathered: int, staging: int, step_transient: int) -> int:
    """Per-GPU peak; see [Note: peak]. profile = (activations at the loss, after it) or None."""
    at_loss, after_loss = profile or (0, 0)
    return resident + max(at_loss + gathered, after_loss + gathered + staging, step_transient)


_MAX_MICRO_BATCH = 1 << 20


def _max_micro_batch(shape: ModelShape, setup: Setup, ckpt: bool, peak_of) -> int | None:
    """Largest micro-batch whose peak (`peak_of(profile)`) fits the usable GPU memory: activations grow
    monotonically with it, so double, then bisect. None when the GPU memory or the model sizes are unknown."""
    usable = setup.usable_gpu_bytes
    if usable is None or shape.arch is None:
        return None

    def fits(mb: int) -> bool:
        profile = profile_for(setup)(
            shape.arch, dataclasses.replace(setup, micro_batch=mb), checkpointing=ckpt
        )
        return peak_of(profile) <= usable

    if not fits(1):
        return 0
    lo, hi = 1, 2
    while hi <= _MAX_MICRO_BATCH and fits(hi):
        lo, hi = hi, hi * 2
    if hi > _MAX_MICRO_BATCH:
        return lo
    while hi - lo > 1:  # fits(lo), not fits(hi)
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if fits(mid) else (lo, mid)
    return lo


def _device_window_sums(setup: Setup, stage: int, offload: str, host_grads: int) -> int:
    """GPU bytes of the fp32 sums a window's reduced grads accumulate in when the grad shard is offloaded and a
    window has several micro-steps ([Note: device-summed window] in zero/reduce.py): one more fp32 grad shard,
    the size of the host one. Resident, not released: made by the window's first backward, they are all
    there through every later micro-step's forward and loss, the peak this estimate prices."""
    if stage < 2 or not plan.sums_window_on_device(
        offload_devices(offload)[0], setup.engine.gradient_accumulation_steps
    ):
        return 0
    return host_grads


def _states(shape: ModelShape, setup: Setup, stage: int, offload: str):
    """(gpu, host, step transient, gathered bytes, staging bytes, nvme bytes per rank, released grads, released
    grads written in backward) of one row."""
    if stage == 3:
        gpu, host, transient, gathered, staging, nvme = stage3_states(shape, setup, offload)
        # as stage 2's: a unit's fp32 grad segments (one per param group) are allocated by its first reduce or
        # grad in backward and freed after the step ([Note: released grad shards] in zero/grad_shards.py);
        # after the loss, about one unit's: the largest stands for it.
        released = gpu["grads"]
        threshold, world = setup.engine.zero.stage3_param_persistence_threshold, setup.world_size
        unit = largest_unit_shard(shape, world, threshold, setup.engine.optimizer.decay_1d) if released else 0
        gpu["grads"] += _device_window_sums(setup, stage, offload, host["grads"])
        return gpu, host, transient, gathered, staging, nvme, released, setup.grad_bytes(3, offload) * unit
    gpu, host, transient, released, in_backward = stage012_states(shape, setup, stage, offload)
    gpu["grads"] += _device_window_sums(setup, stage, offload, host["grads"])
    nvme = 0
    if offload == "optimizer-nvme":
        # the swap file holds what optimizer-cpu keeps in host memory (and the engine asserts it)
        in_memory = stage012_states(shape, setup, stage, "optimizer-cpu")[1]
        nvme = in_memory["master"] + in_memory["optimizer"]
    return gpu, host, transient, 0, 0, nvme, released, in_backward


def estimate(shape: ModelShape, setup: Setup) -> Estimate:
    profiles = {ckpt: profile_for(setup)(shape.arch, setup, checkpointing=ckpt) for ckpt in (False, True)}
    offloaded = (
        offloaded_host_bytes(shape.arch, setup, checkpointing=setup.activation_checkpointing)
        if setup.activation_offload
        else 0
    )
    act, act_ckpt = ((p[0] if p else None) for p in (profiles[False], profiles[True]))
    est = Estimate(
        shape.source,
        shape.exact,
        shape.numel,
        shape.largest_layer_numel,
        setup,
        frozen_numel=shape.frozen_numel,
    )
    for stage, offload in _rows_wanted(setup):
        supported, note = _supported(stage, offload)
        gpu, host, transient, gathered, staging, nvme, released, in_backward = _states(
            shape, setup, stage, offload
        )
        # released grad shards are not under the loss's peak: they exist after it (written in backward) or
        # only in the step, on top of its own transient.
        resident = sum(gpu.values()) - released

        def peak_of(
            profile,
            resident=resident,
            gathered=gathered,
            staging=staging + in_backward,
            transient=transient + released,
        ):
            return _peak(resident, profile, gathered, staging, transient)

        total, total_ckpt = (peak_of(profiles[ckpt]) for ckpt in (False, True))
        cpu_node = setup.gpus_per_node * (sum(host.values()) + offloaded)
        # DeepSpeed's model_to_params counts every param, frozen ones too: its formulas know no frozen base
        all_numel = shape.numel + shape.frozen_numel
        ds_gpu, ds_cpu = deepspeed_bytes(all_numel, shape.largest_layer_numel, stage, offload, setup)
        misfit, misfit_ckpt = (_misfit(t, cpu_node, setup) for t in (total, total_ckpt))
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
                None if misfit is None else misfit == "",
                None if misfit_ckpt is None else misfit_ckpt == "",
                ds_gpu,
                ds_cpu,
                nvme,
                misfit or "",
                misfit_ckpt or "",
                _max_micro_batch(shape, setup, False, peak_of),
                _max_micro_batch(shape, setup, True, peak_of),
            )
        )
    _recommend(est)
    return est


# [Note: recommendation]
# Among the rows that fit with headroom (GPU peak <= (1 - headroom) x GPU memory, host bytes per node <=
# (1 - headroom) x host RAM), the cheapest by, in this order:
#   1. offload: none < optimizer cpu < optimizer+params cpu < optimizer nvme < optimizer+params nvme
#      (each moves more bytes over PCIe or to disk every step);
#   2. no activation checkpointing before checkpointing (~30% more compute);
#   3. communication per step: stages 0-2 move 2 x the params (all-reduce, or reduce-scatter + all-gather),
#      stage 3 3 x (an all-gather in forward and again in backward, plus the reduce-scatter);
#   4. the most GPU memory left (stages 0, 1 and 2 communicate the same, so the one with margin wins).
OFFLOAD_COST = {
    "none": 0,
    "optimizer-cpu": 1,
    "optimizer+params-cpu": 2,
    "optimizer-nvme": 3,
    "optimizer+params-nvme": 4,
}
RECOMMENDATION_RULE = (
    "Recommendation: of the rows that fit with the headroom on GPU and host RAM, the least offload (none < "
    "optimizer cpu < optimizer+params cpu < optimizer nvme < optimizer+params nvme), then no activation "
    "checkpointing, then the least communication (stages 0-2: 2x the params per step, stage 3: 3x), then the "
    "most GPU memory left."
)


def _comm_volume(stage: int) -> int:
    return 3 if stage == 3 else 2


def candidates(rows: list[Row], ckpt_already_on: bool) -> list[tuple[Row, bool]]:
    """Every (row, checkpointing) choice, cheapest first by [Note: recommendation] (fit not considered)."""
    out = []
    for r in rows:
        for ckpt in (True,) if ckpt_already_on else (False, True):
            total = r.gpu_total_ckpt_bytes if ckpt else r.gpu_total_bytes
            out.append(((OFFLOAD_COST[r.offload], ckpt, _comm_volume(r.stage), total), (r, ckpt)))
    return [choice for _, choice in sorted(out, key=lambda kv: kv[0])]


def _gib(nbytes: int) -> str:
    return f"{nbytes / 2**30:.1f} GiB"


def _recommend(est: Estimate) -> None:
    setup = est.setup
    if setup.gpu_memory_bytes is None:
        est.recommendation = (
            "No GPU memory given (and no GPU visible): pass --gpu-memory 80GiB to check fits."
        )
        return
    room = f"{setup.headroom:.0%} headroom"
    choices = candidates([r for r in est.rows if r.supported], setup.activation_checkpointing)
    for row, ckpt in choices:
        if row.fits_ckpt if ckpt else row.fits:
            est.recommended = (row.stage, row.offload, ckpt)
            extra = " with activation checkpointing" if ckpt and not setup.activation_checkpointing else ""
            total = row.gpu_total_ckpt_bytes if ckpt else row.gpu_total_bytes
            host = ""
            if row.cpu_node_bytes and setup.cpu_memory_bytes is not None:
                host = f", host {_gib(row.cpu_node_bytes)} of {_gib(setup.cpu_memory_bytes)} per node"
            est.recommendation = (
                f"Recommended: zero stage {row.stage}"
                + ("" if row.offload == "none" else f", offload {row.offload}")
                + f"{extra} ({total / 2**30:.1f} of {setup.gpu_memory_bytes / 2**30:.1f} GiB per GPU{host}; "
                f"{room})."
            )
            return
    est.recommendation = "Nothing fits with " + room + ": " + _what_is_short(choices, setup)


def _what_is_short(choices: list[tuple[Row, bool]], setup: Setup) -> str:
    """Name the resource that does not fit, with the figures of the row that comes closest."""

    def gpu_total(choice):
        row, ckpt = choice
        return row.gpu_total_ckpt_bytes if ckpt else row.gpu_total_bytes

    fix = "use more GPUs (--gpus/--nodes), a smaller --micro-batch or --seq-len, or a smaller model."
    on_gpu = [c for c in choices if gpu_total(c) <= setup.usable_gpu_bytes]
    if on_gpu:
        # the GPU is not the limit: the rows that fit there all need more host RAM than this node has.
        row, ckpt = min(on_gpu, key=lambda c: c[0].cpu_node_bytes)
        return (
            f"host RAM: needs {_gib(row.cpu_node_bytes)} per node ({row.label}"
            + (" + activation checkpointing" if ckpt else "")
            + f"), has {_gib(setup.cpu_memory_bytes)} ({_gib(setup.usable_cpu_bytes)} usable); "
            + (
                ""
                if row.offload.endswith("nvme")
                else "offload to nvme (zero.offload_optimizer.device: nvme), "
            )
            + "more nodes (each rank's host shard shrinks), or a node with more RAM (--cpu-memory)."
        )
    closest = min(choices, key=gpu_total)
    row, ckpt = closest
    also = ""
    if setup.usable_cpu_bytes is not None and row.cpu_node_bytes > setup.usable_cpu_bytes:
        also = f" (and host RAM: needs {_gib(row.cpu_node_bytes)}, has {_gib(setup.cpu_memory_bytes)})"
    return (
        f"GPU: needs {_gib(gpu_total(closest))} per GPU at least ({row.label}"
        + (" + activation checkpointing" if ckpt else "")
        + f"), has {_gib(setup.gpu_memory_bytes)} ({_gib(setup.usable_gpu_bytes)} usable){also}; {fix}"
    )
