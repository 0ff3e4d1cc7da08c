"""This rank's fp32 gradient shards, in segments allocated at their first write and freed after the step.

[Note: released grad shards]
Per param group a rank's fp32 grad shard is the concatenation of segments (zero/plan.py `GradSegment`): a
stage-2 bucket's shard, a stage-3 unit bucket's shard, or at world size 1 a run of whole params of at most
plan.GRAD_SEGMENT_NUMEL elements. On the compute device each segment is its own tensor, and it is only read
between the first gradient a window writes into it and the optimizer step that consumes it. So after each
step the segments' storage is freed (`untyped_storage().resize_(0)`, as FSDP2 frees unsharded params) and
each is re-allocated by its own first write of the next window. Backward writes the segments in reverse
layer order while it frees the activations of those layers, so the grads grow as the activations shrink
and the backward peak (at the loss, where the fewest activations are freed yet) holds one segment, not the
whole shard: FSDP2 allocates its sharded grads per layer in backward the same way. (One segment for the
whole shard would hold all of it under that peak: 4.90 GiB of fp32 grads for GPT-1.3B.)
Views into a segment (the reducers' slices, stage 3's grad views) stay valid: they share the storage
object, whose data pointer is read at each use.

The contents need no zeroing pass: every write path overwrites a shard element on its first write in a
window (GradWindow.FRESH; stage 2 and stage 3 issue every bucket / unit every micro-step; the world-size-1
accumulators zero what got no gradient in finish_backward). Every writer calls `prepare_write` first, which also
marks the segment written in this window; only a segment no write reached -- e.g. a boundary with no
backward -- is zero-filled before the step reads it (`zero_unwritten`), which is what "no gradient" means.
Host shards (optimizer offload) are one pinned tensor per group, never freed (pinned allocations are slow and
host memory is not the peak), so the written marks, not the allocation, say what holds this window's grads:
a host shard keeps the last window's values until it is written or zeroed.

[Note: compute-dtype grads]
At world size 1 (the direct path) with a 16-bit model, one micro-step per window and a step that reads 16-bit
grads as they are (plan.grads_in_compute_dtype: the fused step, or torch's over a bf16 master, [Note: bf16
master]), a window's grads are nobody's sum: each element is one gradient autograd made in the compute dtype,
and its fp32 copy is that value's exact upcast. Then each device segment starts the window in the compute
dtype (`compute_dtype`): the grad hooks copy 2 bytes per element instead of writing 4, the norm reads 2, and the
fused step reads 2 and upcasts in its kernel (fused_step.adam_chunk), so the weights are the fp32 path's bit
for bit. GPT-1.3B: 40 -> 34 bytes of optimizer-side traffic per param a step, and half the grad shard's
4.90 GiB held at the step.
A second gradient into a segment in the same window (a caller-set boundary with several backwards) must be
summed in fp32, as the other paths do: `write` then promotes the segment to fp32 first (its 16-bit values
copied up, exactly) for the rest of the window; `release` returns it to the compute dtype. So the values never
depend on which dtype a segment started in, only the bytes do.
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from . import placement
from .plan import GradSegment


@dataclass(slots=True)
class SegmentState:
    """Where one segment stands between two steps (`GradShards.state`)."""

    fp32_held: bool
    """The fp32 tensor's storage is allocated."""
    compute_held: bool
    """Compute-dtype mode: the compute-dtype tensor's storage is allocated."""
    in_fp32: bool
    """This window's grads are in the fp32 tensor (else in the compute-dtype one)."""
    written: bool = False
    """prepare_write() was called since the last step's release()."""


class GradSlice:
    """A fixed range of one segment (a param's grads): its fp32 view and, in compute-dtype mode, its 16-bit
    view, both taken once while the segment was held ([Note: compute-dtype grads])."""

    __slots__ = ("segment", "fp32", "compute")

    def __init__(self, segment: int, fp32: torch.Tensor, compute: torch.Tensor | None):
        self.segment = segment
        self.fp32 = fp32
        self.compute = compute


