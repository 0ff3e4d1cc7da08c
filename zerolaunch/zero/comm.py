"""Every collective the engine issues goes through this module.

It owns: the torch-version shims (torch 2.13 renamed `reduce_scatter_tensor` / `all_gather_into_tensor` to
`reduce_scatter_single` / `all_gather_single` and deprecated the old names; torch 2.11 only has the old ones),
the stream a collective runs on with its waits ([Note: comm streams]), the accounting of time and bytes per
collective kind (the reports need it), and nothing else: no global state, the process group and the stream
are always passed in by the caller.

All functions work on flat, contiguous tensors. `async_op=True` returns a `Pending` whose `wait()` must be
called before the output is read.

[Note: comm streams]
`stream=None` (the CPU, or no side stream): the collective is issued on the caller's current stream, and
`Pending.wait()` blocks (gloo) or makes that stream wait for it (NCCL). With a CUDA `stream`:
- issue: `stream` first waits for the caller's current stream (the inputs were written there, the outputs
  allocated there), then the collective is issued on `stream`;
- `Pending.wait(then=None)`: on `stream`, the collective is awaited, the division of an average runs and then
  `then()` (the caller's own finishing of the output, e.g. accumulating it into a shard: it stays off the
  compute stream); after that the caller's current stream waits for `stream` once.
So a caller never waits on streams itself, and one `Pending` covers every collective of one call (the list
forms below): one wait before the issue and one after, however many buckets. Tensors stay alive by
reference (the caller's and the Pending's) until `wait()`, so no record_stream is needed.
"""

from __future__ import annotations

import gc
import time
from collections.abc import Sequence
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
    size 1 where no reducer runs). The context only owns the streams: the waits of a collective's stream
    are this module's ([Note: comm streams]), the copy stream's are optim/overlapped_step.py's.
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
    """Issued asynchronous collectives (one call's); `wait()` completes them ([Note: comm streams])."""

    def __init__(
        self,
        works: list,
        stats: CommStats | None,
        kind: str,
        nbytes: int,
        started: float,
        *,
        stream: torch.cuda.Stream | None = None,
        finish=None,
        keep: tuple = (),
    ):
        self._works = works
        self._stats = stats
        self._kind = kind
        self._nbytes = nbytes
        self._issue_seconds = time.perf_counter() - started
        self._stream = stream
        self._finish = finish
        """A cheap local step once the collectives completed (the division of an average)."""
        self._keep = keep
        """Inputs made here (a copy-in of a host input) and what they came from, alive until wait()."""
        self._done = False

    def wait(self, then=None) -> None:
        """The output may be read on the caller's current stream from here on; `then()` runs first, on the
        collective's stream (the caller's finishing of the output). A second call does nothing."""
        if self._done:
            return
        if self._stream is None:
            self._complete(then)
            return
        with torch.cuda.stream(self._stream):
            self._complete(then)
        torch.cuda.current_stream(self._stream.device).wait_stream(self._stream)

    def _complete(self, then) -> None:
        t0 = time.perf_counter()
        for work in self._works:
            if work is not None:
                work.wait()
        self._done = True
        count, self._works = len(self._works), []  # completed: the works (and tensors gloo keeps) go now
        if self._stats is not None:
            seconds = self._issue_seconds + time.perf_counter() - t0
            self._stats.add(self._kind, self._nbytes, seconds, count=count)
        if self._finish is not None:
            self._finish()
        if then is not None:
            then()
        self._keep = ()


def _run(kind, issue, nbytes, stats, async_op, stream, *, copy_in=None, finish=None, keep: tuple = ()):
    """copy_in() (untimed) then issue(a) (the collectives, async_op=a; returns their works), both on
    `stream` ([Note: comm streams])."""
    if stream is None:
        return _issued(kind, issue, nbytes, stats, async_op, None, copy_in, finish, keep)
    stream.wait_stream(torch.cuda.current_stream(stream.device))
    with torch.cuda.stream(stream):
        return _issued(kind, issue, nbytes, stats, async_op, stream, copy_in, finish, keep)


def _issued(kind, issue, nbytes, stats, async_op, stream, copy_in, finish, keep):
    if copy_in is not None:
        copy_in()
    t0 = time.perf_counter()
    works = issue(async_op)
    pending = Pending(works, stats, kind, nbytes, t0, stream=stream, finish=finish, keep=keep)
    if not async_op:
        pending.wait()
        return None
    return pending


def world_size(group) -> int:
    return dist.get_world_size(group) if dist.is_initialized() else 1


def rank(group) -> int:
    return dist.get_rank(group) if dist.is_initialized() else 0


def _pieces(whole: torch.Tensor, numels: list[int]) -> list[torch.Tensor]:
    """`whole` cut into consecutive pieces of the given sizes."""
    out, offset = [], 0
    for n in numels:
        out.append(whole[offset : offset + n])
        offset += n
    return out


