"""The engine's construction decisions, without tensors: param groups, bucket order, layouts, buffer policy.

The engine (param_groups.py, flat/flat_sharding.py, flat/reducer.py, stage3/unit_buffers.py) and
`estimate-memory` (memory/engine_layout.py) both call these functions, so the estimate follows the engine by
construction instead of restating its choices. Torch-free, like layout.py whose arithmetic it drives, so that
`estimate-memory --params` answers without importing torch.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from .layout import Layout, ParamSpec, plan_layout

DECAY_GROUP = 0
NO_DECAY_GROUP = 1

STAGING_MAX_IN_FLIGHT = 2
"""Stage 2 with overlap: staging buffers (reduce-scatters in flight) kept at most ([Note: stage-2 buffers])."""


# ---- param groups ----------------------------------------------------------------------------------------
def default_num_groups(decay_1d: bool) -> int:
    """decay_1d: one group, all decayed; otherwise always two (an empty one is kept, so that DECAY_GROUP and
    NO_DECAY_GROUP mean the same group index everywhere)."""
    return 1 if decay_1d else 2


def default_group(ndim: int, decay_1d: bool) -> int:
    """The default group of a trainable param of `ndim` dims: with decay_1d DeepSpeed's `model.parameters()`
    (one group); otherwise nanoGPT's rule, decay on matrices and embeddings, none on biases and norms."""
    return DECAY_GROUP if decay_1d or ndim >= 2 else NO_DECAY_GROUP


def default_specs(specs: Iterable[ParamSpec], decay_1d: bool) -> list[ParamSpec]:
    """Trainable specs (registration order) with the default group of each."""
    return [ParamSpec(s.name, tuple(s.shape), default_group(len(s.shape), decay_1d)) for s in specs]


# ---- layouts ---------------------------------------------------------------------------------------------
def bucket_order(specs: Sequence[ParamSpec]) -> list[ParamSpec]:
    """Groups in index order, each group's params in reverse of the given (registration) order: the last
    layers' grads are ready first in backward, so they fill bucket 0 and its reduction starts first."""
    groups = sorted({s.group for s in specs})
    return [s for g in groups for s in reversed([t for t in specs if t.group == g])]


def layout_world(stage: int, world_size: int) -> int:
    """The world a stage 0-2 layout is planned for: stage 0 replicates, so one rank holds every bucket."""
    return 1 if stage == 0 else world_size


def flat_layout(specs: Sequence[ParamSpec], stage: int, world_size: int, bucket_numel: int) -> Layout:
    """The stage 0-2 layout of trainable `specs` given in registration order with their groups."""
    return plan_layout(bucket_order(specs), layout_world(stage, world_size), bucket_numel)


def unit_layout(specs: Sequence[ParamSpec], world_size: int) -> Layout:
    """A stage-3 unit's layout: bucket_numel = the whole unit, so exactly one bucket per param group (the
    unit is gathered and reduced as one piece)."""
    return plan_layout(list(specs), world_size, max(1, sum(s.numel for s in specs)))


# ---- buffers ---------------------------------------------------------------------------------------------
def accumulates_directly(
    stage: int, world_size: int, offload: bool, dtype: str, comm_dtype: str, gradient_accumulation_steps: int
) -> bool:
    """World size 1 without offload: grads go straight into the fp32 shards (flat/reducer.py [Note: world size
    1]; stage 3: stage3/schedule.py), wherever that gives the reducing path's values bit for bit: the comm
    dtype is fp32 or the compute dtype (no rounding skipped), and stages 0/1 (which accumulate micro-steps in
    the compute dtype) train in fp32 or take one micro-step per window. Dtypes by name (protocol.DTYPES)."""
    if world_size != 1 or offload:
        return False
    if comm_dtype not in ("fp32", dtype):
        return False
    return stage >= 2 or dtype == "fp32" or gradient_accumulation_steps == 1


