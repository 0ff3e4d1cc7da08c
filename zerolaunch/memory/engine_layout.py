"""The engine's layout and buffer decisions for estimate-memory, taken from zero/plan.py.

This module owns only the adaptation of a model shape's specs to the engine's planning functions: the
default param groups (`plan.default_group`), the stage 0-2 layout (`plan.flat_layout`: reverse registration
order, one rank for stage 0), a stage-3 unit's layout (`plan.unit_layout`), the world-size-1 direct path and
its buffers (`plan.accumulates_directly`, `plan.grads_in_compute_dtype`, `plan.master_is_params`) and the
stage-2 staging buffer count (`plan.stage2_staging_buffers`, which drives `plan.StagingPool`, the policy
object flat.BackwardReducer itself asks). The engine calls the
same functions, so nothing here restates an engine choice; tests/unit/test_memory_engine.py still holds the
bytes equal to a real Engine.

plan.py and layout.py are torch-free and `zerolaunch.zero` loads its engine lazily, so `--params` answers
without torch.
"""

from __future__ import annotations

from zerolaunch.zero import layout, plan

ParamSpec = layout.ParamSpec
stage2_staging_buffers = plan.stage2_staging_buffers


def stage012_layout(specs, stage: int, world_size: int, bucket_numel: int, decay_1d: bool = False):
    """The stage 0-2 engine's layout (zero/flat/flat_sharding.py calls plan.flat_layout with its groups)."""
    return plan.flat_layout(plan.default_specs(specs, decay_1d), stage, world_size, bucket_numel)


def unit_layout(specs, world_size: int, decay_1d: bool = False):
    """A stage-3 unit's layout (zero/stage3/unit_buffers.UnitFlat calls plan.unit_layout with its groups)."""
    return plan.unit_layout(plan.default_specs(specs, decay_1d), world_size)


def accumulates_directly(
    stage: int, world_size: int, offload: str, dtype: str, comm_dtype: str | None
) -> bool:
    """The engine's world-size-1 direct path, for one micro-step per window (what the estimate assumes)."""
    return plan.accumulates_directly(stage, world_size, offload != "none", dtype, comm_dtype or "fp32", 1)


def grad_shard_bytes(
    stage: int,
    world_size: int,
    offload: str,
    dtype: str,
    comm_dtype: str | None,
    fused_step: bool,
    master_dtype: str = "fp32",
) -> int:
    """Bytes per element of the engine's grad shard, for one micro-step per window: 4 (fp32), or the compute
    dtype's where plan.grads_in_compute_dtype keeps it there ([Note: compute-dtype grads])."""
    direct = accumulates_directly(stage, world_size, offload, dtype, comm_dtype)
    return 2 if plan.grads_in_compute_dtype(direct, dtype, 1, fused_step, master_dtype) else 4


def master_is_params(stage: int, world_size: int, offload: str, dtype: str, master_dtype: str) -> bool:
    """The stage 0-2 engine's params are its master ([Note: master is params]; plan.py)."""
    return plan.master_is_params(stage, world_size, offload != "none", dtype, master_dtype)


def shard_numel(lay) -> int:
    """Elements of one rank's fp32 shard over all groups (master, grad shard, each optimizer state)."""
    return sum(lay.shard_numel(g) for g in range(lay.num_groups))


def max_padded_bucket(lay) -> int:
    return max((b.padded_numel for b in lay.buckets), default=0)


def nvme_staging_bytes(setup, largest_chunk_numel: int) -> int:
    """nvme.SwapStore's host buffers: buffer_count x the largest chunk x (master + moments), fp32."""
    count = setup.engine.zero.offload_optimizer.buffer_count
    return count * 4 * (1 + setup.optimizer_state_tensors) * largest_chunk_numel


def grad_segments(lay, direct: bool):
    """The engine's fp32 grad shard segments of a stage 0-2 layout (flat/flat_sharding.py calls the same)."""
    return plan.flat_grad_segments(lay, direct)
