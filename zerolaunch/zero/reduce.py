"""The backward reduce pipeline of stages 2 and 3, over reduce units, and the world-size-1 direct path.

A `ReduceUnit` is what one reduce-scatter averages into this rank's fp32 grad shard, and owns everything of
it, as picotron's `Bucket` and FSDP2's `FSDPParamGroup` do: its params, the staging buffer their grads are
copied into (`add_grad`), its reduce-scatter (`issue() -> ReduceWork`), the write of the result into its
slice of the grad shard (`write`) and where that slice stands in the accumulation window (`window`). A
stage-2 bucket is flat/reducer.py's `BucketUnit`, a stage-3 unit stage3/unit.py's `Stage3Unit`. Both issue
in the one fixed order of plan.IssueOrder (every rank the same, a complete unit waiting for the ones before
it); the callers decide how many may be in flight (stage 2's plan.StagingPool, stage 3's max_in_flight).
What is the same for both is this module's, as FSDP2's one `foreach_reduce` serves every group:

- `ReducePipeline`: the in-flight reduce-scatters in issue order, each completed into its unit's shard --
  overwritten by the unit's first reduce of the window, added to after it (`GradWindow`) --, the one pinned
  host staging buffer of an accumulating copy to offloaded shards, and the device sum of squares of what was
  reduced (the norm's, when a window is one micro-step and the shards are on the host).
- `[Note: device-summed window]`: with the optimizer offloaded and several micro-steps a window, the units'
  reduced grads are summed on the device and reach the host shard once, from the window's last backward.
- `DirectWrites`: world size 1 without offload (plan.accumulates_directly), where a reduce-scatter is the
  identity: each param's grad goes straight into its slice of the grad shard ([Note: world size 1] in
  flat/reducer.py, [Note: direct grads] in stage3/schedule.py).

It issues no collective itself (the units do, through comm.py) and waits only through `comm.Pending`.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping, Sequence
from typing import NamedTuple, Protocol

import torch

from . import comm, phases, placement
from .grad_shards import GradShards, GradSlice
from .optim.torch_optim import sum_of_squares
from .sharding import GradWindow


class ReduceWork(NamedTuple):
    """One issued reduce-scatter of a reduce unit."""

    unit: ReduceUnit
    out: torch.Tensor
    """This rank's averaged shard of the unit, in the comm dtype, on the compute device."""
    pending: comm.Pending
    staging: torch.Tensor
    """The staging buffer the reduce-scatter reads, alive until the work completes (then reusable)."""


class ReduceUnit(Protocol):
    """What one reduce-scatter averages into this rank's fp32 grad shard (see the module docstring)."""

    window: GradWindow
    """Whether the unit's next write is the window's first (it overwrites its slice of the grad shard)."""

    def add_grad(self, name: str, grad: torch.Tensor) -> None:
        """Param `name`'s full grad into the unit's staging buffer (which must be there)."""
        ...

    def issue(self) -> ReduceWork:
        """Reduce-scatter (average) the staged grads, asynchronously; the unit lets go of its staging."""
        ...

    def write(self, out: torch.Tensor, *, accumulate: bool, host_staging: torch.Tensor | None) -> None:
        """The unit's fp32 grad shard <- (accumulate=False) or += a completed reduce-scatter's output.
        host_staging: a reusable pinned buffer for an accumulating copy to the host."""
        ...