def grads_in_compute_dtype(
    direct: bool, dtype: str, gradient_accumulation_steps: int, fused_step: bool, master_dtype: str = "fp32"
) -> bool:
    """[Note: compute-dtype grads] in zero/grad_shards.py: the direct path keeps a 16-bit window's grads in the
    compute dtype, when the window is one micro-step (nothing to accumulate: the fp32 copy would be the exact
    upcast of what the step reads) and the step reads them as they are: the fused step (which upcasts in its
    kernel) or torch's over a master of that dtype ([Note: bf16 master]; torch's fused AdamW wants grads in the
    master's dtype). Dtypes by name (protocol.DTYPES)."""
    reads_them = fused_step or master_dtype == dtype
    return direct and dtype != "fp32" and gradient_accumulation_steps == 1 and reads_them


def master_is_params(stage: int, world_size: int, offload: bool, dtype: str, master_dtype: str) -> bool:
    """[Note: master is params] in zero/flat/flat_sharding.py: stages 0-2 where a rank steps whole buckets
    (stage 0, or one rank) and the master has the params' dtype (fp32 training, or pure bf16) on the device:
    the flat param buffers are the master, not a copy of it. Dtypes by name (protocol.DTYPES)."""
    return stage < 3 and (stage == 0 or world_size == 1) and not offload and dtype == master_dtype


def gathers_from_master(offload_optimizer: str, offload_param: str) -> bool:
    """Stage 3 keeps no compute-dtype shard when the fp32 master and the units' shards both stay on the
    compute device (offload devices by name: "none", "cpu", "nvme"): a unit's gather casts its fp32 master
    slice into the all-gather input ([Note: gather from master] in stage3/unit_buffers.py). FSDP2's design:
    its sharded fp32 param is the master; it saves the shard, 2 bytes per param / world in bf16. With either
    offload the shard stays: a gather from a host master would be bound by PCIe."""
    return offload_optimizer == "none" and offload_param == "none"


def aliases_gathered(
    world_size: int, offload_param: str, from_master: bool, dtype: str, master_dtype: str
) -> bool:
    """stage3/unit_buffers.py [Note: world size 1 aliases]: at world size 1 a stage-3 unit's gathered params
    are views of what it already holds, with no full buffer, where that sits on the compute device in the
    compute dtype: the params are not offloaded (an offloaded shard is a host->device copy), and a unit that
    gathers from its master has a master of the compute dtype (fp32 training, or pure bf16: an fp32 master
    under a 16-bit model needs its cast). Offload devices and dtypes by name."""
    return world_size == 1 and offload_param == "none" and (not from_master or master_dtype == dtype)


def host_waits_at_boundary(device_type: str, grad_shards_device_type: str) -> bool:
    """At an accumulation boundary the host waits for the device only when it reads grads the device wrote:
    grad shards on the host ("cpu": optimizer offload) while training on an accelerator ([Note: boundary
    sync] in sharding.py). Device types by name, as torch.device.type."""
    return grad_shards_device_type == "cpu" and device_type != "cpu"


def sums_window_on_device(offload_optimizer: str, gradient_accumulation_steps: int) -> bool:
    """Stages 2/3: a window's reduced grads are summed on the device and copied into the host grad shard once,
    from its last backward ([Note: device-summed window] in reduce.py): grad shards off the device and more
    than one micro-step a window."""
    return offload_optimizer != "none" and gradient_accumulation_steps > 1


def staging_limit(overlap: bool, max_in_flight: int = STAGING_MAX_IN_FLIGHT) -> int:
    """Staging buffers flat.BackwardReducer keeps before it waits for the oldest reduce-scatter."""
    return max(1, max_in_flight) if overlap else 1


@dataclass(frozen=True)
class StagingTake:
    """What a bucket's first grad costs (`StagingPool.take`)."""

    complete_oldest: bool
    """Complete the oldest in-flight reduce-scatter first (its buffer is the one reused)."""
    allocate: bool
    """Allocate a new staging buffer; False: reuse a free one."""


