"""Stage 3 per-rank bytes: unit shards, gathered units, resident small params, staging buckets.

Owns the replay of zero/stage3/partition.py (persistent = trainable params under the threshold, kept whole on
every rank; frozen ones under it stay whole too), zero/stage3/unit_buffers.py (per unit one bucket per param
group, padded to a multiple of world_size, then one frozen bucket: [Note: frozen buckets]; this rank keeps 1/world
of it in the compute dtype, unless the units gather from the fp32 master: zero.plan.gathers_from_master,
which never covers the frozen bucket) and zero/stage3/schedule.py's gather schedule (root unit gathered
throughout, the unit running now, plus the next units that fit in stage3_prefetch_bucket_size, within
stage3_max_live_parameters, plus the units stage3_max_reuse_distance keeps from forward to backward).
Torch-free.
"""

from __future__ import annotations

from zerolaunch.memory import engine_layout as el
from zerolaunch.zero import plan


def unit_padded_numels(
    shape, world_size: int, threshold: int, decay_1d: bool = False
) -> tuple[list[int], int]:
    """([padded elements of each unit, root first], padded elements of the resident unit)."""
    persistent = {s.name for s in shape.specs if s.numel < threshold}
    units = []
    for unit in shape.units:
        specs = [s for s in shape.unit_specs(unit) if s.name not in persistent]
        units.append(_padded(specs, world_size, decay_1d))
    resident = _padded([s for s in shape.specs if s.name in persistent], world_size, decay_1d)
    return units, resident


