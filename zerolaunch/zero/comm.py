"""Every collective the engine issues goes through this module.

It owns: the torch-version shims (torch 2.13 renamed `reduce_scatter_tensor` / `all_gather_into_tensor` to
`reduce_scatter_single` / `all_gather_single` and deprecated the old names; torch 2.11 only has the old ones),
the accounting of time and bytes per collective kind (the reports need it), and nothing else: no global
state, the process group is always passed in by the caller.

All functions work on flat, contiguous tensors. `async_op=True` returns a `Pending` whose `wait()` must be
called before the output is read; on CUDA the caller decides on which stream the collective is issued.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch
import torch.distributed as dist

_reduce_scatter_flat = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
_all_gather_flat = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor


@dataclass
class OpStats:
    count: int = 0
    bytes: int = 0
    """Bytes of the per-rank input (reduce-scatter, all-reduce) or output (all-gather) tensor."""
    seconds: float = 0.0
    """Host time spent issuing and waiting; on CUDA with async ops this is wait time, not transfer time."""


@dataclass
class CommStats:
    """Time and bytes per collective kind, for one rank."""

    ops: dict[str, OpStats] = field(default_factory=dict)

    def add(self, kind: str, nbytes: int, seconds: float, count: int = 1) -> None:
        s = self.ops.setdefault(kind, OpStats())
        s.count += count
        s.bytes += nbytes
        s.seconds += seconds

    def total_bytes(self) -> int:
        return sum(s.bytes for s in self.ops.values())

    def total_seconds(self) -> float:
        return sum(s.seconds for s in self.ops.values())

    def reset(self) -> None:
        self.ops.clear()


class CommContext:
    """The device, the process group and the CUDA side streams of one engine.

    The `Engine` builds it once and its sharding strategy hands it to whatever issues collectives or
    copies off the compute stream (flat/flat_sharding.py, flat/reducer.py, stage3/schedule.py), so no
    module makes streams of its own. A side stream exists only on CUDA and only where its job is on (the
    reduce and gather streams with `zero.overlap`, the copy stream with `offload_optimizer.overlap_step`);
    elsewhere it is None and that work runs on the compute (current) stream. Each is created when first
    asked for, so an engine holds just the streams its strategy uses (none at stages 0/1, nor at world
    size 1 where no reducer runs). The waits between the streams are their users' and stay documented
    where the work is issued; the context only owns the streams.
    """

    def __init__(self, device: torch.device, group, *, overlap: bool):
        self.device = torch.device(device)
        self.group = group
        """The process group every collective of the engine runs on (None: the default group)."""
        self.overlap = overlap
        """zero.overlap: collectives on side streams (CUDA) and several reduce-scatters in flight."""
        self._streams: dict[str, torch.cuda.Stream] = {}

    def _side_stream(self, job: str, wanted: bool) -> torch.cuda.Stream | None:
        if not wanted or self.device.type != "cuda":
            return None
        if job not in self._streams:
            self._streams[job] = torch.cuda.Stream(self.device)
        return self._streams[job]

    @property
    def reduce_stream(self) -> torch.cuda.Stream | None:
        """The gradient reduce-scatters issued during backward: stage 2's buckets (flat/reducer.py
        BackwardReducer) or stage 3's units (stage3/schedule.py). Before each it waits for the compute
        stream (the grads were copied into the staging buffer there); the compute stream waits for it before
        a staging buffer is reused or its result read, and at the end of backward. With zero.overlap."""
        return self._side_stream("reduce", self.overlap)

    @property
    def gather_stream(self) -> torch.cuda.Stream | None:
        """Stage 3's unit all-gathers, the unit needed now and the prefetched ones (stage3/unit_buffers.py
        UnitFlat.gather). Before each it waits for the compute stream; the compute stream waits for it
        (UnitFlat.wait_gathered) before it reads or frees the unit's full buffer. With zero.overlap."""
        return self._side_stream("gather", self.overlap)

    @property
    def copy_stream(self) -> torch.cuda.Stream | None:
        """The overlapped step's host->device copies of the stepped master chunks (offload_optimizer
        overlap_step, optim/overlapped_step.py): it first waits for the compute stream as it was when the
        step began; the compute stream waits for a bucket's copy event before that bucket is published. One
        for all steps, so the allocator's per-stream pools stay put. On CUDA whenever asked for."""
        return self._side_stream("copy", True)


