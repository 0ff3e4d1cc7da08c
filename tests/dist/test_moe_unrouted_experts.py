"""Mixture-of-experts under ZeRO-2 and ZeRO-3: experts that a step routes no token to, on one rank or on all.

An expert no token reaches never runs, so its params get no gradient on that rank: the rank's reduce for that
bucket / unit must still be issued (or the other rank waits forever), with zeros for those params, and the
next step must not reuse the previous step's gradient. The router here is the data's (a route per row) so
which experts idle is exact:
- step 0: rank 1 routes no row to experts 2 and 3 (rank 0 does);
- step 1: no rank routes a row to expert 3;
- step 2: rank 0 routes every row to expert 3, rank 1 none.
Checked against one process on the global batch with plain torch AdamW, where a param that got no gradient
holds a zero gradient (DeepSpeed's meaning of "no gradient" in flat buffers): the final weights match.
(transformers 5's own MoE layers keep experts fused in one 3-D param, which always gets a gradient; the
per-expert modules here are the harder case: the 4.x layout, and custom models.)
Leaves out: GPUs, expert parallelism (every rank holds every expert's shard).
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from _spawn import run_ranks
from torch import nn

from zerolaunch.zero import Engine, EngineOptions
from zerolaunch.zero.options import OptimizerOptions, ZeroOptions

D, EXPERTS, ROWS = 13, 4, 4
ROUTES = [  # [step][rank] -> the expert of each of the rank's rows
    [[0, 1, 2, 3], [0, 0, 1, 1]],
    [[0, 1, 2, 2], [1, 1, 0, 0]],
    [[3, 3, 3, 3], [0, 1, 2, 0]],
]


class MoEBlock(nn.Module):
    def __init__(self):
        super().__init__()
        self.router = nn.Linear(D, EXPERTS)
        self.experts = nn.ModuleList(nn.Linear(D, D) for _ in range(EXPERTS))

    def forward(self, x, route):  # x (N, D), route (N,)
        probs = self.router(x).softmax(-1)  # (N, E): trained through the chosen expert's weight
        y = torch.zeros_like(x)
        for e, expert in enumerate(self.experts):
            rows = (route == e).nonzero().squeeze(1)
            if rows.numel() == 0:
                continue  # as MoE layers do: an expert without tokens does not run
            y = y.index_add(0, rows, probs[rows, e : e + 1] * expert(x[rows]))
        return x + y


class Net(nn.Module):
    def __init__(self, seed: int):
        super().__init__()
        torch.manual_seed(seed)
        self.blocks = nn.ModuleList(MoEBlock() for _ in range(2))
        self.head = nn.Linear(D, 3)

    def forward(self, x, route):
        for block in self.blocks:
            x = block(x, route)
        return self.head(x)


def _batch(step: int, rank: int):
    g = torch.Generator().manual_seed(1000 + 10 * step + rank)
    return (
        torch.randn(ROWS, D, generator=g),
        torch.tensor(ROUTES[step][rank]),
        torch.randn(ROWS, 3, generator=g),
    )


# weight decay off: which params decay (1-D ones or not) is the param groups' business, tested elsewhere
def _options(stage: int) -> EngineOptions:
    zero = ZeroOptions(stage=stage, reduce_bucket_size=200)
    if stage == 3:
        zero = ZeroOptions(stage=3, stage3_param_persistence_threshold=0, stage3_units=("MoEBlock",))
    return EngineOptions(zero=zero, optimizer=OptimizerOptions(name="adamw", lr=1e-2, weight_decay=0.0))


def _train(rank, world_size):
    out = {}
    for stage in (2, 3):
        model = Net(seed=0)
        engine = Engine(model, _options(stage))
        for step in range(len(ROUTES)):
            x, route, y = _batch(step, rank)
            engine.backward(F.mse_loss(engine(x, route), y))
            engine.step()
        out[stage] = {n: t.detach().clone() for n, t in engine.iter_full_state()}
    return out


def _reference():
    model = Net(seed=0)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.0)
    for p in model.parameters():
        p.grad = torch.zeros_like(p)  # no gradient = a zero gradient, also for the optimizer's step
    for step in range(len(ROUTES)):
        opt.zero_grad(set_to_none=False)
        # the global batch: the mean of the ranks' mean losses (equal row counts)
        losses = []
        for rank in range(2):
            x, route, y = _batch(step, rank)
            losses.append(F.mse_loss(model(x, route), y))
        (sum(losses) / 2).backward()
        opt.step()
    return {n: p.detach().clone() for n, p in model.named_parameters()}


@pytest.mark.dist
def test_experts_without_tokens_on_one_rank_or_all_train_like_one_process():
    ranks = run_ranks(
        _train, 2, timeout_s=120
    )  # a rank that skipped a reduce would hang: the timeout says so
    want = _reference()
    start = dict(Net(seed=0).named_parameters())
    # step 1 and 2's idle expert still moved (Adam's momentum on a zero gradient), as in the reference
    assert not torch.equal(want["blocks.0.experts.3.weight"], start["blocks.0.experts.3.weight"])
    for stage in (2, 3):
        for got in ranks:
            assert set(got[stage]) == set(want)
            for name, w in want.items():
                torch.testing.assert_close(
                    got[stage][name], w, rtol=1e-5, atol=1e-6, msg=f"stage {stage} {name}"
                )