class IssueOrder:
    """The one order reduce units (stage-2 buckets, stage-3 units) are issued in, the same on every rank
    whatever order autograd produces grads in: a unit is complete once all of its grads have arrived, and is
    issued once every unit before it in `order` was. Torch-free: stage 2's StagingPool (so estimate-memory's
    simulation too) and stage 3's Stage3Schedule count with it; the caller issues."""

    def __init__(self, order: Sequence[int], grads_per_unit: Sequence[int]):
        """order: unit indices, first issued first; grads_per_unit[u]: the grads unit u waits for."""
        self.order = list(order)
        self.grads_per_unit = list(grads_per_unit)
        self.reset()

    def reset(self) -> None:
        """A new backward: nothing arrived, nothing issued."""
        self.arrived_counts = [0] * len(self.grads_per_unit)
        self.next = 0
        """Position in `order` of the next unit to issue."""

    def arrive(self, unit: int) -> bool:
        """One more of unit's grads arrived; True when that completes the unit."""
        self.arrived_counts[unit] += 1
        return self.arrived_counts[unit] == self.grads_per_unit[unit]

    def issuable(self) -> list[int]:
        """The complete units that may be issued now, in order (each then `issued`)."""
        out = []
        position = self.next
        while position < len(self.order):
            unit = self.order[position]
            if self.arrived_counts[unit] < self.grads_per_unit[unit]:
                break
            out.append(unit)
            position += 1
        return out

    def unissued(self) -> list[int]:
        """End of backward: every unit not issued yet, in order (its missing grads count as zero)."""
        return self.order[self.next :]

    def issued(self, unit: int) -> None:
        assert unit == self.order[self.next], (unit, self.order[self.next])
        self.next += 1

    @property
    def started(self) -> bool:
        """A grad of this backward arrived or a unit was issued."""
        return self.next > 0 or any(self.arrived_counts)


class StagingPool:
    """The stage-2 staging buffer policy of [Note: stage-2 buffers] (flat/reducer.py), without tensors.

    flat.BackwardReducer asks it for every decision and keeps the tensors; `stage2_staging_buffers` drives
    it with the simulated arrival order, so the estimate counts the buffers the engine allocates by
    construction. Per backward: `grad_ready(b)` for each grad (after `take(b)` gave its bucket a buffer)
    returns the buckets to issue now, in index order; `issue(b)` for each; `unissued()` at the end, then
    `complete_oldest()` until nothing is in flight. Buffers are never given back to the allocator: the
    free ones are reused by later buckets and later backwards.
    """

    def __init__(self, slot_counts: Sequence[int], overlap: bool, max_in_flight: int = STAGING_MAX_IN_FLIGHT):
        self.slot_counts = list(slot_counts)
        """Grads each bucket waits for before it is issued."""
        self.overlap = overlap
        self.limit = staging_limit(overlap, max_in_flight)
        self.allocated = 0
        """Staging buffers allocated so far (all of them held, in flight or free)."""
        self.free = 0
        self.held: set[int] = set()
        """Buckets holding a buffer, not yet issued."""
        self.in_flight: deque[int] = deque()
        """Issued buckets whose reduce-scatter is not completed, oldest first."""
        self.order = IssueOrder(range(len(self.slot_counts)), self.slot_counts)
        """Buckets are issued in index order."""

    def take(self, bucket: int) -> StagingTake | None:
        """Bucket's grad arrives: None when it holds a buffer already; otherwise it takes one, first
        completing the oldest reduce-scatter when no buffer is free and `limit` are allocated."""
        if bucket in self.held:
            return None
        complete = not self.free and self.allocated >= self.limit and bool(self.in_flight)
        if complete:
            self.complete_oldest()
        allocate = not self.free
        if allocate:
            self.allocated += 1
        else:
            self.free -= 1
        self.held.add(bucket)
        return StagingTake(complete, allocate)

    def grad_ready(self, bucket: int) -> list[int]:
        """One more of bucket's grads was staged: the buckets now complete in index order, to issue."""
        self.order.arrive(bucket)
        return self.order.issuable()

    def unissued(self) -> list[int]:
        """End of backward: every bucket not issued yet, in index order (missing grads count as zero)."""
        return self.order.unissued()

    def issue(self, bucket: int) -> bool:
        """Bucket (holding a buffer: `take` first) is issued. True: complete it at once (no overlap)."""
        assert bucket in self.held, bucket
        self.order.issued(bucket)
        self.held.discard(bucket)
        self.in_flight.append(bucket)
        if not self.overlap:
            self.complete_oldest()
            return True
        return False

    def complete_oldest(self) -> int:
        """The oldest in-flight bucket's reduce-scatter completes, its buffer is free again; returns it."""
        bucket = self.in_flight.popleft()
        self.free += 1
        return bucket

    def end_backward(self) -> None:
        """Every bucket was issued and completed: the next backward starts from bucket 0 again."""
        assert not self.held and not self.in_flight, (self.held, self.in_flight)
        self.order.reset()

    def discard(self) -> None:
        """The window was dropped (its reduce-scatters awaited by the caller): every buffer is free again and
        the next backward starts from bucket 0."""
        self.free = self.allocated
        self.held.clear()
        self.in_flight.clear()
        self.end_backward()

    @property
    def busy(self) -> bool:
        """A backward is under way (a grad staged, a bucket issued or in flight)."""
        return self.order.started or bool(self.in_flight)


