"""A profile of a training step reads by phase: every phase the step runs shows as `zerolaunch::<phase>`
(zero/phases.py), as FSDP2's show as `FSDP::...`.

One process, CPU. With optimizer offload the world-size-1 engine takes the reducing path (not the direct
one), so stage 2 stages and reduce-scatters its buckets and stage 3 also gathers its units; their gathered
params view the shards themselves (nothing to wait for), while a bf16 model's units cast their fp32 master
and wait for it. The world-size-1 direct path shows its grads as `stage_grad` and nothing reduced. Leaves out: CUDA streams
(the names are the same code on both).
"""

from __future__ import annotations

import os
import sys

import pytest
import torch.nn.functional as F
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(__file__)), "dist"))

from _zero_models import Net, micro_batch  # noqa: E402

from zerolaunch.zero import Engine, phases  # noqa: E402
from zerolaunch.zero.options import (  # noqa: E402
    EngineOptions,
    OffloadOptions,
    OptimizerOptions,
    PrecisionOptions,
    ZeroOptions,
)


def _profiled_step_names(stage: int, offload: str, dtype: str) -> set[str]:
    options = EngineOptions(
        precision=PrecisionOptions(dtype=dtype),
        zero=ZeroOptions(
            stage=stage,
            offload_optimizer=OffloadOptions(device=offload),
            stage3_param_persistence_threshold=0,
        ),
        optimizer=OptimizerOptions(name="adamw", lr=1e-2),
    )
    engine = Engine(Net(), options)
    x, y = micro_batch(0, 0, 1)
    x, y = x.to(engine.dtype), y.to(engine.dtype)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        engine.backward(F.mse_loss(engine(x), y))
        engine.step()
    return {event.name for event in prof.events()}


ENGINE = {phases.FORWARD, phases.BACKWARD, phases.FINISH_WINDOW, phases.NORM, phases.STEP}
REDUCING = ENGINE | {phases.STAGE_GRAD, phases.REDUCE_ISSUE, phases.REDUCE_WRITE}


@pytest.mark.parametrize(
    "stage, offload, dtype, expected, absent",
    [
        (2, "cpu", "fp32", REDUCING | {phases.PUBLISH}, {phases.GATHER}),
        # world size 1, every unit aliasing its shard: no forward hook gathers ([Note: hook-free forward])
        (3, "cpu", "fp32", REDUCING | {phases.PUBLISH}, {phases.GATHER, phases.GATHER_WAIT}),
        (3, "none", "bf16", ENGINE | {phases.GATHER, phases.GATHER_WAIT}, {phases.REDUCE_ISSUE}),
        (2, "none", "fp32", ENGINE | {phases.STAGE_GRAD}, {phases.REDUCE_ISSUE, phases.REDUCE_WRITE}),
    ],
    ids=["stage2-offload", "stage3-offload", "stage3-bf16-from-master", "stage2-world1-direct"],
)
def test_each_phase_of_a_step_shows_by_name_in_a_cpu_profile(stage, offload, dtype, expected, absent):
    names = _profiled_step_names(stage, offload, dtype)
    assert {phases.label(p) for p in expected} <= names, sorted(n for n in names if "zerolaunch" in n)
    assert not {phases.label(p) for p in absent} & names


def test_the_phase_names_are_distinct_and_prefixed():
    labels = [phases.label(p) for p in phases.ALL]
    assert len(set(labels)) == len(labels)
    assert all(label.startswith("zerolaunch::") for label in labels)


@pytest.mark.parametrize("stage", [2, 3])
def test_no_record_function_is_entered_outside_a_profiler(stage, monkeypatch):
    """A record_function is a dispatcher op pair per phase (per param for stage_grad): without a profiler the
    host thread that feeds the GPU must not pay it."""
    import torch

    entered = []
    real = torch.profiler.record_function

    def counting(name, *args, **kwargs):
        entered.append(name)
        return real(name, *args, **kwargs)

    monkeypatch.setattr(torch.profiler, "record_function", counting)
    options = EngineOptions(
        zero=ZeroOptions(
            stage=stage,
            offload_optimizer=OffloadOptions(device="cpu"),
            stage3_param_persistence_threshold=0,
        ),
        optimizer=OptimizerOptions(name="adamw", lr=1e-2),
    )
    engine = Engine(Net(), options)
    x, y = micro_batch(0, 0, 1)
    engine.backward(F.mse_loss(engine(x), y))
    engine.step()
    assert not [n for n in entered if n.startswith("zerolaunch::")]
