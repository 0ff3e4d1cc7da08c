"""The optimizer over this rank's fp32 shards, and where that state lives (device, host or NVMe).

- `torch_optim.py`: building the inner torch optimizer, the global grad norm, non-finite checks + clipping.
- `shard_optimizer.py`: `ShardOptimizer`, the fp32 master + optimizer state in chunks.
- `nvme_store.py`: `SwapStore`, the NVMe swap files of offload_optimizer/offload_param "nvme".
- `overlapped_step.py`: `OverlappedStep`, the host step running while the next forward starts.
"""
