"""DeepSpeed's published model-state estimate, for the comparison column.

These are `estimate_zero2_model_states_mem_needs` (deepspeed/runtime/zero/stage_1_and_2.py, used for stages
1 and 2) and `estimate_zero3_model_states_mem_needs` (stage3.py, with zero_init on, as in their `_all_live`
tables), restated. They assume 16-bit params with fp32 Adam, count no activations and no buckets, and put
the 1.5x `additional_buffer_factor` on the CPU side. DeepSpeed has no estimate for stage 0 or nvme offload.

Checked line for line against DeepSpeed 0.19.8 (tests/unit/test_memory_deepspeed.py calls its functions when
deepspeed is importable): stages 1-2 per GPU 2Psi + int(18Psi/N), i.e. the 16-bit params whole and everything
else (16-bit grads 2, fp32 grads 4, fp32 params 4, Adam 8) divided by N; the same formula for stage 1 and 2.

Where they differ from the engine's own bytes (the same test file holds these):
- stage 1: our engine keeps the full 16-bit grads (2Psi, param.grad are views into them) and shards only the
  fp32 states (16Psi/N): higher than DeepSpeed's figure by 2Psi(1 - 1/N), up to padding.
- stage 2: our engine frees each grad into a staging bucket, so it holds a few buckets instead of a 16-bit
  grad shard: lower than DeepSpeed's figure by 2Psi/N - buckets, up to padding. (At world size 1 without
  offload stages 0-2 hold no full grads and no buckets: grads go straight to the fp32 shard, zero/flat/reducer.py.)
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
        return 2 * psi + int(18 * psi / n_gpus), int(psi * 4 * per_node * BUFFER_FACTOR)
    if stage == 3 and not offload.endswith("nvme"):
        largest = 4 * largest_layer
        if offload == "optimizer+params-cpu":
            return largest, int(psi * 18 / nodes * BUFFER_FACTOR)
        if offload == "optimizer-cpu":
            return largest + int(2 * psi / n_gpus), int(psi * 16 / nodes * BUFFER_FACTOR)
        return largest + int(18 * psi / n_gpus), int(largest_layer * 4 * per_node * BUFFER_FACTOR)
    return None, None