class ReducePipeline:
    """[Note: device-summed window]
    With the grad shards on the host (optimizer offload) and a window of several micro-steps, writing every
    micro-step's reduced grads into the host shard costs a device->host copy of the whole shard per
    micro-step, and each accumulating add waits for its copy on the host (DeepSpeed's offload does the same
    copy per micro-step). With `sum_on_device`, each unit's reduced grads are summed instead in an fp32
    tensor on the device (`_sums`: overwritten by the unit's first reduce of the window, added to after it,
    the same fp32 adds in micro-step order as the host path, so the same values bit for bit), and the sum is
    copied into the host shard by the write of the backward expected to end the window (`window_ends`, set
    by the engine before each backward): the copies then run per unit as that last backward reduces, behind
    its remaining work, and every grad element crosses once a step. A boundary the caller sets earlier than
    expected copies what is left at finish_window (`flush`); a later one copies again at the next flush.
    The device sums are the window's final grads, so the norm's sum of squares is taken from them on the
    device (`window_grad_sq`), not from the host shards. Cost: an fp32 copy of this rank's grad shard on the
    device from the window's first backward to the step (freed by reset_accumulation)."""

    def __init__(
        self,
        units: Sequence[ReduceUnit],
        *,
        device: torch.device,
        shard_device: torch.device,
        host_staging_numel: int,
        track_grad_sq: bool,
        write_on_reduce_stream: bool,
        sum_on_device: bool = False,
    ):
        """units: every unit that may be issued. write_on_reduce_stream: a unit's write runs on the
        collective's stream, before the compute stream waits for it (`Pending.wait(then=)`), else on the
        compute stream after. host_staging_numel: the largest unit shard, for the pinned buffer an
        accumulating copy to host shards lands in. sum_on_device: [Note: device-summed window]."""
        self.units = list(units)
        self.sum_on_device = sum_on_device
        self._sums: dict[int, torch.Tensor] = {}
        """sum_on_device: id(unit) -> the window's fp32 sum of its reduced grads, on the device."""
        self._unflushed: set[int] = set()
        """sum_on_device: ids of units whose sum changed since it was last copied into the host shard."""
        self.window_ends = True
        """sum_on_device: the backward under way is expected to be its window's last (its writes flush)."""
        self.device = device
        self.shard_device = shard_device
        self._host_staging_numel = host_staging_numel
        self._host_staging: torch.Tensor | None = None
        self.write_on_reduce_stream = write_on_reduce_stream
        self._grad_sq = torch.zeros((), dtype=torch.float32, device=device) if track_grad_sq else None
        self.in_flight: deque[ReduceWork] = deque()
        self.issued_count = 0
        """Reduce-scatters issued since the last reset_issued() (tests read it from inside backward)."""

    def issue(self, unit: ReduceUnit) -> ReduceWork:
        """Issue `unit`'s reduce-scatter (on the reduce stream, through comm.py) and queue it."""
        with phases.phase(phases.REDUCE_ISSUE):
            work = unit.issue()
        self.in_flight.append(work)
        self.issued_count += 1
        return work

    def complete_oldest(self) -> ReduceWork:
        """Await the oldest work in flight and write it into its unit's grad shard."""
        work = self.in_flight.popleft()
        unit = work.unit
        accumulate = unit.window is GradWindow.ACCUMULATING
        if self.sum_on_device:
            self._complete_into_sum(work, accumulate)
            unit.window = GradWindow.ACCUMULATING
            return work

        def write() -> None:
            if self._grad_sq is not None:
                # only meaningful when a window is one micro-step (the engine asks for it only then).
                self._grad_sq.add_(sum_of_squares([work.out]))
            unit.write(work.out, accumulate=accumulate, host_staging=self._staging_for(accumulate))

        with phases.phase(phases.REDUCE_WRITE):
            if self.write_on_reduce_stream:
                work.pending.wait(then=write)
            else:
                work.pending.wait()
                write()
        unit.window = GradWindow.ACCUMULATING
        return work

    def _complete_into_sum(self, work: ReduceWork, accumulate: bool) -> None:
        """sum_on_device: the reduced grads into the unit's device sum; copied into the host shard when this
        backward ends the window ([Note: device-summed window])."""
        unit, key, flush = work.unit, id(work.unit), self.window_ends

        def write() -> None:
            if accumulate:
                total = self._sums[key]
                total.add_(work.out)
            else:
                # allocated on the stream that writes it first (the reduce stream for stage 2): a block freed
                # by the compute stream after this reduce was issued may still be read by its queued kernels.
                # The compute stream waits for this stream before it reads the sum or frees it after the step.
                total = self._sums[key] = work.out.to(torch.float32, copy=True)
            if flush:
                unit.write(total, accumulate=False, host_staging=None)

        with phases.phase(phases.REDUCE_WRITE):
            if self.write_on_reduce_stream:
                work.pending.wait(then=write)
            else:
                work.pending.wait()
                write()
        if flush:
            self._unflushed.discard(key)
        else:
            self._unflushed.add(key)

    def flush(self) -> None:
        """At the boundary, with nothing in flight: the device sums not yet in the host shard are copied
        there (a boundary earlier than the engine expected), on the compute stream."""
        if not self._unflushed:
            return
        with phases.phase(phases.REDUCE_WRITE):
            for unit in self.units:
                if id(unit) in self._unflushed:
                    unit.write(self._sums[id(unit)], accumulate=False, host_staging=None)
        self._unflushed.clear()

    def window_grad_sq(self) -> torch.Tensor | None:
        """sum_on_device: the sum of squares of the window's grads, from the device sums (None when there
        are none: no backward in the window, or not sum_on_device)."""
        if not self._sums:
            return None
        return sum_of_squares(list(self._sums.values()))

    @property
    def device_sum_bytes(self) -> int:
        """Bytes of the device sums held now ([Note: device-summed window])."""
        return sum(4 * t.numel() for t in self._sums.values())

    def _drop_sums(self) -> None:
        self._sums.clear()
        self._unflushed.clear()

    def drain(self) -> None:
        while self.in_flight:
            self.complete_oldest()

    def _staging_for(self, accumulate: bool) -> torch.Tensor | None:
        """The pinned host buffer an accumulating copy to host shards lands in (made at its first use)."""
        if accumulate and self.shard_device != self.device and self._host_staging is None:
            self._host_staging = placement.zeros(self._host_staging_numel, self.shard_device, pin=True)
        return self._host_staging

    def take_grad_sq(self) -> torch.Tensor | None:
        """Sum of squares of the grads reduced since the last call (track_grad_sq), on the device."""
        if self._grad_sq is None:
            return None
        sq = self._grad_sq.clone()
        self._grad_sq.zero_()
        return sq

    def reset_accumulation(self) -> None:
        """After a step: each unit's next reduced grads overwrite its grad shard (no zeroing pass); the
        device sums are freed."""
        for unit in self.units:
            unit.window = GradWindow.FRESH
        self._drop_sums()

    def reset_issued(self) -> None:
        self.issued_count = 0

    def discard(self) -> list[ReduceWork]:
        """The window is dropped: await what is in flight (its buffers are reused) without writing it,
        every unit FRESH again, the sum of squares dropped. Returns the awaited works."""
        works = []
        while self.in_flight:
            work = self.in_flight.popleft()
            work.pending.wait()
            works.append(work)
        self.reset_accumulation()
        if self._grad_sq is not None:
            self._grad_sq.zero_()
        return works


