"""A NaN or inf in ONE rank's gradient skips the step on EVERY rank for fp32 and bf16 (DeepSpeed 0.19.8's
bf16 rule: an all-reduced inf/nan flag, then an invalid global norm -> "OVERFLOW! Skipping step"), stages 1-3,
stages 0-3: the weights do not move on either rank, StepInfo says skipped with the non-finite norm, the step
counter does not advance, and the next finite step trains again. A NaN loss whose grads are finite (a
detached term) on one rank is skipped the same way.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from _spawn import run_ranks
from _zero_models import Net, micro_batch, rank_rows

from zerolaunch.zero import Engine
from zerolaunch.zero.options import EngineOptions, OptimizerOptions, PrecisionOptions, ZeroOptions


def _weights(engine) -> list[torch.Tensor]:
    return [t.detach().float().clone() for _, t in engine.iter_full_state()]


def _run(rank, world_size):
    out = {}
    for dtype in ("fp32", "bf16"):
        for stage in (0, 1, 2, 3):
            options = EngineOptions(
                zero=ZeroOptions(stage=stage, reduce_bucket_size=100),
                precision=PrecisionOptions(dtype=dtype),
                optimizer=OptimizerOptions(lr=1e-2, weight_decay=0.1),
            )
            engine = Engine(Net(0), options)
            rows = []
            for step in range(5):
                before = _weights(engine)
                x, y = micro_batch(step, 0, world_size)
                x = rank_rows(x, rank).to(torch.bfloat16 if dtype == "bf16" else torch.float32)
                loss = F.mse_loss(engine(x).float(), rank_rows(y, rank))
                if rank == 1 and step in (1, 2):
                    # step 1: NaN, step 2: inf, on rank 1 only
                    loss = loss * (float("nan") if step == 1 else float("inf"))
                if rank == 0 and step == 3:
                    loss = loss + loss.detach() * float("nan")  # NaN loss, finite grads
                engine.backward(loss)
                info = engine.step()
                after = _weights(engine)
                moved = any(not torch.equal(a, b) for a, b in zip(before, after, strict=True))
                finite = all(bool(torch.isfinite(t).all()) for t in after)
                rows.append((info.stepped, info.skipped, info.grad_norm, moved, finite))
            out[(dtype, stage)] = {"rows": rows, "steps": engine.global_steps}
            engine.close()
    return out


def test_nonfinite_grad_skips_on_every_rank():
    results = run_ranks(_run, 2)
    for rank, res in enumerate(results):
        for key, r in res.items():
            rows = r["rows"]
            assert [row[1] for row in rows] == [False, True, True, True, False], (rank, key, rows)
            assert [row[0] for row in rows] == [True, False, False, False, True], (rank, key, rows)
            assert [row[3] for row in rows] == [True, False, False, False, True], (rank, key, rows)
            assert all(row[4] for row in rows), (rank, key, rows)
            assert math.isfinite(rows[0][2]) and math.isfinite(rows[4][2])
            assert not any(math.isfinite(rows[i][2]) for i in (1, 2, 3))
            assert r["steps"] == 2
    # both ranks made the same decisions at every step
    for key in results[0]:
        assert [row[:2] for row in results[0][key]["rows"]] == [row[:2] for row in results[1][key]["rows"]]
