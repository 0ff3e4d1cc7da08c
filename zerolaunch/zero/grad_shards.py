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
whole shard, the first version, held all 4.90 GiB of GPT-1.3B's fp32 grads under that peak on one H200.)
Views into a segment (the reducers' slices, stage 3's grad views) stay valid: they share the storage
object, whose data pointer is read at each use.

The contents need no zeroing pass: every write path overwrites a shard element on its first write in a
window (GradWindow.FRESH; stage 2 and stage 3 issue every bucket / unit every micro-step; the world-size-1
accumulators zero what got no gradient in finish_backward). Every writer calls `ensure` first, which also
marks the segment written in this window; only a segment no write reached -- e.g. a boundary with no
backward -- is zero-filled before the step reads it (`ensure_zeroed`), which is what "no gradient" means.
Host shards (optimizer offload) are one pinned tensor per group, never freed (pinned allocations are slow and
host memory is not the peak), so the written marks, not the allocation, say what holds this window's grads:
a host shard keeps the last window's values until it is written or zeroed.
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence

import torch

from .optim import host
from .plan import GradSegment


class GradShards:
    def __init__(
        self,
        group_numels: Sequence[int],
        segments: Sequence[GradSegment],
        device: torch.device,
        *,
        pin: bool,
        releasable: bool,
    ):
        """`segments` tile each group's [0, numel) in order. releasable: on the compute device (no offload),
        freed by release() and re-allocated by ensure(); else one (pinned) tensor per group, always held."""
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
            whole = [host.zeros(n, device, pin=pin) for n in group_numels]
            self.tensors = [whole[s.group][s.offset : s.offset + s.numel] for s in self.segments]
        """One fp32 tensor per segment (the norm sums over them; ensure_zeroed() first)."""
        self._nbytes = [4 * s.numel for s in self.segments]
        self._held = [True] * len(self.segments)
        self._written = [False] * len(self.segments)
        """Written (ensure() called) since the last step's release()."""

    # ---- where an element lives ----------------------------------------------------------------------
    def index_of(self, group: int, offset: int) -> int:
        """The segment holding element `offset` of `group`'s shard."""
        k = bisect.bisect_right(self._starts[group], offset) - 1
        return self._index[group][k]

    def view(self, group: int, offset: int, numel: int) -> torch.Tensor:
        """Elements [offset, offset + numel) of `group`'s shard, which must lie in one segment. Take views
        while the segment is held (torch refuses to slice a storage of size 0); a view taken then stays valid
        across release() and ensure(), which resize the storage it shares."""
        i = self.index_of(group, offset)
        s = self.segments[i]
        start = offset - s.offset
        if start + numel > s.numel:
            raise ValueError(
                f"grad shard range [{offset}, {offset + numel}) of group {group} crosses segment {i} "
                f"[{s.offset}, {s.offset + s.numel})"
            )
        return self.tensors[i][start : start + numel]

    # ---- memory --------------------------------------------------------------------------------------
    def ensure(self, index: int) -> None:
        """Before a write into segment `index`: re-allocate it if released, and mark it written in this window.
        Call on the compute stream, which frees it after the step, so the block belongs to that stream's
        pool; a write on a side stream (stage 2's reduce stream) is ordered after this by comm's waits
        ([Note: comm streams])."""
        if not self._held[index]:
            self.tensors[index].untyped_storage().resize_(self._nbytes[index])
            self._held[index] = True
        self._written[index] = True

    def ensure_all(self) -> None:
        for i in range(len(self.segments)):
            self.ensure(i)

    def ensure_zeroed(self) -> None:
        """Before the step reads the shards: a segment no write reached this window reads zeros (a released
        one instead of freed memory, a host one instead of the last window's grads)."""
        for i, written in enumerate(self._written):
            if not written:
                self.ensure(i)
                self.tensors[i].zero_()

    def release(self) -> None:
        """After the optimizer step has read them (or a skipped step discarded them): the next window starts
        unwritten, and device segments are freed (the step's kernels are queued on the current stream, whose
        allocator pool gets the blocks back: later work on that stream is ordered after them). Host segments
        stay allocated, also while an overlapped step still reads them."""
        self._written = [False] * len(self.segments)
        if not self.releasable:
            return
        for i, t in enumerate(self.tensors):
            if self._held[i]:
                t.untyped_storage().resize_(0)
                self._held[i] = False

    @property
    def capacity_bytes(self) -> int:
        """Bytes of the whole shard (what memory_bytes() reports: it is held from backward to the step)."""
        return sum(self._nbytes)

    @property
    def held_bytes(self) -> int:
        return sum(n for n, held in zip(self._nbytes, self._held, strict=True) if held)
