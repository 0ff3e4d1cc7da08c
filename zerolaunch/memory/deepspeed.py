"""DeepSpeed's published model-state estimate, for the comparison column.

These are `estimate_zero2_model_states_mem_needs` (deepspeed/runtime/zero/stage_1_and_2.py, used for stages
1 and 2) and `estimate_zero3_model_states_mem_needs` (stage3.py, with zero_init on, as in their `_all_live`
tables), restated. They assume 16-bit params with fp32 Adam, count no activations and no buckets, and put
the 1.5x `additional_buffer_factor` on the CPU side. DeepSpeed has no estimate for stage 0 or nvme offload.

Where they differ from the engine's own bytes (tests/unit/test_memory_deepspeed.py holds these):
- stage 1: equal up to padding: 2Psi params + 2Psi full grads + 16Psi/N (fp32 master 4, Adam 8, fp32 grad
  shard 4) = DeepSpeed's 4Psi + 16Psi/N.
- stage 2: DeepSpeed keeps counting the full 2Psi of 16-bit grads; our stage 2 frees each grad into a staging
  bucket, so it holds a few buckets instead: lower by about 2Psi - buckets.
- stage 3: DeepSpeed adds 4 x largest layer (a gathered 16-bit param + its grad); we add the gathered units
  (the largest unit + what is prefetched), the resident small params and the staging bucket of one unit.
"""

from __future__ import annotations

BUFFER_FACTOR = 1.5


def deepspeed_bytes(
    psi: int, largest_layer: int, stage: int, offload: str, setup
) -> tuple[int | None, int | None]:
    """(per GPU, per CPU node) bytes by DeepSpeed's formulas; (None, None) where it gives none."""
    n_gpus, per_node, nodes = setup.world_size, setup.gpus_per_node, setup.nodes
    if stage in (1, 2) and offload in ("none", "optimizer-cpu"):
        if offload == "optimizer-cpu":
            return 2 * psi, int(psi * max(4 * n_gpus, 16) * BUFFER_FACTOR)
        return 4 * psi + int(16 * psi / n_gpus), int(psi * 4 * per_node * BUFFER_FACTOR)
    if stage == 3 and offload != "optimizer-nvme":
        largest = 4 * largest_layer
        if offload == "optimizer+params-cpu":
            return largest, int(psi * 18 / nodes * BUFFER_FACTOR)
        if offload == "optimizer-cpu":
            return largest + int(2 * psi / n_gpus), int(psi * 16 / nodes * BUFFER_FACTOR)
        return largest + int(18 * psi / n_gpus), int(largest_layer * 4 * per_node * BUFFER_FACTOR)
    return None, None
