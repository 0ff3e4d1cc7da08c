"""One stage-3 unit as the schedule and the reduce pipeline see it: its params, its buffers, its grads.

`Stage3Unit` is stage 3's reduce unit (../reduce.py `ReduceUnit`), as FSDP2's `FSDPParamGroup` is one
group's owner: the unit's trainable params (whose grad hooks report to it), its `UnitFlat` buffers (the full
buffer and this rank's shard: unit_buffers.py), the staging buffer its grads are copied into until its
reduce-scatter is issued, the write of the result into its fp32 grad shard, and the schedule's state of it
in the current micro-step (held, prefetched, the input wrappers still waited for: [Note: stage-3
schedule] in schedule.py). A unit of frozen params only ([Note: frozen buckets] in unit_buffers.py) is one
too: it is gathered and freed like the others and never reduces.
"""

from __future__ import annotations

import torch

from .. import comm, placement
from ..grad_shards import GradShards
from ..reduce import ReduceWork
from ..sharding import GradWindow
from .unit_buffers import UnitFlat


class Stage3Unit:
    def __init__(
        self,
        index: int,
        flat: UnitFlat,
        module,
        params: list[tuple[str, torch.nn.Parameter]],
        context: comm.CommContext,
        *,
        comm_dtype: torch.dtype,
        stats: comm.CommStats,
        grad_shards: GradShards,
    ):
        """module: what the unit's forward hooks sit on (None for the resident unit); params: its trainable
        params, each of whose grad hooks reports here once per backward."""
        self.index = index
        self.flat = flat
        self.module = module
        self.params = params
        self.n_trainable = len(params)
        self.has_frozen = len(flat.frozen_buckets) > 0
        """Its backward ends when its inputs' grads exist ([Note: stage-3 schedule]), not at its last grad."""
        self.group = context.group
        self.device = context.device
        self.stream = context.reduce_stream
        self.comm_dtype = comm_dtype
        self.stats = stats
        self.grad_shards = grad_shards
        """Where the flat's grad views point; its segments are (re-)allocated before a write ([Note: released
        grad shards] in ../grad_shards.py)."""
        self.window = GradWindow.FRESH
        self.staging: torch.Tensor | None = None
        """This micro-step's grads (comm dtype, the trainable buckets' padded size) until `issue`."""
        self.held = False
        """Kept gathered from its forward until its backward is done ([Note: stage-3 schedule])."""
        self.prefetched = False
        """Gathered by a prefetch and not yet used (a use counts a prefetch hit)."""
        self.reset_backward()

    def reset_backward(self) -> None:
        """A new backward: no grad arrived, no input wrapper pending, no output hooked."""
        self.input_waits = 0
        """Its input wrappers whose backward has not run yet (units with frozen params)."""
        self.grads_in = False
        """All of its trainable grads arrived in this backward."""
        self.hooked = False
        """Its outputs got the pre-backward hook in the forwards since the last backward."""

    @property
    def backward_done(self) -> bool:
        """Nothing in this backward reads the unit's params any more ([Note: stage-3 schedule])."""
        return self.input_waits == 0 and (self.grads_in or self.n_trainable == 0)

    # ---- the reduce unit -------------------------------------------------------------------------------
    def add_grad(self, name: str, grad: torch.Tensor) -> None:
        if self.staging is None:
            self.staging = self._zeroed_staging()
        with torch.no_grad():
            self.flat.param_view(self.staging, name).copy_(grad)

    def _zeroed_staging(self) -> torch.Tensor:
        # zeroed: padding and params without a grad this micro-step count as zero
        return torch.zeros(self.flat.train_padded_numel, dtype=self.comm_dtype, device=self.device)

    def issue(self) -> ReduceWork:
        """Reduce-scatter (average) the staged grads (zeros where none came) into this rank's shard of every
        trainable bucket, back to back: one call reduces them all."""
        staging = self.staging if self.staging is not None else self._zeroed_staging()
        self.staging = None
        flat = self.flat
        out = torch.empty(flat.train_shard_numel, dtype=self.comm_dtype, device=self.device)
        fulls = [flat.bucket_full(staging, i) for i in flat.trainable_buckets]
        pending = comm.reduce_scatter(
            out, fulls, self.group, stats=self.stats, async_op=True, average=True, stream=self.stream
        )
        return ReduceWork(self, out, pending, staging)

    def write(self, out: torch.Tensor, *, accumulate: bool, host_staging: torch.Tensor | None) -> None:
        """On the compute stream (which writes the segments and later frees them)."""
        flat = self.flat
        for segment in flat.grad_segments:
            self.grad_shards.prepare_write(segment)
        for i in flat.trainable_buckets:
            placement.to_host(
                flat.grad_views[i], flat.bucket_shard(out, i), accumulate=accumulate, staging=host_staging
            )

    @property
    def staging_bytes(self) -> int:
        return 0 if self.staging is None else self.staging.numel() * self.staging.element_size()