def reduce_scatter(
    output: torch.Tensor,
    input: torch.Tensor | Sequence[torch.Tensor],
    group,
    *,
    stats: CommStats | None = None,
    async_op: bool = False,
    average: bool = False,
    stream: torch.cuda.Stream | None = None,
) -> Pending | None:
    """output (n,) on every rank <- sum over ranks of input[r*n:(r+1)*n] (input is (world*n,)).

    input may be a list of such tensors (world*n_i,): one reduce-scatter each, their results back to back in
    output (n_0 + n_1 + ...,). average=True divides by the world size after the sum (done here, not with
    ReduceOp.AVG, which gloo lacks). stream: [Note: comm streams].
    """
    inputs = [input] if isinstance(input, torch.Tensor) else list(input)
    ws = world_size(group)
    outputs = _pieces(output, [t.numel() // ws for t in inputs])
    if ws == 1:

        def copy(_a):
            for out, src in zip(outputs, inputs, strict=True):
                out.copy_(src)
            return []

        return _run("", copy, 0, None, async_op, stream)
    op = dist.ReduceOp.SUM

    def issue(_a):
        return [
            _reduce_scatter_flat(out, src, op=op, group=group, async_op=True)
            for out, src in zip(outputs, inputs, strict=True)
        ]

    def divide():
        for out in outputs:
            out.div_(ws)

    nbytes = sum(t.numel() * t.element_size() for t in inputs)
    return _run("reduce_scatter", issue, nbytes, stats, async_op, stream, finish=divide if average else None)


def all_gather(
    output: torch.Tensor | Sequence[torch.Tensor],
    input: torch.Tensor,
    group,
    *,
    stats: CommStats | None = None,
    async_op: bool = False,
    stream: torch.cuda.Stream | None = None,
) -> Pending | None:
    """output (world*n,) <- concatenation over ranks of input (n,).

    output may be a list of such tensors (world*n_i,): one all-gather each, input is then their shards back
    to back (n_0 + n_1 + ...,). An input on another device than the output (a shard offloaded to the host)
    is first copied there, non-blocking, on the collective's stream; at world size > 1 an input of another
    dtype (a fp32 master shard) is cast there too, into a buffer alive until wait() (at world size 1 the
    copy into the output casts). stream: [Note: comm streams].
    """
    outputs = [output] if isinstance(output, torch.Tensor) else list(output)
    ws = world_size(group)
    staged: list[torch.Tensor] = []

    def copy_in():
        dtype = outputs[0].dtype if ws > 1 else input.dtype
        staged.append(input.to(outputs[0].device, dtype, non_blocking=True))  # itself when nothing changes

    def issue(a):
        pieces = _pieces(staged[0], [out.numel() // ws for out in outputs])
        if ws == 1:
            for out, piece in zip(outputs, pieces, strict=True):
                out.copy_(piece)
            return []
        return [
            _all_gather_flat(out, piece, group=group, async_op=a)
            for out, piece in zip(outputs, pieces, strict=True)
        ]

    keep = (input, staged)
    if ws == 1:
        return _run("", issue, 0, None, async_op, stream, copy_in=copy_in, keep=keep)
    nbytes = sum(out.numel() * out.element_size() for out in outputs)
    return _run("all_gather", issue, nbytes, stats, async_op, stream, copy_in=copy_in, keep=keep)


def all_reduce(
    tensor: torch.Tensor,
    group,
    *,
    op: str = "sum",
    stats: CommStats | None = None,
    async_op: bool = False,
    stream: torch.cuda.Stream | None = None,
) -> Pending | None:
    """In place: tensor <- reduction over ranks. op: "sum" | "max" | "min". stream: [Note: comm streams]."""
    if world_size(group) == 1:
        return _run("", lambda _a: [], 0, None, async_op, stream)
    red = {"sum": dist.ReduceOp.SUM, "max": dist.ReduceOp.MAX, "min": dist.ReduceOp.MIN}[op]

    def issue(a):
        return [dist.all_reduce(tensor, op=red, group=group, async_op=a)]

    return _run("all_reduce", issue, tensor.numel() * tensor.element_size(), stats, async_op, stream)


def broadcast(tensor: torch.Tensor, src_group_rank: int, group, *, stats: CommStats | None = None) -> None:
    """In place: every rank's tensor <- the tensor of group rank src_group_rank."""
    if world_size(group) == 1:
        return
    src = dist.get_global_rank(group, src_group_rank) if group is not None else src_group_rank

    def issue(a):
        return [dist.broadcast(tensor, src=src, group=group, async_op=a)]

    _run("broadcast", issue, tensor.numel() * tensor.element_size(), stats, False, None)


def barrier(group) -> None:
    if world_size(group) > 1:
        dist.barrier(group=group)


def destroy_default_group(*, every_rank_finished: bool) -> None:
    """Destroy the default process group (if any). When every rank finished normally, a barrier first: no rank
    closes its connections while a peer still uses them (gloo aborted one rank in ~1 of 15 runs under load
    with "terminate called without an active exception" when the ranks tore down unsynchronized). After a
    failure no barrier: the peers may be gone, and waiting would hang until the group's timeout.

    First the garbage collector runs: an engine left in a reference cycle (a user script's, its hooks and
    closures) still holds gloo works and their tensors; destroyed only at interpreter finalization, after the
    group, they abort the process with the same message (pytorch/pytorch#179291 describes the mechanism), as
    seen, rarely, at the exit of an `entrypoint:` script using zerolaunch.initialize: the likely cause of that
    abort, not a proven one."""
    if not dist.is_initialized():
        return
    gc.collect()
    if every_rank_finished and dist.get_world_size() > 1:
        dist.barrier()
    dist.destroy_process_group()