class DirectWrites:
    """World size 1: each param's grad written straight into its slice of the fp32 grad shard.

    The values are the reducing path's bit for bit: a slice is overwritten by its param's first gradient of
    the window (a copy, the exact upcast) and added to by later ones (fp32 adds in micro-step order); a slice
    that got no gradient in the window's first backward is zeroed at that backward's end, as the zeroed
    staging buffer would have written. GradShards.write keeps a one-micro-step window in the compute dtype
    ([Note: compute-dtype grads] in grad_shards.py)."""

    issued_count = 0
    """Always 0: nothing is reduced."""
    staging_bytes = 0

    def __init__(self, grad_shards: GradShards, slices: Mapping[str, GradSlice]):
        """slices: each param's slice of the grad shard, taken while the segments were held."""
        self.grad_shards = grad_shards
        self.slices = dict(slices)
        self._window = dict.fromkeys(self.slices, GradWindow.FRESH)
        self._seen_this_backward = False

    def write(self, name: str, grad: torch.Tensor) -> None:
        """From the param's post-accumulate-grad hook."""
        self._seen_this_backward = True
        accumulate = self._window[name] is GradWindow.ACCUMULATING
        with phases.phase(phases.STAGE_GRAD):
            self.grad_shards.write(self.slices[name], grad.reshape(-1), accumulate=accumulate)
        self._window[name] = GradWindow.ACCUMULATING

    def finish_backward(self) -> None:
        """A param without a gradient in the window so far counts as zero (its slice may hold the last
        window's values: the shards are not zeroed after a step)."""
        for name, window in self._window.items():
            if window is GradWindow.FRESH:
                self.grad_shards.zero(self.slices[name])
                self._window[name] = GradWindow.ACCUMULATING
        self._seen_this_backward = False

    def take_grad_sq(self) -> None:
        return None

    def reset_accumulation(self) -> None:
        self._window = dict.fromkeys(self.slices, GradWindow.FRESH)

    def discard(self) -> None:
        """The window is dropped: every param's slice FRESH again (nothing is in flight)."""
        self.reset_accumulation()
        self._seen_this_backward = False

    @property
    def busy(self) -> bool:
        return self._seen_this_backward
