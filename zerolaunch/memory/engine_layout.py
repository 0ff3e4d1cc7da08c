"""The engine's layout and buffer decisions, replayed without tensors.

This module owns the mirror of what `zero/engine.py` and `zero/flat.py` decide at construction and in
backward: the two weight-decay param groups (nanoGPT's rule, `zero/param_groups.py`), params in reverse
registration order, `plan_layout` over the data-parallel world (one rank for stage 0), and how many stage-2
staging buffers the backward reducer ends up holding. The arithmetic itself is layout.py's, imported, not
copied; only the engine's few choices (group rule, order, buffer policy) are restated here, each next to the
engine line it mirrors, and tests/unit/test_memory_engine.py holds them equal to a real Engine.

layout.py is torch-free and `zerolaunch.zero` loads its engine lazily, so `--params` answers without torch.
"""

from __future__ import annotations

from collections import deque

from zerolaunch.zero import layout

ParamSpec = layout.ParamSpec
plan_layout = layout.plan_layout

DECAY_GROUP, NO_DECAY_GROUP = 0, 1


def engine_specs(specs) -> list:
    """Specs as the engine orders them: decay group (2+ dims) then no-decay group, each in reverse
    registration order (engine.py: the last layers' grads are ready first in backward -> bucket 0)."""
    decay = [s for s in specs if len(s.shape) >= 2]
    no_decay = [s for s in specs if len(s.shape) < 2]
    return [ParamSpec(s.name, tuple(s.shape), DECAY_GROUP) for s in reversed(decay)] + [
        ParamSpec(s.name, tuple(s.shape), NO_DECAY_GROUP) for s in reversed(no_decay)
    ]


def stage012_layout(specs, stage: int, world_size: int, bucket_numel: int):
    """engine.py: `plan_layout(specs, 1 if stage == 0 else world_size, reduce_bucket_size)`."""
    return plan_layout(engine_specs(specs), 1 if stage == 0 else world_size, bucket_numel)


def shard_numel(lay) -> int:
    """Elements of one rank's fp32 shard over all groups (master, grad shard, each optimizer state)."""
    return sum(lay.shard_numel(g) for g in range(lay.num_groups))


def stage2_staging_buffers(lay, registration_names, overlap: bool, max_in_flight: int = 2) -> int:
    """How many staging buffers flat.BackwardReducer holds after one backward.

    Replays its policy (see [Note: stage-2 buffers] in zero/flat.py) with grads arriving in reverse
    registration order (the engine's bucket order; a tied weight arrives last): a bucket takes a buffer at
    its first grad, buckets are issued in index order once complete, and a buffer returns when its
    reduce-scatter completes. Buffers are never freed, so the count reached is what memory_bytes() reports.
    The two groups' grads interleave (a Linear's weight and bias), so a no-decay bucket typically holds a
    buffer for the whole backward while the decay buckets cycle through the others.
    """
    limit = max(1, max_in_flight) if overlap else 1
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


def max_padded_bucket(lay) -> int:
    return max((b.padded_numel for b in lay.buckets), default=0)


def nvme_staging_bytes(setup, largest_chunk_numel: int) -> int:
    """nvme.SwapStore's host buffers: buffer_count x the largest chunk x (master + moments), fp32."""
    return setup.nvme_buffer_count * 4 * (1 + setup.optimizer_state_tensors) * largest_chunk_numel