class GradShards:
    def __init__(
        self,
        group_numels: Sequence[int],
        segments: Sequence[GradSegment],
        device: torch.device,
        *,
        pin: bool,
        releasable: bool,
        compute_dtype: torch.dtype | None = None,
    ):
        """`segments` tile each group's [0, numel) in order. releasable: on the compute device (no offload),
        freed by release() and re-allocated by prepare_write(); else one (pinned) tensor per group, always held.
        compute_dtype: each window starts every segment in this dtype ([Note: compute-dtype grads]; releasable
        only)."""
        if compute_dtype is not None and not releasable:
            raise ValueError("compute-dtype grad shards are device segments (releasable)")
        self.segments = list(segments)
        self.releasable = releasable
        self._starts: list[list[int]] = [[] for _ in group_numels]
        self._index: list[list[int]] = [[] for _ in group_numels]
        ends = [0] * len(group_numels)
        for i, s in enumerate(self.segments):
            if s.offset != ends[s.group]:
                raise ValueError(f"grad segment {i} starts at {s.offset}, expected {ends[s.group]}")
            ends[s.group] += s.numel
            self._starts[s.group].append(s.offset)
            self._index[s.group].append(i)
        if ends != list(group_numels):
            raise ValueError(f"grad segments cover {ends} elements per group, expected {list(group_numels)}")
        if releasable:
            self.tensors = [torch.zeros(s.numel, dtype=torch.float32, device=device) for s in self.segments]
        else:
            whole = [placement.zeros(n, device, pin=pin) for n in group_numels]
            self.tensors = [whole[s.group][s.offset : s.offset + s.numel] for s in self.segments]
        """One fp32 tensor per segment (window_tensors() are what holds this window's grads)."""
        self.compute_dtype = compute_dtype
        self.compute_tensors: list[torch.Tensor] | None = None
        """Compute-dtype mode: one tensor per segment in compute_dtype."""
        self._nbytes = [4 * s.numel for s in self.segments]
        self._compute_nbytes = [0] * len(self.segments)
        self._fp32_from_start = compute_dtype is None
        if compute_dtype is not None:
            self.compute_tensors = [
                torch.empty(s.numel, dtype=compute_dtype, device=device) for s in self.segments
            ]
            self._compute_nbytes = [t.numel() * t.element_size() for t in self.compute_tensors]
        self.state = [
            SegmentState(
                fp32_held=True, compute_held=compute_dtype is not None, in_fp32=self._fp32_from_start
            )
            for _ in self.segments
        ]
        """One record per segment."""

    # ---- where an element lives ----------------------------------------------------------------------
    def index_of(self, group: int, offset: int) -> int:
        """The segment holding element `offset` of `group`'s shard."""
        k = bisect.bisect_right(self._starts[group], offset) - 1
        return self._index[group][k]

    def view(self, group: int, offset: int, numel: int) -> torch.Tensor:
        """Elements [offset, offset + numel) of `group`'s shard, which must lie in one segment. Take views
        while the segment is held (torch refuses to slice a storage of size 0); a view taken then stays valid
        across release() and prepare_write(), which resize the storage it shares."""
        i = self.index_of(group, offset)
        s = self.segments[i]
        start = offset - s.offset
        if start + numel > s.numel:
            raise ValueError(
                f"grad shard range [{offset}, {offset + numel}) of group {group} crosses segment {i} "
                f"[{s.offset}, {s.offset + s.numel})"
            )
        return self.tensors[i][start : start + numel]

    def slice(self, group: int, offset: int, numel: int) -> GradSlice:
        """A writer's handle on elements [offset, offset + numel) of `group`'s shard (one segment), for
        `write` and `zero`: take it while the segments are held, as `view`."""
        fp32 = self.view(group, offset, numel)
        i = self.index_of(group, offset)
        compute = None
        if self.compute_tensors is not None:
            start = offset - self.segments[i].offset
            compute = self.compute_tensors[i][start : start + numel]
        return GradSlice(i, fp32, compute)

    def window_tensors(self) -> list[torch.Tensor]:
        """Per segment, the tensor holding this window's grads (fp32, or compute-dtype): what the norm and the
        step read, after zero_unwritten()."""
        return [self._window_tensor(i) for i in range(len(self.segments))]

    def window_view(self, group: int, offset: int, numel: int) -> torch.Tensor:
        """`view`, in the dtype this window's grads are held in (the step's read)."""
        i = self.index_of(group, offset)
        start = offset - self.segments[i].offset
        return self._window_tensor(i)[start : start + numel]

    def _window_tensor(self, index: int) -> torch.Tensor:
        return self.tensors[index] if self.state[index].in_fp32 else self.compute_tensors[index]

    # ---- writes ----------------------------------------------------------------------------------------
    @torch.no_grad()
    def write(self, where: GradSlice, grad: torch.Tensor, *, accumulate: bool) -> None:
        """`where` <- grad (accumulate=False: its exact copy or upcast) or += grad (in fp32: a compute-dtype
        segment is promoted first, [Note: compute-dtype grads]). grad: flat, where's numel, any float dtype."""
        self.prepare_write(where.segment)
        if accumulate and not self.state[where.segment].in_fp32:
            self._promote(where.segment)
        dst = where.fp32 if self.state[where.segment].in_fp32 else where.compute
        if accumulate:
            dst.add_(grad)
        else:
            dst.copy_(grad)

    @torch.no_grad()
    def zero(self, where: GradSlice) -> None:
        """`where` reads zeros in this window (a param that got no gradient)."""
        self.prepare_write(where.segment)
        (where.fp32 if self.state[where.segment].in_fp32 else where.compute).zero_()

    def _promote(self, index: int) -> None:
        """Segment `index` holds this window's grads in fp32 from now on: its compute-dtype values, copied up
        exactly (all of it: elements not written yet are overwritten or zeroed before the step reads them)."""
        self._hold_fp32(index)
        self.tensors[index].copy_(self.compute_tensors[index])
        self.compute_tensors[index].untyped_storage().resize_(0)
        self.state[index].compute_held = False
        self.state[index].in_fp32 = True

    # ---- memory --------------------------------------------------------------------------------------
    def prepare_write(self, index: int) -> None:
        """Before a write into segment `index`: re-allocate it (in this window's dtype) if released, and mark
        it written in this window. Call on the compute stream, which frees it after the step, so the block
        belongs to that stream's pool; a write on a side stream (stage 2's reduce stream) is ordered after
        this by comm's waits ([Note: comm streams])."""
        if self.state[index].in_fp32:
            self._hold_fp32(index)
        elif not self.state[index].compute_held:
            self.compute_tensors[index].untyped_storage().resize_(self._compute_nbytes[index])
            self.state[index].compute_held = True
        self.state[index].written = True

    def _hold_fp32(self, index: int) -> None:
        if not self.state[index].fp32_held:
            self.tensors[index].untyped_storage().resize_(self._nbytes[index])
            self.state[index].fp32_held = True

    def prepare_all_writes(self) -> None:
        for i in range(len(self.segments)):
            self.prepare_write(i)

    def zero_unwritten(self) -> None:
        """Before the step reads the shards: a segment no write reached this window reads zeros (a released
        one instead of freed memory, a host one instead of the last window's grads)."""
        for i, state in enumerate(self.state):
            if not state.written:
                self.prepare_write(i)
                self._window_tensor(i).zero_()

    def release(self) -> None:
        """After the optimizer step has read them (or a skipped step discarded them): the next window starts
        unwritten, and device segments are freed (the step's kernels are queued on the current stream, whose
        allocator pool gets the blocks back: later work on that stream is ordered after them). Host segments
        stay allocated, also while an overlapped step still reads them."""
        for state in self.state:
            state.written = False
            state.in_fp32 = self._fp32_from_start
        if not self.releasable:
            return
        for i, t in enumerate(self.tensors):
            if self.state[i].fp32_held:
                t.untyped_storage().resize_(0)
                self.state[i].fp32_held = False
            if self.compute_tensors is not None and self.state[i].compute_held:
                self.compute_tensors[i].untyped_storage().resize_(0)
                self.state[i].compute_held = False

    @property
    def capacity_bytes(self) -> int:
        """Bytes of the whole shard as a window holds it (what memory_bytes() reports: held from backward to
        the step): fp32, or the compute dtype in compute-dtype mode (where a window of several backwards,
        which promotes its segments, holds the fp32 bytes instead)."""
        return sum(self._nbytes) if self.compute_tensors is None else sum(self._compute_nbytes)

    @property
    def held_bytes(self) -> int:
        return sum(
            fp32 * s.fp32_held + compute * s.compute_held
            for fp32, compute, s in zip(self._nbytes, self._compute_nbytes, self.state, strict=True)
        )
