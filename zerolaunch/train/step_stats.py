"""A step's metrics held on the device until the loop reads them, one step later (deferred logging).

Owns: the one all-reduce of a step's metrics (each rank's loss sum and peak memory in its own slot) queued
behind the step's kernels, the non_blocking copy of the result into pinned host memory, the CUDA events that
time the step, and reading all of it back once the copy has landed. Does not decide when to read (loop.py)
nor what the values mean (reporting.py, nonfinite.py).

Why: reading a device value (`.item()`, `.tolist()`, `torch.cuda.synchronize`) blocks the host until every
queued kernel has run, so nothing of the next step is queued while the host reads, reports and checks. Here
the step's values travel to the host on the stream, and the loop reads them after it has queued the next
step's forward and backward: the host's reporting then runs while the device computes (torchtitan and
Lightning log the same way). The values read are the ones a synchronous read would have given, bit for bit:
each rank writes its loss sum into its own slot of a zero vector and the all-reduce adds zeros to it.
On the CPU every op is synchronous already: the same code, without events or pinned memory.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch
import torch.distributed as dist

SLOTS = 3
"""Per rank: loss sum over the step's micro-batches, peak allocated bytes, peak reserved bytes."""


@dataclass
class PendingStep:
    """One optimizer step whose device values are still on their way to the host."""

    step: int
    values: torch.Tensor
    """(world_size * SLOTS,) float64 on the host (pinned under CUDA); valid once `ready` has completed."""
    ready: torch.cuda.Event | None
    start: torch.cuda.Event | float
    end: torch.cuda.Event | float
    fields: dict
    """The step's host-side report fields (lr, grad norm, comm, data wait, ...), known when it was queued."""

    def read(self, world_size: int) -> tuple[list[float], list[float] | None, float]:
        """(per-rank loss sums, [peak allocated, peak reserved] max over ranks or None on the CPU,
        step seconds). Blocks only until this step's copy has landed, never on later work."""
        if self.ready is not None:
            self.ready.synchronize()
        flat = self.values.tolist()  # a host tensor: no device read
        rows = [flat[r * SLOTS : (r + 1) * SLOTS] for r in range(world_size)]
        loss_sums = [row[0] for row in rows]
        if isinstance(self.start, float):
            return loss_sums, None, self.end - self.start
        peaks = [max(row[1] for row in rows), max(row[2] for row in rows)]
        return loss_sums, peaks, self.start.elapsed_time(self.end) / 1e3


def step_start(device: torch.device) -> torch.cuda.Event | float:
    """A mark on the stream (CUDA) or the clock (CPU) where the step's work begins."""
    if device.type == "cuda":
        start = torch.cuda.Event(enable_timing=True)
        start.record()
        return start
    return time.perf_counter()


def queue_step(
    step: int,
    loss_sum: torch.Tensor,
    start: torch.cuda.Event | float,
    *,
    rank: int,
    world_size: int,
    device: torch.device,
    group,
    fields: dict,
) -> PendingStep:
    """Queue the step's metric all-reduce and its copy to the host; no host read of a device value."""
    cuda = device.type == "cuda"
    if cuda:
        end = torch.cuda.Event(enable_timing=True)
        end.record()  # before the metric all-reduce: the step's time is the engine's work only, as bench/run.py's
    else:
        end = time.perf_counter()
    slots = torch.zeros(world_size * SLOTS, dtype=torch.float64, device=device)
    mine = slots[rank * SLOTS : (rank + 1) * SLOTS]
    mine[0].copy_(loss_sum)
    if cuda:
        # host counters of the caching allocator, current as soon as the step is queued (no device read);
        # a scalar fill needs no host->device copy
        mine[1].fill_(float(torch.cuda.max_memory_allocated(device)))
        mine[2].fill_(float(torch.cuda.max_memory_reserved(device)))
    dist.all_reduce(slots, op=dist.ReduceOp.SUM, group=group)
    ready = None
    if cuda:
        host = torch.empty_like(slots, device="cpu", pin_memory=True)
        host.copy_(slots, non_blocking=True)
        ready = torch.cuda.Event()
        ready.record()
        slots = host
    return PendingStep(step, slots, ready, start, end, fields)
