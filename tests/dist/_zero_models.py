"""A tiny model with every awkward feature the engine must handle, its data, and the one-process reference.

Awkward on purpose: a 17x31 weight (numel not divisible by 2, 3 or 4), tied weights, a frozen layer, a
buffer, 1-D params (the no-decay group). The reference is plain torch: one process, the global batch,
torch.optim on the same two param groups, torch's clip_grad_norm_, the lr of each step from DeepSpeed's and
nanoGPT's formulas -- groups and lrs written in _reference.py, nothing taken from zerolaunch.
"""

from __future__ import annotations

import _reference
import torch
import torch.nn.functional as F
from torch import nn

MICRO_BATCH = 3  # rows per rank per micro-step


class Block(nn.Module):
    """A pre-norm residual block of width 17: the repeated unit of the stage-3 test models."""

    def __init__(self):
        super().__init__()
        self.ln = nn.LayerNorm(17)
        self.fc = nn.Linear(17, 17)

    def forward(self, x):
        return x + torch.tanh(self.fc(self.ln(x)))


class Net(nn.Module):
    def __init__(self, seed: int = 0):
        super().__init__()
        torch.manual_seed(seed)
        self.inp = nn.Linear(31, 17)  # weight (17, 31)
        self.norm = nn.LayerNorm(17)
        self.l1 = nn.Linear(17, 17)
        self.frozen = nn.Linear(17, 17)
        self.frozen.requires_grad_(False)
        self.l2 = nn.Linear(17, 17)
        self.l2.weight = self.l1.weight  # tied
        self.head = nn.Linear(17, 5)
        self.register_buffer("shift", torch.randn(17))

    def forward(self, x):
        h = torch.tanh(self.norm(self.inp(x)))  # (B, 17)
        h = torch.relu(self.l1(h))
        h = self.frozen(h)
        h = self.l2(h) + self.shift
        return self.head(h)  # (B, 5)


def micro_batch(step: int, micro: int, world_size: int):
    """The global micro-batch (all ranks' rows, rank r owns rows [r*MICRO_BATCH, (r+1)*MICRO_BATCH))."""
    g = torch.Generator().manual_seed(1000 * step + micro)
    x = torch.randn(world_size * MICRO_BATCH, 31, generator=g)
    y = torch.randn(world_size * MICRO_BATCH, 5, generator=g)
    return x, y


def rank_rows(t: torch.Tensor, rank: int) -> torch.Tensor:
    return t[rank * MICRO_BATCH : (rank + 1) * MICRO_BATCH]


def train_engine(engine, rank: int, world_size: int, steps: int) -> list:
    infos = []
    gas = engine.options.gradient_accumulation_steps
    for step in range(steps):
        for micro in range(gas):
            x, y = micro_batch(step, micro, world_size)
            loss = F.mse_loss(engine(rank_rows(x, rank)), rank_rows(y, rank))
            engine.backward(loss)
            infos.append(engine.step())
    return infos


def reference_weights(options, world_size: int, steps: int, dtype=torch.float32):
    """(final weights {name: tensor}, [grad norm before clipping per step]) under EngineOptions `options`,
    computed in `dtype` (float64: the answer fp32 rounding is measured against)."""
    model = Net(0).to(dtype)

    def micro_loss(step, micro):
        x, y = micro_batch(step, micro, world_size)
        # the global mean = the mean over ranks of equal-size per-rank means.
        return F.mse_loss(model(x.to(dtype)), y.to(dtype))

    norms = _reference.train(model, options, steps, micro_loss)
    return {n: p.detach().clone() for n, p in model.named_parameters()}, norms
