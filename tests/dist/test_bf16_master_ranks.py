"""[Note: bf16 master] on 2 gloo ranks: pure bf16 (bf16 master and optimizer state) at stages 1, 2 and 3, the
torch step and the fused step, one and two micro-steps per window.

The reference is written here with plain torch, not taken from zerolaunch: each rank's bf16 model replica
computes its rows' bf16 grads (the loss divided by the micro-steps, as the engine scales it), the grads of all
ranks and micro-steps are averaged in fp32, rounded once to bf16, and torch's fused AdamW steps the bf16
params. The engine reduces the same grads in fp32 and rounds them once as its step reads them, so with torch's
step the weights must be equal bit for bit (the mean of a few bf16 values is exact in fp32, whatever the order);
the fused step does the same arithmetic in another order, compared within one bf16 rounding. Leaves out:
clipping (plain torch clips in bf16: tests/unit/test_bf16_master.py compares within rounding) and CUDA.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from _spawn import run_ranks
from _zero_models import Net, micro_batch, rank_rows

from zerolaunch.zero import Engine
from zerolaunch.zero.options import EngineOptions, OptimizerOptions, PrecisionOptions, ZeroOptions

STEPS = 4
LR, WD = 1e-2, 0.1
CASES = [(1, False, 1), (2, False, 1), (2, False, 2), (3, False, 1), (2, True, 1), (3, True, 2)]
"""(stage, fused step, micro-steps per window)."""


def _options(stage: int, fused: bool, gas: int) -> EngineOptions:
    return EngineOptions(
        zero=ZeroOptions(stage=stage, reduce_bucket_size=100, overlap_comm=True),
        precision=PrecisionOptions(dtype="bf16", master_dtype="bf16"),
        optimizer=OptimizerOptions(name="adamw", lr=LR, weight_decay=WD, decay_1d=True, fused_step=fused),
        gradient_accumulation_steps=gas,
    )


def _engine_weights(rank: int, world_size: int, cases) -> list[dict]:
    out = []
    for stage, fused, gas in cases:
        engine = Engine(Net(0), _options(stage, fused, gas))
        for step in range(STEPS):
            for micro in range(gas):
                x, y = micro_batch(step, micro, world_size)
                out_ = engine(rank_rows(x, rank).bfloat16()).float()
                engine.backward(F.mse_loss(out_, rank_rows(y, rank)))
                engine.step()
        out.append({n: t.clone() for n, t in engine.iter_full_state()})
    return out


def _reference(world_size: int, gas: int) -> dict:
    model = Net(0).to(torch.bfloat16)
    opt = torch.optim.AdamW(model.parameters(), lr=LR, weight_decay=WD, fused=True)
    params = [p for p in model.parameters() if p.requires_grad]
    for step in range(STEPS):
        total = [torch.zeros(p.shape) for p in params]
        for micro in range(gas):
            x, y = micro_batch(step, micro, world_size)
            for rank in range(world_size):
                model.zero_grad()
                loss = F.mse_loss(model(rank_rows(x, rank).bfloat16()).float(), rank_rows(y, rank))
                (loss / gas).backward()
                for t, p in zip(total, params, strict=True):
                    t += p.grad.float()
        for t, p in zip(total, params, strict=True):
            p.grad = (t / world_size).to(torch.bfloat16)
        opt.step()
    return {n: p.detach() for n, p in model.named_parameters()}


@pytest.mark.dist
def test_two_ranks_give_the_reference_weights():
    world_size = 2
    results = run_ranks(_engine_weights, world_size, CASES, timeout_s=240)
    for r in range(1, world_size):
        for a, b in zip(results[0], results[r], strict=True):
            assert all(torch.equal(a[n], b[n]) for n in a)  # every rank holds the same model
    for (stage, fused, gas), got in zip(CASES, results[0], strict=True):
        want = _reference(world_size, gas)
        rtol, atol = (2**-7, LR * 2**-5) if fused else (0, 0)
        for name, w in want.items():
            assert got[name].dtype == torch.bfloat16
            torch.testing.assert_close(
                got[name], w, rtol=rtol, atol=atol, msg=lambda m, c=(stage, fused, gas), n=name: f"{c} {n}: {m}"
            )
