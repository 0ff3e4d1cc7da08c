"""Flat buffers and gradient buckets of the stage 0-2 engine.

This module owns the tensors behind [Note: layout]: per param group one contiguous compute-dtype buffer
whose slices are the model's parameters (`FlatParams`), the arithmetic from a bucket to its slices (the
whole bucket, the slice a rank owns, the matching piece of the rank's flat shard), and the two ways
gradients reach the fp32 shards:

- full_grads.py `FullGrads` (stages 0/1): at the accumulation boundary, every bucket of the full gradient
  buffer is reduce-scattered (stage 1) or all-reduced (stage 0) and averaged over the ranks.
- `BackwardReducer` (stage 2): during backward, a bucket's reduce-scatter is issued the moment its last
  gradient is ready (post-accumulate-grad hooks); the full gradient is copied into a staging buffer and
  released at once, so a rank keeps only its fp32 shard, accumulated over micro-steps.
- `DirectAccumulator` (any stage, world size 1, shards on the compute device): no reduction is needed, so
  each gradient is added straight into the fp32 shard from its post-accumulate-grad hook and released: no
  full gradient buffer, no staging, no reduce outputs ([Note: world size 1]).

Buckets are issued strictly in bucket-index order on every rank (a ready bucket waits for the ones before
it), so the sequence of collectives is identical on all ranks whatever order autograd produces grads in.
It does not own the optimizer, the step or the checkpoint contract (engine.py).
"""

from __future__ import annotations

from typing import Protocol

import torch

from .. import comm, phases, placement, plan
from ..grad_shards import GradShards
from ..layout import BucketPlan, Layout, ParamSlot
from ..reduce import DirectWrites, ReducePipeline, ReduceWork
from ..sharding import GradWindow
from ..weak_hooks import weak_partial


def bucket_view(flats: list[torch.Tensor], bucket: BucketPlan) -> torch.Tensor:
    """The whole (padded) bucket inside its group's flat buffer."""
    return flats[bucket.group][bucket.group_offset : bucket.group_offset + bucket.padded_numel]


def owned_view(flats: list[torch.Tensor], bucket: BucketPlan, rank: int) -> torch.Tensor:
    """The slice of the bucket that `rank` owns, inside the group's flat buffer."""
    lo, hi = bucket.shard_range(rank)
    return bucket_view(flats, bucket)[lo:hi]


def grad_shard_view(layout: Layout, grads: GradShards, bucket: BucketPlan) -> torch.Tensor:
    """The bucket's piece of a rank's fp32 grad shard of its group (one segment: plan.flat_grad_segments)."""
    return grads.view(bucket.group, layout.bucket_shard_offset(bucket), bucket.shard_numel)


class FlatParams:
    """Per group a flat compute-dtype buffer; every trainable parameter becomes a view into it."""

    def __init__(
        self,
        layout: Layout,
        params_by_name: dict[str, torch.nn.Parameter],
        num_groups: int,
        dtype: torch.dtype,
        device: torch.device,
    ):
        self.layout = layout
        self.buffers = [
            torch.zeros(layout.group_numel(g), dtype=dtype, device=device) for g in range(num_groups)
        ]
        self.slot_of: dict[str, ParamSlot] = {}
        with torch.no_grad():
            for slot in layout.params:
                param = params_by_name[slot.name]
                view = self.param_view(self.buffers, slot)
                view.copy_(param.detach().reshape(slot.shape))
                # the Parameter object stays the same (the model, optimizers of tied modules and user code
                # keep their references); only its storage moves into the flat buffer.
                param.data = view
                self.slot_of[slot.name] = slot

    def param_view(self, flats: list[torch.Tensor], slot: ParamSlot) -> torch.Tensor:
        """The parameter's elements inside a flat buffer (params or full grads), in its shape."""
        start = self.layout.buckets[slot.bucket].group_offset + slot.offset
        return flats[slot.group][start : start + slot.numel].view(slot.shape)