def stage2_staging_buffers(
    lay: Layout, registration_names, overlap: bool, max_in_flight: int = STAGING_MAX_IN_FLIGHT
) -> int:
    """How many staging buffers reducer.BackwardReducer holds after one backward.

    Drives the reducer's own `StagingPool` with grads arriving in reverse registration order (the engine's
    bucket order; a tied weight arrives last), as the reducer's hooks do. Buffers are never freed, so the
    count reached is what memory_bytes() reports. The two groups' grads interleave (a Linear's weight and
    bias), so a no-decay bucket typically holds a buffer for the whole backward while the decay buckets cycle
    through the others.
    """
    pool = StagingPool([len(lay.slots_in(b)) for b in lay.buckets], overlap, max_in_flight)
    slot_of = {s.name: s for s in lay.params}
    arrival = [slot_of[n] for n in reversed(list(registration_names)) if n in slot_of]

    def issue(index: int) -> None:
        pool.take(index)
        pool.issue(index)

    for slot in arrival:
        pool.take(slot.bucket)
        for index in pool.grad_ready(slot.bucket):
            issue(index)
    for index in pool.unissued():
        issue(index)
    while pool.in_flight:
        pool.complete_oldest()
    pool.end_backward()
    return pool.allocated


# ---- grad shard segments ---------------------------------------------------------------------------------
GRAD_SEGMENT_NUMEL = 1 << 25
"""World size 1 (the direct path): at most this many elements per grad shard segment, a run of whole params
(a bigger param is a segment of its own). 128 MiB of fp32: the backward peak holds about one, and GPT-1.3B's
shard is ~40 segments (40 fused optimizer calls, noise beside a 280 ms step)."""


@dataclass(frozen=True)
class GradSegment:
    """A piece of a rank's fp32 grad shard that is allocated and freed as one ([Note: released grad shards]
    in zero/grad_shards.py). It lies inside one bucket's shard, so the optimizer steps it as one chunk."""

    group: int
    offset: int
    """First element inside this rank's flat shard of `group`."""
    numel: int
    bucket: int
    """The bucket (stages 0-2) or unit bucket (stage 3) whose shard holds it."""
    bucket_offset: int = 0
    """Where it starts inside that bucket's shard."""


def flat_grad_segments(lay: Layout, direct: bool, max_numel: int | None = None) -> list[GradSegment]:
    """Stages 0-2: one segment per bucket shard (a reduce-scatter writes the whole of it); in the direct path
    (world size 1, where a bucket is a whole shard and carries no collective) each bucket cut at param
    boundaries into runs of at most `max_numel` (default GRAD_SEGMENT_NUMEL) elements, the last one taking
    the bucket's padding."""
    max_numel = max_numel or GRAD_SEGMENT_NUMEL
    out: list[GradSegment] = []
    for b in lay.buckets:
        base = lay.bucket_shard_offset(b)
        cuts = [0]
        if direct:
            filled = 0
            for slot in lay.slots_in(b):
                if filled and filled + slot.numel > max_numel:
                    cuts.append(slot.offset)
                    filled = 0
                filled += slot.numel
        cuts.append(b.shard_numel)
        for lo, hi in zip(cuts, cuts[1:], strict=False):
            out.append(GradSegment(b.group, base + lo, hi - lo, b.index, lo))
    return out
