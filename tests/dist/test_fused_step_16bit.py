"""[Note: fused step] in 16-bit: the step writes each chunk's new master straight into the 16-bit params (world
size 1) or the 16-bit all-gather input (2 ranks), so after every step the params must be exactly the master
cast to that dtype and the masters must be those of the unfused step (torch's fused AdamW + a copy) to fp32
rounding. bf16, and fp16 with its loss scale (the step's gradient multiplier unscales) and one overflowing
step that both paths must skip. Stages 1 and 2, 2 ranks and one process. Leaves out: the compiled kernel
(CUDA: test_zero12_cuda.py)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from _spawn import run_ranks
from _zero_models import Net, micro_batch, rank_rows

from zerolaunch.zero import Engine
from zerolaunch.zero.options import EngineOptions, OptimizerOptions, PrecisionOptions, ZeroOptions

STEPS = 6
OVERFLOW_STEP = 2
"""fp16: this step's loss is multiplied by 1e8, so its scaled grads overflow fp16 and the step is skipped."""
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}


def _opts(stage: int, fused: bool, dtype: str) -> EngineOptions:
    return EngineOptions(
        zero=ZeroOptions(stage=stage, reduce_bucket_size=100, overlap_comm=True),
        # fp16: a loss scale of 2^4, so only the overflow step overflows (2^16 does for the first steps here)
        precision=PrecisionOptions(dtype=dtype, initial_scale_power=4),
        optimizer=OptimizerOptions(lr=1e-2, weight_decay=0.1, betas=(0.9, 0.95), fused_step=fused),
        gradient_clipping=0.05,
    )


def _train(rank: int, world_size: int, stage: int, fused: bool, dtype: str) -> dict:
    engine = Engine(Net(0), _opts(stage, fused, dtype))
    half = DTYPES[dtype]
    cast_matches, skipped = [], []
    for step in range(STEPS):
        x, y = micro_batch(step, 0, world_size)
        loss = F.mse_loss(engine(rank_rows(x, rank).to(half)).float(), rank_rows(y, rank))
        if dtype == "fp16" and step == OVERFLOW_STEP:
            loss = loss * 1e8
        engine.backward(loss)
        skipped.append(engine.step().skipped)
        master = dict(engine.iter_full_state(torch.float32))
        cast_matches.append(all(torch.equal(p, master[n].to(half)) for n, p in engine.module.named_parameters()))
    return {
        "master": dict(engine.iter_full_state(torch.float32)),
        "cast_matches": cast_matches,
        "skipped": skipped,
    }


def _both(rank, world_size, stage, dtype):
    return {fused: _train(rank, world_size, stage, fused, dtype) for fused in (False, True)}


def _check(results, dtype):
    overflow = [dtype == "fp16" and step == OVERFLOW_STEP for step in range(STEPS)]
    for res in results:
        assert all(res[True]["cast_matches"]), res[True]["cast_matches"]
        assert all(res[False]["cast_matches"])  # the unfused path's copy: the same contract
        assert res[True]["skipped"] == res[False]["skipped"] == overflow
        for name, w in res[False]["master"].items():
            torch.testing.assert_close(res[True]["master"][name], w, rtol=1e-6, atol=1e-7, msg=name)


@pytest.mark.parametrize("dtype", list(DTYPES))
@pytest.mark.parametrize("stage", [1, 2])
def test_two_ranks(stage, dtype):
    _check(run_ranks(_both, 2, stage, dtype), dtype)


@pytest.mark.parametrize("dtype", list(DTYPES))
@pytest.mark.parametrize("stage", [1, 2])
def test_one_process(stage, dtype):
    _check([_both(0, 1, stage, dtype)], dtype)