class GradPath(Protocol):
    """How grads reach the fp32 shards in stages 0-2, chosen once at construction (FlatSharding): a
    `BackwardReducer` (stage 2), a `DirectAccumulator` (world size 1) or full_grads.FullGrads (stages 0/1)."""

    issued_count: int
    """Reduce-scatters issued from backward since construction (tests read it from inside backward)."""

    @property
    def staging_bytes(self) -> int: ...

    @property
    def full_grad_bytes(self) -> int:
        """Bytes of full-size grad buffers held between backward and the boundary (stages 0/1)."""
        ...

    def begin_backward(self) -> None: ...

    def finish_backward(self) -> None: ...

    def finish_window(
        self, loss_nonfinite: torch.Tensor | None, backwards: int
    ) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        """At the boundary, the window's grads into the shards: Sharding.finish_window's answer, before the
        host sync and the zeroing of unwritten segments."""
        ...

    def reset_accumulation(self) -> None: ...

    def discard(self) -> None: ...


class GradReducer(GradPath, Protocol):
    """A GradPath whose post-accumulate-grad hooks take each grad as it arrives: `BackwardReducer` (stage 2)
    or `DirectAccumulator` (world size 1)."""

    @property
    def busy(self) -> bool:
        """A backward of this micro-step has written grads that finish_backward has not drained yet."""
        ...

    def hook_for(self, slot: ParamSlot):
        """The post-accumulate-grad hook of the param in `slot`; it holds the reducer weakly ([Note: weak
        hooks] in ../weak_hooks.py)."""
        ...

    def take_grad_sq(self) -> torch.Tensor | None: ...


class _HookedReducer:
    """What both hooked reducers do the same way at the boundary and outside backward."""

    full_grad_bytes = 0

    def begin_backward(self) -> None:
        pass

    def finish_window(self, loss_nonfinite: torch.Tensor | None, backwards: int):
        if self.busy:
            self.finish_backward()
        device_sq = self.take_grad_sq()
        # summed per backward (asked for at accumulation 1 only): the window's norm only when the window is
        # one backward; a caller-set boundary can make it several.
        return (device_sq if backwards == 1 else None), loss_nonfinite


class BucketUnit:
    """One stage-2 bucket as a reduce unit (../reduce.py `ReduceUnit`): its params' slots, its piece of the
    fp32 grad shard, and the staging buffer it holds from its first grad until its reduce-scatter is issued
    (`stage`: the buffer comes from BackwardReducer's pool, which takes it back once the work completed)."""

    def __init__(
        self,
        layout: Layout,
        bucket: BucketPlan,
        shards: GradShards,
        context: comm.CommContext,
        *,
        comm_dtype: torch.dtype,
        stats: comm.CommStats,
    ):
        self.bucket = bucket
        self.slots = {slot.name: slot for slot in layout.slots_in(bucket)}
        self.segment = shards.index_of(bucket.group, layout.bucket_shard_offset(bucket))
        self.grad_shard = grad_shard_view(layout, shards, bucket)
        self.group = context.group
        self.device = context.device
        self.stream = context.reduce_stream
        self.comm_dtype = comm_dtype
        self.stats = stats
        self.window = GradWindow.FRESH
        self.staging: tuple[torch.Tensor, torch.Tensor] | None = None
        """(the pool's buffer, the bucket's zeroed view of it) from `stage` until `issue`."""

    def stage(self, base: torch.Tensor) -> None:
        """Stage into `base` (zeroed: padding and params without a grad this micro-step count as zero)."""
        view = base[: self.bucket.padded_numel]
        view.zero_()
        self.staging = (base, view)

    def add_grad(self, name: str, grad: torch.Tensor) -> None:
        slot = self.slots[name]
        with torch.no_grad():
            self.staging[1][slot.offset : slot.offset + slot.numel].copy_(grad.reshape(-1))

    def issue(self) -> ReduceWork:
        (base, src), self.staging = self.staging, None
        out = torch.empty(self.bucket.shard_numel, dtype=self.comm_dtype, device=self.device)
        pending = comm.reduce_scatter(
            out, src, self.group, stats=self.stats, async_op=True, average=True, stream=self.stream
        )
        return ReduceWork(self, out, pending, base)

    def write(self, out: torch.Tensor, *, accumulate: bool, host_staging: torch.Tensor | None) -> None:
        placement.to_host(self.grad_shard, out, accumulate=accumulate, staging=host_staging)

    def drop_staging(self) -> torch.Tensor | None:
        """The window is dropped: the staging buffer back (None when none was taken)."""
        staging, self.staging = self.staging, None
        return None if staging is None else staging[0]