class Pending:
    """An issued asynchronous collective; `wait()` blocks until its output may be read, and counts the wait."""

    def __init__(self, work, stats: CommStats | None, kind: str, nbytes: int, started: float):
        self._work = work
        self._stats = stats
        self._kind = kind
        self._nbytes = nbytes
        self._issue_seconds = time.perf_counter() - started
        self._done = False

    def wait(self) -> None:
        if self._done:
            return
        t0 = time.perf_counter()
        if self._work is not None:
            self._work.wait()
        self._done = True
        if self._stats is not None:
            self._stats.add(self._kind, self._nbytes, self._issue_seconds + time.perf_counter() - t0)


def _run(kind, fn, nbytes, stats, async_op):
    t0 = time.perf_counter()
    work = fn(async_op)
    pending = Pending(work, stats, kind, nbytes, t0)
    if not async_op:
        pending.wait()
        return None
    return pending


def world_size(group) -> int:
    return dist.get_world_size(group) if dist.is_initialized() else 1


def rank(group) -> int:
    return dist.get_rank(group) if dist.is_initialized() else 0


def reduce_scatter(
    output: torch.Tensor,
    input: torch.Tensor,
    group,
    *,
    stats: CommStats | None = None,
    async_op: bool = False,
    average: bool = False,
) -> Pending | None:
    """output (n,) on every rank <- sum over ranks of input[r*n:(r+1)*n] (input is (world*n,)).

    average=True divides by the world size after the sum (done here, not with ReduceOp.AVG, which gloo lacks).
    """
    ws = world_size(group)
    if ws == 1:
        output.copy_(input)
        return Pending(None, None, "", 0, time.perf_counter()) if async_op else None
    op = dist.ReduceOp.SUM

    def issue(a):
        return _reduce_scatter_flat(output, input, op=op, group=group, async_op=a)

    pending = _run("reduce_scatter", issue, input.numel() * input.element_size(), stats, True)
    if average:
        pending = _Then(pending, lambda: output.div_(ws))
    if not async_op:
        pending.wait()
        return None
    return pending


def all_gather(
    output: torch.Tensor,
    input: torch.Tensor,
    group,
    *,
    stats: CommStats | None = None,
    async_op: bool = False,
) -> Pending | None:
    """output (world*n,) <- concatenation over ranks of input (n,)."""
    if world_size(group) == 1:
        output.copy_(input)
        return Pending(None, None, "", 0, time.perf_counter()) if async_op else None

    def issue(a):
        return _all_gather_flat(output, input, group=group, async_op=a)

    return _run("all_gather", issue, output.numel() * output.element_size(), stats, async_op)


def all_reduce(
    tensor: torch.Tensor, group, *, op: str = "sum", stats: CommStats | None = None, async_op: bool = False
) -> Pending | None:
    """In place: tensor <- reduction over ranks. op: "sum" | "max" | "min"."""
    if world_size(group) == 1:
        return Pending(None, None, "", 0, time.perf_counter()) if async_op else None
    red = {"sum": dist.ReduceOp.SUM, "max": dist.ReduceOp.MAX, "min": dist.ReduceOp.MIN}[op]

    def issue(a):
        return dist.all_reduce(tensor, op=red, group=group, async_op=a)

    return _run("all_reduce", issue, tensor.numel() * tensor.element_size(), stats, async_op)


def broadcast(tensor: torch.Tensor, src_group_rank: int, group, *, stats: CommStats | None = None) -> None:
    """In place: every rank's tensor <- the tensor of group rank src_group_rank."""
    if world_size(group) == 1:
        return
    src = dist.get_global_rank(group, src_group_rank) if group is not None else src_group_rank

    def issue(a):
        return dist.broadcast(tensor, src=src, group=group, async_op=a)

    _run("broadcast", issue, tensor.numel() * tensor.element_size(), stats, False)


def barrier(group) -> None:
    if world_size(group) > 1:
        dist.barrier(group=group)


def destroy_default_group(*, every_rank_finished: bool) -> None:
    """Destroy the default process group (if any). When every rank finished normally, a barrier first: no rank
    closes its connections while a peer still uses them (gloo aborted one rank in ~1 of 15 runs under load
    with "terminate called without an active exception" when the ranks tore down unsynchronized). After a
    failure no barrier: the peers may be gone, and waiting would hang until the group's timeout."""
    if not dist.is_initialized():
        return
    if every_rank_finished and dist.get_world_size() > 1:
        dist.barrier()
    dist.destroy_process_group()


class _Then:
    """A Pending followed by a cheap local step (e.g. the division of an average) once it has completed."""

    def __init__(self, pending: Pending, then):
        self._pending = pending
        self._then = then
        self._done = False

    def wait(self) -> None:
        if not self._done:
            self._pending.wait()
            self._then()
            self._done = True
