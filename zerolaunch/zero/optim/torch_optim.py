"""The inner torch optimizer over flat fp32 shards, and the global gradient norm.

This module owns: choosing and building the torch optimizer (AdamW / Adam / SGD) with the fastest
implementation the device supports, and the exact global grad norm over sharded gradients. It does not own
the shards themselves (engine / flat buffers) nor the lr schedule (sched.py).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from .. import comm
from ..options import OptimizerOptions

# kinds of per-element optimizer state, by optimizer name, as named in fragment_state keys.
STATE_KINDS = {
    "adamw": ("exp_avg", "exp_avg_sq"),
    "adam": ("exp_avg", "exp_avg_sq"),
    "sgd": ("momentum_buffer",),
}


def _implementation(device: torch.device) -> dict:
    # fused kernels exist for CUDA and (since torch 2.4) CPU for all three optimizers; on other devices
    # fall back to the default implementation. fused is one kernel over the whole flat shard.
    if device.type in ("cuda", "cpu"):
        return {"fused": True}
    return {}


def build_optimizer(
    options: OptimizerOptions, groups: list[dict], device: torch.device
) -> torch.optim.Optimizer:
    """A torch optimizer over `groups` (dicts with params=[flat fp32 tensor], weight_decay=float and optional
    betas / eps overriding the options'; a group's lr is set per step by the caller).

    `device` is where the params (the fp32 master shards) live: the accelerator, or the CPU when offloaded.
    """
    torch_groups = []
    for g in groups:
        tg = {"params": list(g["params"]), "weight_decay": float(g["weight_decay"])}
        if options.name in ("adamw", "adam"):
            tg.update({k: g[k] for k in ("betas", "eps") if g.get(k) is not None})
        torch_groups.append(tg)
    impl = _implementation(device)
    if options.name == "adamw":
        return torch.optim.AdamW(
            torch_groups, lr=options.lr, betas=tuple(options.betas), eps=options.eps, **impl
        )
    if options.name == "adam":
        return torch.optim.Adam(
            torch_groups, lr=options.lr, betas=tuple(options.betas), eps=options.eps, **impl
        )
    if options.name == "sgd":
        return torch.optim.SGD(torch_groups, lr=options.lr, momentum=options.momentum, **impl)
    raise AssertionError(f"optimizer.name {options.name!r}: refused by zero/option_rules.py before this")


def state_kinds(options: OptimizerOptions) -> tuple[str, ...]:
    """Per-element state tensors the optimizer keeps (SGD without momentum keeps none)."""
    if options.name == "sgd" and options.momentum == 0:
        return ()
    return STATE_KINDS[options.name]


_CPU_CHUNK_NUMEL = 1 << 20


def _sum_of_squares(g: torch.Tensor) -> torch.Tensor:
    """sum(g**2) in fp32 (accumulated in fp64 across chunks on the CPU).

    On the CPU, torch.linalg.vector_norm is ~10x slower than BLAS dot on large flat tensors (155 ms vs 16 ms
    for 353M fp32 elements on 16 cores), which dominates an offloaded step; dot per 1M-element chunk keeps
    fp32 rounding local to a chunk and sums the chunks in fp64.
    """
    if g.device.type != "cpu":
        return torch.linalg.vector_norm(g, dtype=torch.float32) ** 2
    total = torch.zeros((), dtype=torch.float64)
    for chunk in g.split(_CPU_CHUNK_NUMEL):
        chunk = chunk.float()  # a 16-bit shard ([Note: compute-dtype grads]): the fp32 shard's very sum
        total += torch.dot(chunk, chunk)
    return total.float()


def sum_of_squares(grads: list[torch.Tensor]) -> torch.Tensor:
    """sum(g**2) over every tensor, an fp32 scalar on the first one's device (zero for an empty list)."""
    device = grads[0].device if grads else torch.device("cpu")
    sq = torch.zeros((), dtype=torch.float32, device=device)
    for g in grads:
        if g.numel():
            sq += _sum_of_squares(g)
    return sq


@dataclass(frozen=True)
class GradScaling:
    """What the step needs to know about this window's gradients (see `check_and_scale`)."""

    overflow: bool
    """fp16 only: an inf/nan on some rank; every rank skips the step."""
    grad_norm: float
    """Global L2 norm of the true (unscaled) gradient, before clipping; non-finite on overflow. Read from the
    device together with the overflow decision: one host read per step ([Note: boundary sync])."""
    multiplier: torch.Tensor | None
    """Scalar every gradient element is multiplied by before the optimizer reads it (1/loss scale times the
    clip factor); None when that is exactly 1."""


def note_nonfinite_loss(flag: torch.Tensor | None, loss: torch.Tensor) -> torch.Tensor:
    """flag | (loss is inf/nan), on the loss's device with no host sync: a NaN loss whose grads came out
    finite (a detached or masked term) must still skip the step (check_and_scale(loss_nonfinite=...))."""
    bad = ~torch.isfinite(loss.detach())
    return bad if flag is None else flag | bad


def check_and_scale(
    local_sq: torch.Tensor,
    group,
    *,
    sharded: bool,
    loss_scale: float,
    clip_norm: float,
    comm_device: torch.device,
    stats: comm.CommStats | None = None,
    loss_nonfinite: torch.Tensor | None = None,
) -> GradScaling:
    """The common part of every step, from the sum of squares of this rank's (still loss-scaled) grads.

    sharded=True: each rank holds a disjoint piece (its owned shards; padding is zero), so the global sum is
    all_reduce(local sums); sharded=False: every rank holds the full gradient (stage 0). Every dtype: a
    non-finite sum means an inf/nan somewhere (or a grad past 1.8e19, whose square overflows fp32), the same
    on every rank after the all-reduce, so every rank skips together: DeepSpeed's bf16 rule (an all-reduced
    inf/nan flag, then an invalid global norm) and its fp16 one; grad_norm is then that non-finite value. The
    norm is reported before clipping, as DeepSpeed does; clipping is torch's rule, min(1, clip / (norm +
    1e-6)). Nothing is written to the grads: the multiplier is applied by the step (shard_optimizer.py).
    `comm_device`: where the group can reduce (the accelerator when the grads were offloaded under nccl).
    `loss_nonfinite` (note_nonfinite_loss over the window): a bad loss on this rank makes its sum inf, so
    the all-reduce carries it to every rank (sharded only: stage 0 puts it in the grads before their
    all-reduce instead).
    """
    home = local_sq.device
    sq = local_sq.to(comm_device, torch.float32)
    if loss_nonfinite is not None:
        sq = sq + torch.where(loss_nonfinite.to(comm_device), float("inf"), 0.0)
    if sharded:
        comm.all_reduce(sq, group, op="sum", stats=stats)
    sq = sq.to(home)
    norm = sq.sqrt()
    if loss_scale != 1.0:
        norm = norm / loss_scale
    # the one host read of the step: the skip decision and the reported norm together, before any of the
    # step's kernels is queued (a read after them would wait for the whole step)
    sq_value, norm_value = torch.stack([sq, norm]).tolist()
    if not math.isfinite(sq_value):
        return GradScaling(True, norm_value, None)
    multiplier = None
    if loss_scale != 1.0:
        multiplier = torch.full((), 1.0 / loss_scale, dtype=torch.float32, device=home)
    if clip_norm > 0:
        coef = torch.clamp(clip_norm / (norm + 1e-6), max=1.0)
        multiplier = coef if multiplier is None else multiplier * coef
    return GradScaling(False, norm_value, multiplier)
