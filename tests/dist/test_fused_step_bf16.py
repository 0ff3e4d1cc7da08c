"""[Note: fused step] in bf16: the step writes each chunk's new master straight into the bf16 params (world size
1) or the bf16 all-gather input (2 ranks), so after every step the params must be exactly the master cast to
bf16 and the masters must be those of the unfused step (torch's fused AdamW + a copy) to fp32 rounding.
Stages 1 and 2, 2 ranks and one process. Leaves out: the compiled kernel (CUDA: test_zero12_cuda.py)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from _spawn import run_ranks
from _zero_models import Net, micro_batch, rank_rows

from zerolaunch.zero import Engine
from zerolaunch.zero.options import EngineOptions, OptimizerOptions, PrecisionOptions, ZeroOptions

STEPS = 6


def _opts(stage: int, fused: bool) -> EngineOptions:
    return EngineOptions(
        zero=ZeroOptions(stage=stage, reduce_bucket_size=100, overlap_comm=True),
        precision=PrecisionOptions(dtype="bf16"),
        optimizer=OptimizerOptions(lr=1e-2, weight_decay=0.1, betas=(0.9, 0.95), fused_step=fused),
        gradient_clipping=0.05,
    )


def _train(rank: int, world_size: int, stage: int, fused: bool) -> dict:
    engine = Engine(Net(0), _opts(stage, fused))
    cast_matches = []
    for step in range(STEPS):
        x, y = micro_batch(step, 0, world_size)
        loss = F.mse_loss(engine(rank_rows(x, rank).bfloat16()).float(), rank_rows(y, rank))
        engine.backward(loss)
        engine.step()
        master = dict(engine.full_state_dict(torch.float32))
        cast_matches.append(
            all(torch.equal(p, master[n].to(torch.bfloat16)) for n, p in engine.module.named_parameters())
        )
    return {"master": dict(engine.full_state_dict(torch.float32)), "cast_matches": cast_matches}


def _both(rank, world_size, stage):
    return {fused: _train(rank, world_size, stage, fused) for fused in (False, True)}


def _check(results):
    for res in results:
        assert all(res[True]["cast_matches"]), res[True]["cast_matches"]
        assert all(res[False]["cast_matches"])  # the unfused path's copy: the same contract
        for name, w in res[False]["master"].items():
            torch.testing.assert_close(res[True]["master"][name], w, rtol=1e-6, atol=1e-7, msg=name)


@pytest.mark.parametrize("stage", [1, 2])
def test_two_ranks(stage):
    _check(run_ranks(_both, 2, stage))


@pytest.mark.parametrize("stage", [1, 2])
def test_one_process(stage):
    _check([_both(0, 1, stage)])
