"""Adam / AdamW over one chunk of the fp32 master in one pass that also writes the chunk's params.

[Note: fused step]
Without it a chunk's step is torch's fused optimizer over the fp32 master, moments and grads, then a copy of
the master into the compute-dtype params (or into the all-gather input): two passes over the master. Here one
elementwise function does both, and on CUDA torch.compile (inductor) turns it into one kernel, so the master is
read once and the 16-bit params written from registers (bench/master_step_probe.py measures the pattern).
The numerics are torch's fused Adam / AdamW (csrc fused_adam_utils: the grad multiplied
first, L2 decay into the grad or decoupled decay of the param, moments, bias corrections, the update), in
fp32, so parity with torch.optim holds to fp32 rounding.

Scalars that change from step to step (lr, the bias corrections, the gradient multiplier) are 0-dim tensors
on the chunk's device, so one compiled kernel serves every step and every chunk size (dynamic shapes); betas,
eps and weight decay are a group's constants. Off the accelerator the same function runs eagerly (tests).
`OptimizerOptions.fused_step` turns it on (stages 0-2 write the params or all-gather input in the kernel;
stage 3 steps with it and publishes with its own copy); recipes set it with train.compile_optimizer, on by
default with train.compile. The gain is about 1% of a step (bench/run.py's -fused rows) and the first step
pays its compile (a few seconds), which is why an eager run does not get it unasked. This module owns the arithmetic only; ShardOptimizer decides when it
runs and what it writes.
"""

from __future__ import annotations

import contextlib
import functools

import torch


def adam_chunk(
    master: torch.Tensor,
    grad: torch.Tensor,
    exp_avg: torch.Tensor,
    exp_avg_sq: torch.Tensor,
    out: torch.Tensor | None,
    multiplier: torch.Tensor | None,
    lr: torch.Tensor,
    bias_correction1: torch.Tensor,
    bias_correction2_sqrt: torch.Tensor,
    beta1: float,
    beta2: float,
    eps: float,
    weight_decay: float,
    decoupled: bool,
) -> None:
    """One Adam (decoupled=False: L2 decay added to the grad) or AdamW step of `master` in place, its moments
    updated in place, and `out` (any dtype, master's shape; None: nothing) set to the new master. `grad` (fp32
    or 16-bit) is read only (its values times `multiplier`, None = 1: unscaling and clipping). master and
    moments are fp32 or all bf16; the arithmetic is fp32 either way."""
    # the order of torch's fused kernel (aten/src/ATen/native/cuda/fused_adam_utils.cuh), term by term, in
    # fp32 whatever the tensors hold (its "opmath"): a 16-bit grad ([Note: compute-dtype grads] in
    # ../grad_shards.py) is upcast exactly; a bf16 master ([Note: bf16 master] in shard_optimizer.py) reads its
    # grads rounded to bf16, as torch's fused AdamW over bf16 params does, and master and moments are written
    # back rounded once. For fp32 tensors .to() is the tensor itself and the copies back are the updates.
    f32 = torch.float32
    g = grad.to(master.dtype).to(f32)
    if multiplier is not None:
        # a bf16 master's clipped grads are bf16 too (DeepSpeed and torch clip them in place); fp32: a no-op
        g = (g * multiplier).to(master.dtype).to(f32)
    p, m, v = master.to(f32), exp_avg.to(f32), exp_avg_sq.to(f32)
    if weight_decay != 0.0:
        if decoupled:
            p = p.sub(lr * weight_decay * p)
        else:
            g = g + p * weight_decay
    m = m.mul(beta1).add(g, alpha=1.0 - beta1)
    v = v.mul(beta2).add(g * g, alpha=1.0 - beta2)
    denom = v.sqrt() / bias_correction2_sqrt + eps
    p = p.sub(lr / bias_correction1 * m / denom)
    exp_avg.copy_(m)
    exp_avg_sq.copy_(v)
    master.copy_(p)
    if out is not None:
        out.copy_(p)


@functools.cache
def _compiled(backend: str = "inductor"):
    # dynamic: chunks differ in size; one graph per (out given, multiplier given, decay kind) at most
    return torch.compile(adam_chunk, dynamic=True, backend=backend)


def adam_chunk_for(device: torch.device):
    """adam_chunk as it runs on `device`: compiled into one kernel on CUDA, eager elsewhere. Call it inside
    `constants_traced()`."""
    return _compiled() if device.type == "cuda" else adam_chunk


def constants_traced() -> contextlib.AbstractContextManager:
    """Enter once around a step's chunk calls: betas, eps and weight decay (a group's constants) are traced as
    constants. Left dynamic (dynamo's default for floats) each becomes a graph input read back with .item() on
    every call: four host reads per chunk, a few hundred a step. Not entered per chunk: the config patch costs
    about half a compiled call's host time, and the chunks launch after the norm's host sync, where the GPU
    waits for the host."""
    return torch._dynamo.config.patch(specialize_float=True)


def step_scalars(
    lr: float, beta1: float, beta2: float, step: int, device: torch.device
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(lr, 1 - beta1^step, sqrt(1 - beta2^step)) as 0-dim fp32 tensors on `device`, for step number `step`
    (1 for the first). Fills, not torch.tensor(..., device=cuda): no blocking host->device copy."""
    values = (lr, 1.0 - beta1**step, (1.0 - beta2**step) ** 0.5)
    return tuple(torch.full((), v, dtype=torch.float32, device=device) for v in values)
