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
    1]), wherever that gives the reducing path's values bit for bit: the comm dtype is fp32 or the compute
    dtype (no rounding skipped), and stages 0/1 (which accumulate micro-steps in the compute dtype) train in
    fp32 or take one micro-step per window. Dtypes by name (protocol.DTYPES)."""
    if world_size != 1 or offload:
        return False
    if comm_dtype not in ("fp32", dtype):
        return False
    return stage == 2 or dtype == "fp32" or gradient_accumulation_steps == 1


def staging_limit(overlap: bool, max_in_flight: int = STAGING_MAX_IN_FLIGHT) -> int:
    """Staging buffers flat.BackwardReducer keeps before it waits for the oldest reduce-scatter."""
    return max(1, max_in_flight) if overlap else 1


def stage2_staging_buffers(
    lay: Layout, registration_names, overlap: bool, max_in_flight: int = STAGING_MAX_IN_FLIGHT
) -> int:
    """How many staging buffers reducer.BackwardReducer holds after one backward.

    Replays its policy (see [Note: stage-2 buffers] in flat/reducer.py) with grads arriving in reverse
    registration order (the engine's bucket order; a tied weight arrives last): a bucket takes a buffer at its
    first grad, buckets are issued in index order once complete, and a buffer returns when its reduce-scatter
    completes. Buffers are never freed, so the count reached is what memory_bytes() reports. The two groups'
    grads interleave (a Linear's weight and bias), so a no-decay bucket typically holds a buffer for the whole
    backward while the decay buckets cycle through the others.
    """
    limit = staging_limit(overlap, max_in_flight)
    buckets = lay.buckets
    slots_left = [len(lay.slots_in(b)) for b in buckets]
    slot_of = {s.name: s for s in lay.params}
    arrival = [slot_of[n] for n in reversed(list(registration_names)) if n in slot_of]
    free = allocated = 0
    held: set[int] = set()
    inflight: deque = deque()
    next_issue = 0

    def take(index: int) -> None:
        nonlocal free, allocated
        if index in held:
            return
        if not free and allocated >= limit and inflight:
            inflight.popleft()
            free += 1
        if free:
            free -= 1
        else:
            allocated += 1
        held.add(index)

    def issue(index: int) -> None:
        nonlocal free, next_issue
        take(index)
        held.discard(index)
        inflight.append(index)
        next_issue += 1
        if not overlap:
            inflight.popleft()
            free += 1

    for slot in arrival:
        take(slot.bucket)
        slots_left[slot.bucket] -= 1
        while next_issue < len(buckets) and slots_left[next_issue] == 0:
            issue(next_issue)
    while next_issue < len(buckets):
        issue(next_issue)
    return allocated


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
