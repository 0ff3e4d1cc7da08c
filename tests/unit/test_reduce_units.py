"""Reduce units own their reduce (zero/reduce.py `ReduceUnit`): the pipeline calls each unit's `issue` and
`write` and keeps its accumulation window on the unit, and both stages' units are real owners.

Tests: (1) `ReducePipeline` over two stand-in units: issue order, a unit's first write of a window
overwrites and later ones add, `reset_accumulation` makes every unit FRESH again, `discard` writes nothing;
(2) a stage-2 engine's `BackwardReducer` holds one `BucketUnit` per bucket and no staging outside them
(after a backward every unit has let go of its buffer); (3) a stage-3 engine's schedule holds one
`Stage3Unit` per unit, with the per-unit schedule state as fields (none held after a backward), a unit of frozen params only among them
(never issued), and every reduce-scatter of a backward issued by a unit with trainable params.
Leaves out: values (tests/dist parity tests) and CUDA streams (tests/dist/*cuda*).
"""

from __future__ import annotations

import os
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(__file__)), "dist"))

from _zero_models import Net, micro_batch  # noqa: E402

from zerolaunch.zero import Engine, comm  # noqa: E402
from zerolaunch.zero.flat.reducer import BucketUnit  # noqa: E402
from zerolaunch.zero.options import EngineOptions, OffloadOptions, ZeroOptions  # noqa: E402
from zerolaunch.zero.reduce import ReducePipeline, ReduceWork  # noqa: E402
from zerolaunch.zero.sharding import GradWindow  # noqa: E402
from zerolaunch.zero.stage3.unit import Stage3Unit  # noqa: E402


class StandInUnit:
    """A reduce unit whose 'reduce-scatter' is the identity on one rank, recording what it was asked."""

    def __init__(self, name: str, log: list):
        self.name = name
        self.window = GradWindow.FRESH
        self.shard = torch.zeros(2)
        self.log = log

    def issue(self) -> ReduceWork:
        staging = torch.full((2,), float(sum(entry[0] == "issue" for entry in self.log) + 1))
        out = torch.empty(2)
        self.log.append(("issue", self.name))
        return ReduceWork(self, out, comm.reduce_scatter(out, staging, None, async_op=True), staging)

    def write(self, out, *, accumulate, host_staging):
        self.log.append(("write", self.name, accumulate))
        if accumulate:
            self.shard += out
        else:
            self.shard.copy_(out)


def _pipeline(units):
    cpu = torch.device("cpu")
    return ReducePipeline(
        units,
        device=cpu,
        shard_device=cpu,
        host_staging_numel=2,
        track_grad_sq=True,
        write_on_reduce_stream=False,
    )


def test_the_pipeline_calls_the_units_and_keeps_their_window_on_them():
    log = []
    a, b = StandInUnit("a", log), StandInUnit("b", log)
    pipeline = _pipeline([a, b])
    pipeline.issue(a)
    pipeline.issue(b)
    assert pipeline.complete_oldest().unit is a and a.window is GradWindow.ACCUMULATING
    assert b.window is GradWindow.FRESH
    pipeline.drain()
    pipeline.issue(a)
    pipeline.drain()
    assert log == [
        ("issue", "a"),
        ("issue", "b"),
        ("write", "a", False),
        ("write", "b", False),
        ("issue", "a"),
        ("write", "a", True),
    ]
    assert torch.equal(a.shard, torch.full((2,), 1.0 + 3.0))  # overwritten by issue 1, issue 3 added
    assert float(pipeline.take_grad_sq()) == 2 * (1 + 4 + 9)
    pipeline.reset_accumulation()
    assert a.window is b.window is GradWindow.FRESH
    pipeline.issue(b)
    assert [w.unit for w in pipeline.discard()] == [b] and log[-1] == ("issue", "b")


def _engine(stage: int) -> Engine:
    # optimizer offload: one process still takes the reducing path (not the world-size-1 direct one)
    # stage 3: Net's input, frozen and head Linears are units of their own (the tied l1/l2 stay in the root)
    zero = ZeroOptions(
        stage=stage,
        offload_optimizer=OffloadOptions(device="cpu"),
        stage3_param_persistence_threshold=0,
        stage3_units=("inp", "frozen", "head"),
    )
    return Engine(Net(), EngineOptions(zero=zero))


def _backward(engine: Engine) -> None:
    x, y = micro_batch(0, 0, 1)
    engine.backward(F.mse_loss(engine(x), y))


def test_stage2_buckets_are_units_that_hold_their_own_staging():
    engine = _engine(2)
    reducer = engine.sharding.reducer
    assert [u.bucket for u in reducer.units] == list(reducer.layout.buckets)
    assert all(isinstance(u, BucketUnit) for u in reducer.units)
    assert reducer.pipeline.units == reducer.units
    _backward(engine)
    assert all(u.staging is None and u.window is GradWindow.ACCUMULATING for u in reducer.units)
    assert reducer.issued_count == len(reducer.units)
    engine.step()
    assert all(u.window is GradWindow.FRESH for u in reducer.units)


def test_stage3_units_own_their_schedule_state_and_a_frozen_only_unit_never_reduces():
    engine = _engine(3)
    schedule = engine.sharding.schedule
    units = [u for u in schedule.units if u is not None]
    assert all(isinstance(u, Stage3Unit) for u in units)
    assert [u.flat for u in units] == [f for f in schedule.flats if f is not None]
    frozen_only = [u for u in units if u.n_trainable == 0]
    assert frozen_only and all(u.has_frozen for u in frozen_only)
    issued = []
    original = Stage3Unit.issue

    def recording_issue(self):
        issued.append(self.index)
        return original(self)

    Stage3Unit.issue = recording_issue
    try:
        _backward(engine)
    finally:
        Stage3Unit.issue = original
    trainable = [u.index for u in units if u.n_trainable]
    assert sorted(issued) == sorted(trainable) and issued == schedule.issue_order.order
    assert not any(u.held or u.staging is not None for u in units)
    engine.step()
