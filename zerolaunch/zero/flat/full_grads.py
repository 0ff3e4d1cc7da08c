"""Stages 0/1 at world size > 1 (or with offload): full-size flat grad buffers, reduced at the boundary.

This module owns `FullGrads`, the grad path of FlatSharding where every param's `.grad` is a persistent view
into a full-size flat grad buffer (one per param group, the flat param buffers' layout): autograd
accumulates micro-steps into it in place with no communication, and at the accumulation boundary
`reduce_full_grads` reduce-scatters (stage 1) or all-reduces (stage 0) each bucket into the fp32 grad
shards. The hooked grad paths (stage 2, world size 1) are reducer.py's; the buffers and bucket views too.
"""

from __future__ import annotations

from collections import deque

import torch
from torch import nn

from .. import comm, placement
from ..grad_shards import GradShards
from ..layout import Layout
from ..optim.torch_optim import sum_of_squares
from ..sharding import StrategyContext
from .reducer import FlatParams, bucket_view, grad_shard_view


class FullGrads:
    """A reducer.GradPath: param.grad are views into `tensors`; the boundary reduces them into the shards."""

    issued_count = 0
    """Nothing is reduced from backward."""
    staging_bytes = 0

    def __init__(
        self,
        layout: Layout,
        flat_params: FlatParams,
        named_params: dict[str, nn.Parameter],
        grad_shards: GradShards,
        ctx: StrategyContext,
        *,
        track_grad_sq: bool,
    ):
        self.layout = layout
        self.flat_params = flat_params
        self.named_params = named_params
        self.grad_shards = grad_shards
        self.ctx = ctx
        self.track_grad_sq = track_grad_sq
        # autograd accumulates in place into an existing .grad of matching shape: the views persist.
        self.tensors = [torch.zeros_like(b) for b in flat_params.buffers]
        for slot in layout.params:
            named_params[slot.name].grad = flat_params.param_view(self.tensors, slot)

    @property
    def full_grad_bytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.tensors)

    @torch.no_grad()
    def begin_backward(self) -> None:
        """param.grad must be the view into the flat grad buffer; model.zero_grad() (set_to_none) or code
        that assigns .grad would otherwise make autograd write grads the engine never reduces."""
        for slot in self.layout.params:
            param = self.named_params[slot.name]
            view = self.flat_params.param_view(self.tensors, slot)
            grad = param.grad
            if grad is not None and grad.data_ptr() == view.data_ptr():
                continue
            if grad is None:
                view.zero_()  # set_to_none meant "no gradient so far"
            else:
                view.copy_(grad)
            param.grad = view

    def finish_backward(self) -> None:
        """Nothing in flight: the grads stay in the full buffers until the boundary."""

    def finish_window(self, loss_nonfinite: torch.Tensor | None, backwards: int):
        ctx = self.ctx
        self.begin_backward()
        if ctx.stage == 0 and loss_nonfinite is not None:
            # stage 0 all-reduces no norm: a bad loss travels as an inf in the grads it all-reduces
            first = self.tensors[0][:1]
            first.add_(torch.where(loss_nonfinite, float("inf"), 0.0).to(first.dtype))
        self.grad_shards.prepare_all_writes()  # every shard element is written by the reduction below
        device_sq = reduce_full_grads(
            self.layout,
            self.tensors,
            self.grad_shards,
            ctx.group,
            rank=ctx.rank,
            sharded=ctx.stage == 1,
            comm_dtype=ctx.comm_dtype,
            comm_device=ctx.device,
            stats=ctx.stats,
            track_grad_sq=self.track_grad_sq,
        )
        for g in self.tensors:
            g.zero_()
        # stage 0 put a bad loss into its grads above
        return device_sq, loss_nonfinite if ctx.stage > 0 else None

    def reset_accumulation(self) -> None:
        """The next boundary's reduction overwrites every shard element: nothing to reset."""

    def discard(self) -> None:
        """The window is dropped (the caller set every param.grad to None): every param.grad is its flat
        view again, zeroed."""
        self.begin_backward()


def reduce_full_grads(
    layout: Layout,
    full_grads: list[torch.Tensor],
    shards: GradShards,
    group,
    *,
    rank: int,
    sharded: bool,
    comm_dtype: torch.dtype,
    comm_device: torch.device,
    stats: comm.CommStats,
    max_in_flight: int = 2,
    track_grad_sq: bool = False,
) -> torch.Tensor | None:
    """Stages 0/1, at the boundary: shards (fp32) <- the rank's averaged slice of every bucket (overwritten;
    the caller ensured every segment is allocated).

    sharded=True reduce-scatters (stage 1); sharded=False all-reduces the whole bucket (stage 0, where the
    layout was planned for one rank, so the "slice" is the bucket). At most `max_in_flight` buckets are
    outstanding, which bounds the comm-dtype copies (e.g. fp32 copies of bf16 grads) to that many buckets.
    track_grad_sq: also return the sum of squares of what this rank received, taken on comm_device before
    the copy to the shards (saves the norm a pass over offloaded shards).
    """
    world = comm.world_size(group)
    issued: deque = deque()
    grad_sq = torch.zeros((), dtype=torch.float32, device=comm_device) if track_grad_sq else None

    def complete_oldest() -> None:
        bucket, out, pending = issued.popleft()
        pending.wait()
        if not sharded and world > 1:
            out.div_(world)
        if grad_sq is not None:
            grad_sq.add_(sum_of_squares([out]))
        placement.to_host(grad_shard_view(layout, shards, bucket), out, accumulate=False)

    for bucket in layout.buckets:
        src = bucket_view(full_grads, bucket)
        if src.dtype != comm_dtype or src.device != comm_device:
            src = src.to(comm_device, dtype=comm_dtype)
        if sharded:
            out = torch.empty(bucket.shard_numel, dtype=comm_dtype, device=comm_device)
            pending = comm.reduce_scatter(out, src, group, stats=stats, async_op=True, average=True)
        else:
            out = src
            pending = comm.all_reduce(out, group, op="sum", stats=stats, async_op=True)
        issued.append((bucket, out, pending))
        if len(issued) > max_in_flight:
            complete_oldest()
    while issued:
        complete_oldest()
    return grad_sq