class BackwardReducer(_HookedReducer):
    """Stage 2: per-bucket reduce-scatter issued from post-accumulate-grad hooks during backward.

    [Note: stage-2 buffers] A bucket takes a staging buffer (comm dtype, the bucket's padded size, zeroed, so
    padding and params without a grad this micro-step contribute zeros) when its first grad arrives, and
    gives it back once its reduce-scatter has completed and the result was added into the fp32 shard. With
    overlap, at most `max_in_flight` staging buffers are kept: taking one beyond that first completes the
    oldest issued bucket. Without overlap each reduce-scatter is awaited right after it is issued. Every one
    of these decisions, and the bucket-index issue order, is `plan.StagingPool`'s (estimate-memory drives the
    same object); this class keeps the free buffers, each `BucketUnit` the one it stages in.
    On CUDA with overlap the collectives run on `stream` (the context's reduce stream) with comm.py's waits
    ([Note: comm streams]): it waits for the compute stream (the staging copies) before each; the result is
    added into the shard on it, and the compute stream waits for it then, so before a buffer is reused and
    at the end of backward. Tensors stay alive by reference in the pipeline's works, so no record_stream is
    needed.
    """

    def __init__(
        self,
        layout: Layout,
        shards: GradShards,
        context: comm.CommContext,
        *,
        comm_dtype: torch.dtype,
        stats: comm.CommStats,
        max_in_flight: int = plan.STAGING_MAX_IN_FLIGHT,
        track_grad_sq: bool = False,
        sum_on_device: bool = False,
    ):
        """sum_on_device: [Note: device-summed window] in ../reduce.py."""
        self.layout = layout
        self.shards = shards
        """The fp32 grad shards; a bucket's segment is (re-)allocated before its first write ([Note: released
        grad shards])."""
        self.units = [
            BucketUnit(layout, b, shards, context, comm_dtype=comm_dtype, stats=stats) for b in layout.buckets
        ]
        self.comm_dtype = comm_dtype
        self.device = context.device
        self.overlap = context.overlap
        # the staging policy estimate-memory drives too (plan.stage2_staging_buffers)
        self.pool = plan.StagingPool(
            [len(layout.slots_in(b)) for b in layout.buckets], self.overlap, max_in_flight
        )
        self._buffer_numel = max((b.padded_numel for b in layout.buckets), default=0)
        self._free: list[torch.Tensor] = []
        """Staging buffers no bucket holds, for the pool's next take without allocate."""
        self.pipeline = ReducePipeline(
            self.units,
            device=self.device,
            shard_device=shards.tensors[0].device if shards.tensors else self.device,
            host_staging_numel=max((b.shard_numel for b in layout.buckets), default=0),
            track_grad_sq=track_grad_sq,
            # the reduced slice is added into the shard on the reduce stream (see above)
            write_on_reduce_stream=True,
            sum_on_device=sum_on_device,
        )

    @property
    def issued_count(self) -> int:
        """Reduce-scatters issued since construction (tests read it from inside backward)."""
        return self.pipeline.issued_count

    @property
    def full_grad_bytes(self) -> int:
        """The window's device sums of the reduced grads, when offloaded grads are summed on the device."""
        return self.pipeline.device_sum_bytes

    def finish_window(self, loss_nonfinite: torch.Tensor | None, backwards: int):
        if not self.pipeline.sum_on_device:
            return super().finish_window(loss_nonfinite, backwards)
        if self.busy:
            self.finish_backward()
        self.pipeline.flush()
        # the device sums are the window's grads whatever its number of backwards
        return self.pipeline.window_grad_sq(), loss_nonfinite

    @property
    def staging_bytes(self) -> int:
        return (
            self.pool.allocated * self._buffer_numel * torch.empty((), dtype=self.comm_dtype).element_size()
        )

    def hook_for(self, slot: ParamSlot):
        return weak_partial(self._on_grad_ready, slot)  # [Note: weak hooks]

    def _on_grad_ready(self, slot: ParamSlot, param: torch.Tensor) -> None:
        if param.grad is None:
            return
        unit = self.units[slot.bucket]
        with phases.phase(phases.STAGE_GRAD):
            # here, on the compute stream, not in the unit's write (which may run on the reduce stream):
            # the block then belongs to the stream that frees it after the step.
            self.shards.prepare_write(unit.segment)
            self._stage(unit)
            unit.add_grad(slot.name, param.grad)
        param.grad = None  # the full gradient is released: this rank keeps only its shard
        for index in self.pool.grad_ready(slot.bucket):
            self._issue(self.units[index])

    def _stage(self, unit: BucketUnit) -> None:
        """The unit holds a staging buffer (taken as the pool decides) from here until it is issued."""
        take = self.pool.take(unit.bucket.index)
        if take is None:
            return
        if take.complete_oldest:
            self._complete_oldest()
        if take.allocate:
            unit.stage(torch.empty(self._buffer_numel, dtype=self.comm_dtype, device=self.device))
        else:
            unit.stage(self._free.pop())

    def _issue(self, unit: BucketUnit) -> None:
        self._stage(unit)
        self.pipeline.issue(unit)
        if self.pool.issue(unit.bucket.index):
            self._complete_oldest()

    def _complete_oldest(self) -> None:
        """The pool's oldest in-flight bucket (the pool has just counted it completed): its reduced slice is
        added into the shard on the reduce stream, after which the compute stream may overwrite its staging
        buffer (the next bucket's staging copies)."""
        self._free.append(self.pipeline.complete_oldest().staging)

    def take_grad_sq(self) -> torch.Tensor | None:
        """The sum of squares of the reduced grads since the last call (track_grad_sq), on the device."""
        return self.pipeline.take_grad_sq()

    def reset_accumulation(self) -> None:
        """After a step: the next micro-step's reduced grads overwrite the shards (no zeroing pass needed)."""
        self.pipeline.reset_accumulation()

    def finish_backward(self) -> None:
        """Issue every bucket not yet issued (grads missing this micro-step count as zero), await all."""
        self.shards.prepare_all_writes()
        for index in self.pool.unissued():
            self._issue(self.units[index])
        while self.pool.in_flight:
            self.pool.complete_oldest()
            self._complete_oldest()
        self.pool.end_backward()

    def discard(self) -> None:
        """The window is dropped: await the reduce-scatters in flight (their buffers are reused), drop the
        staged grads, every bucket FRESH again."""
        self._free.extend(work.staging for work in self.pipeline.discard())
        self._free.extend(base for unit in self.units if (base := unit.drop_staging()) is not None)
        self.pool.discard()

    @property
    def busy(self) -> bool:
        return self.pool.busy