def frozen_padded_numels(shape, world_size: int, threshold: int) -> tuple[list[int], int]:
    """([padded elements of each unit's frozen bucket, root first], frozen elements kept whole on every rank):
    a unit's frozen params over the threshold share one bucket padded to a multiple of world_size."""
    units = []
    for unit in shape.units:
        numel = sum(s.numel for s in shape.unit_frozen_specs(unit) if s.numel >= threshold)
        units.append(-(-numel // world_size) * world_size)
    resident = sum(s.numel for s in shape.frozen if s.numel < threshold)
    return units, resident


def largest_bucket_shard(shape, world_size: int, threshold: int, decay_1d: bool = False) -> int:
    """Elements of the largest per-rank bucket shard over every unit and the resident unit (a step chunk)."""
    persistent = {s.name for s in shape.specs if s.numel < threshold}
    groups = [[s for s in shape.unit_specs(u) if s.name not in persistent] for u in shape.units]
    groups.append([s for s in shape.specs if s.name in persistent])
    largest = 0
    for specs in groups:
        if specs:
            lay = el.unit_layout(specs, world_size, decay_1d)
            largest = max(largest, max(b.shard_numel for b in lay.buckets))
    return largest


def largest_unit_shard(shape, world_size: int, threshold: int, decay_1d: bool = False) -> int:
    """Elements of the largest per-rank shard of one unit (its buckets together: one per param group), the
    resident unit included: the grad segments a unit's first grads allocate at once."""
    persistent = {s.name for s in shape.specs if s.numel < threshold}
    groups = [[s for s in shape.unit_specs(u) if s.name not in persistent] for u in shape.units]
    groups.append([s for s in shape.specs if s.name in persistent])
    return max(
        (
            sum(b.shard_numel for b in el.unit_layout(specs, world_size, decay_1d).buckets)
            for specs in groups
            if specs
        ),
        default=0,
    )


def _padded(specs, world_size: int, decay_1d: bool = False) -> int:
    if not specs:
        return 0
    return el.unit_layout(specs, world_size, decay_1d).padded_numel


def reuse_kept(blocks: list[int], root: int, max_reuse_numel: int, max_live_numel: int) -> list[bool]:
    """Which units (padded elements, root excluded, in forward order) stay gathered from their forward to
    their backward under stage3_max_reuse_distance: zero/stage3/schedule.py `_reused_soon` replayed over the
    trace it predicts (the forward in module order, then the backward in reverse). A unit is kept when its
    next use -- the rest of the forward, then the backward back to it -- comes before max_reuse_numel
    elements of other units are gathered (DeepSpeed's rule), and the root, the units kept so far, the unit
    and the largest unit gathered before its reuse fit in max_live_numel."""
    kept = [False] * len(blocks)
    if max_reuse_numel <= 0:
        return kept
    held = 0
    for i, numel in enumerate(blocks):
        after = blocks[i + 1 :]
        between, largest, near = 0, 0, True
        for other in after + after[::-1]:  # the rest of the forward, then the backward down to unit i
            between += other
            largest = max(largest, other)
            if between >= max_reuse_numel:
                near = False
                break
        if near and root + held + numel + largest <= max_live_numel:
            kept[i] = True
            held += numel
    return kept


def gathered_peak_numel(
    units: list[int], prefetch_numel: int, max_live_numel: int, max_reuse_numel: int = 0
) -> int:
    """Most non-resident elements gathered at once: the root, the units kept by max_reuse_distance
    (`reuse_kept`) before the one running, the unit running and its prefetches.

    In backward the unit just finished may still be gathered while the next is fetched (it is freed when its
    last grad reports), so one more unit is allowed for than in forward. A kept unit is held from its forward
    to its backward; the backward meets the kept units first, so at every position the kept units before it
    (in forward order) are the ones held.
    """
    return gathered_peak(units, prefetch_numel, max_live_numel, max_reuse_numel)[0]


def gathered_peak(
    units: list[int],
    prefetch_numel: int,
    max_live_numel: int,
    max_reuse_numel: int = 0,
    part: list[int] | None = None,
) -> tuple[int, int]:
    """(gathered_peak_numel, the sum of `part` over the units gathered at that peak): `part[k]` is some
    share of unit k's elements (its trainable buckets, say), default all of them."""
    part = units if part is None else part
    pairs = [(u, p) for u, p in zip(units[1:], part[1:], strict=True) if u]
    root, blocks, shares = units[0], [u for u, _ in pairs], [p for _, p in pairs]
    kept = reuse_kept(blocks, root, max_reuse_numel, max_live_numel)
    peak, peak_part, held, held_part = root, part[0], 0, 0
    for i, current in enumerate(blocks):
        live, budget = root + held + current, prefetch_numel
        live_part = part[0] + held_part + shares[i]
        for j in range(i + 1, len(blocks)):
            nxt = blocks[j]
            if nxt > budget or live + nxt > max_live_numel:
                break
            live += nxt
            live_part += shares[j]
            budget -= nxt
        if i > 0 and not kept[i - 1]:  # a kept one is in `held` already
            live, live_part = live + blocks[i - 1], live_part + shares[i - 1]
        if live > peak:
            peak, peak_part = live, live_part
        if kept[i]:
            held += current
            held_part += shares[i]
    return peak, peak_part


def offload_devices(offload: str) -> tuple[str, str]:
    """(offload_optimizer.device, offload_param.device) of a row's offload ("none", "optimizer-cpu",
    "optimizer+params-nvme", ...)."""
    if offload == "none":
        return "none", "none"
    what, device = offload.rsplit("-", 1)
    return device, device if what == "optimizer+params" else "none"


def stage3_states(shape, setup, offload: str):
    """(gpu, host, step transient, gathered bytes, staging bytes, nvme bytes) of the stage 3 engine.

    gpu/host are what `Engine.memory_bytes()` at stage 3 reports between steps (shards, the resident unit,
    fp32 states; no unit gathered, no staging buffer). The gathered units and the staging buffers of the units
    being reduced exist only inside forward/backward: estimate.py adds them to the activations, the
    staging ones only after the loss (a unit's staging buffer is taken at its first grad). nvme bytes are
    this rank's swap files.
    """
    b, c, world = setup.dtype_bytes, setup.comm_bytes, setup.world_size
    zero, precision, decay_1d = setup.engine.zero, setup.engine.precision, setup.engine.optimizer.decay_1d
    threshold = zero.stage3_param_persistence_threshold
    units, resident = unit_padded_numels(shape, world, threshold, decay_1d)
    frozen_units, frozen_resident = frozen_padded_numels(shape, world, threshold)
    shard = (sum(units) + resident) // world
    gpu = dict.fromkeys(("params", "grads", "master", "optimizer", "buckets"), 0)
    host = dict(gpu)
    nvme = 0
    unit_shards, resident_shard = b * (sum(units) // world), b * (resident // world)
    # the frozen buckets' shards ([Note: frozen buckets]): compute dtype, moved by offload_param only
    frozen_shards = b * (sum(frozen_units) // world)
    # zero/stage3/unit_buffers.py [Note: gather from master]: no compute-dtype shard, gathers read the master
    from_master = plan.gathers_from_master(*offload_devices(offload))
    if offload == "optimizer+params-nvme":
        # zero/stage3/unit_sharding.py: the units' shards live in the param swap file (no streaming buffers: a
        # unit's shard is read into a host copy when it is gathered); the persistent params' shard stays on
        # the host.
        nvme += unit_shards + frozen_shards
        host["params"] = resident_shard
    elif offload == "optimizer+params-cpu":
        host["params"] = unit_shards + frozen_shards + resident_shard
    elif not from_master:
        gpu["params"] = unit_shards + frozen_shards + resident_shard
    else:
        gpu["params"] = frozen_shards  # the frozen bucket has no master to gather from
    # [Note: world size 1 aliases]: one rank's gathered units are views of their shards or master
    aliased = plan.aliases_gathered(
        world, offload_devices(offload)[1], from_master, setup.dtype, setup.engine.precision.master_dtype
    )
    # the persistent params are also kept whole on every GPU, as are the frozen ones under the threshold.
    gpu["params"] += (0 if aliased else b * resident) + b * frozen_resident + shape.frozen_fixed_bytes
    # a unit gathers its trainable and frozen buckets together (the schedule's budgets count both)
    whole_units = [t + f for t, f in zip(units, frozen_units, strict=True)]
    gathered, gathered_trainable = gathered_peak(
        whole_units,
        zero.stage3_prefetch_bucket_size,
        zero.stage3_max_live_parameters,
        zero.stage3_max_reuse_distance,
        part=units,
    )
    # zero/stage3/schedule.py: a unit's staging buffer lives from its first grad until its reduce-scatter
    # completes. The root's fills over the whole backward (ln_f first, the embeddings last), the resident
    # unit's too; the blocks' take turns, up to max_reduces_in_flight (2) with overlap and one more filling.
    in_flight = 3 if setup.overlap(3) else 1
    blocks = [u for u in units[1:] if u]
    staging = c * (units[0] + resident + in_flight * max(blocks, default=0))
    if el.accumulates_directly(3, world, offload, precision.dtype, precision.communication_dtype):
        staging = 0  # one rank: grads go straight into the grad shard ([Note: direct grads])
    gathered_bytes = 0 if aliased else b * gathered
    if from_master and world > 1 and b != 4:
        # each gather in flight casts its unit's fp32 master shard into a compute-dtype input (1/world of the
        # unit's trainable buckets) alive until it is waited; counted for every gathered unit, a bound (a
        # waited one has none). In fp32 the master view itself is the input.
        gathered_bytes += b * (gathered_trainable // world)
    live = (gathered_bytes, staging)
    opt = setup.master_bytes * shard * setup.optimizer_state_tensors
    if offload in ("optimizer-nvme", "optimizer+params-nvme"):
        # master + moments in the swap file (one chunk per unit bucket); the host keeps the fp32 grad shard
        # and buffer_count staging buffers of the largest chunk, reported as "optimizer" (nvme_staging_bytes).
        host["grads"] = 4 * shard
        host["optimizer"] = el.nvme_staging_bytes(
            setup, largest_bucket_shard(shape, world, threshold, decay_1d)
        )
        nvme += 4 * shard + opt
        return gpu, host, 0, *live, nvme
    states = gpu if offload == "none" else host
    # in the compute dtype with the fused step at world size 1 ([Note: compute-dtype grads] in zero/grad_shards.py)
    states["grads"] = setup.grad_bytes(3, offload) * shard
    states["master"] = setup.master_bytes * shard
    states["optimizer"] = opt
    return gpu, host, 0, *live, nvme
