"""The fp32 gradient shards' memory: held from a window's first gradient write until its optimizer step.

[Note: released grad shards]
On the compute device the fp32 grad shards (4 B a param / world size) are only read between the first
gradient a window writes and the optimizer step that consumes them. Held between steps, they sit under the
forward's activation peak for nothing: on one H200, GPT-1.3B, bf16, ZeRO-2, 4.90 GiB of the 51.16 GiB peak
(bench/results/2026-12-04-phases-1.3b.txt; FSDP2 allocates its sharded grads in backward, 44.01 GiB).
So after each step their storage is freed (`untyped_storage().resize_(0)`, as FSDP2 frees unsharded params)
and re-allocated by the first write of the next window. Views into the shards (the reducers' slices) stay
valid: they share the storage object, whose data pointer is read at each use.

The contents need no zeroing pass: every write path of stages 0-2 overwrites a shard element on its first
write in a window (the reducers' "fresh" rule; stage 2 issues every bucket every micro-step; the world-size-1
accumulator zeroes what got no gradient in finish_backward). Only when the step finds the shards released -- a
boundary with no backward in the window -- are they zero-filled, which is what "no gradient" means.
Host shards (optimizer offload) are kept: pinned allocations are slow and host memory is not the peak. Stage 3
keeps its shards resident for now (its reducer's write rule is not covered by this note).
"""

from __future__ import annotations

import torch


class GradShardMemory:
    def __init__(self, shards: list[torch.Tensor], *, releasable: bool):
        self.shards = shards
        self.releasable = releasable
        self._nbytes = [t.untyped_storage().nbytes() for t in shards]
        self.held = True

    def ensure(self) -> None:
        """Before a write into the shards: re-allocate them if the last step released them."""
        if self.held:
            return
        for t, n in zip(self.shards, self._nbytes, strict=True):
            t.untyped_storage().resize_(n)
        self.held = True

    def ensure_zeroed(self) -> None:
        """Before the step reads the shards: a window without any write reads zeros, not freed memory."""
        if self.held:
            return
        self.ensure()
        for t in self.shards:
            t.zero_()

    def release(self) -> None:
        """After the optimizer step has read them (the kernels are queued on the current stream, whose
        allocator pool gets the blocks back: later work on that stream is ordered after them)."""
        if not self.releasable or not self.held:
            return
        for t in self.shards:
            t.untyped_storage().resize_(0)
        self.held = False

    @property
    def held_bytes(self) -> int:
        return sum(self._nbytes) if self.held else 0