class DirectAccumulator(_HookedReducer, DirectWrites):
    """World size 1: every gradient goes straight into its slice of the fp32 shard, from its hook.

    [Note: world size 1] With one rank a reduce-scatter or all-reduce is the identity, so the staging
    buckets, the reduce outputs (stage 2) and the full gradient buffer with its fp32 copies (stages 0/1)
    hold data nothing needs. The values are those of the reducing paths, bit for bit: the shard slice of
    a param is overwritten by its first gradient of the window (a copy, i.e. the exact upcast) and added to
    by later ones (fp32 adds in micro-step order, as autograd's in-place accumulation into a full fp32
    .grad and the stage-2 shard accumulation do); a slice that got no gradient in the window's first
    micro-step is zeroed at its end, as the zeroed staging bucket would have written. (For a 16-bit model
    with gradient accumulation, stages 0/1 thereby accumulate in fp32 as stage 2 does, not in the compute
    dtype; the engine takes this path for stages 0/1 only where that is exact: fp32 or one micro-step.)
    It needs the shards on the compute device (no offload): per-param host copies would be slow. With one
    micro-step per window a 16-bit model's grads stay in the compute dtype (GradShards.write, [Note:
    compute-dtype grads] in ../grad_shards.py). A GradReducer over reduce.DirectWrites.
    """

    def __init__(self, layout: Layout, shards: GradShards):
        # a param's segment is (re-)allocated before its first write ([Note: released grad shards]):
        # backward then allocates them one segment at a time, in the order it frees activations.
        self.layout = layout
        starts = [layout.bucket_shard_offset(layout.buckets[s.bucket]) + s.offset for s in layout.params]
        super().__init__(
            shards,
            {s.name: shards.slice(s.group, a, s.numel) for s, a in zip(layout.params, starts, strict=True)},
        )

    def hook_for(self, slot: ParamSlot):
        return weak_partial(self._on_grad_ready, slot)  # [Note: weak hooks]

    def _on_grad_ready(self, slot: ParamSlot, param: torch.Tensor) -> None:
        if param.grad is None:
            return
        self.write(slot.name, param.grad)
        param.grad = None  # released: the shard holds it now
