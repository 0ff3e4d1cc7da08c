"""The engine's public seams for other doors (the HF Trainer's): `Engine.set_schedule` and `Engine.gathered()`.

set_schedule: the next steps run at the installed schedule's lrs (a schedule of lr 0 leaves every param as
it was, one of lr > 0 moves them), StepInfo reports its lr, and the checkpoint meta records
its state. gathered(): at stage 3, forwards of `engine.module` called directly inside it (several, as
generate makes) give what the engine's own forward gives, and every sharded unit is released after it; at
stages 0-2 it changes nothing. One process, CPU, no process group. Leaves out: world size > 1 (the HF tests'
generate with ranks stopping apart, tests/hf/test_hf_trainer_deepspeed.py).
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from zerolaunch.zero import Engine
from zerolaunch.zero.options import EngineOptions, ZeroOptions


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(17, 17)

    def forward(self, x):
        return x + torch.tanh(self.fc(x))


class Stack(nn.Module):
    """Three repeated blocks (stage 3's units) between an input and a head (the root unit's params)."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.inp = nn.Linear(31, 17)
        self.blocks = nn.ModuleList(Block() for _ in range(3))
        self.head = nn.Linear(17, 5)

    def forward(self, x):
        h = self.inp(x)
        for block in self.blocks:
            h = block(h)
        return self.head(h)


def _engine(stage: int) -> Engine:
    # threshold 0: every param is sharded in its unit at stage 3, none kept resident
    zero = ZeroOptions(stage=stage, stage3_param_persistence_threshold=0)
    return Engine(Stack(), EngineOptions(zero=zero))


def _batch(seed: int):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(4, 31, generator=g), torch.randn(4, 5, generator=g)


def _train_step(engine: Engine, seed: int):
    x, y = _batch(seed)
    engine.backward(F.mse_loss(engine(x), y))
    return engine.step()


def _weights(engine: Engine) -> dict[str, torch.Tensor]:
    return {name: t.clone() for name, t in engine.iter_full_state(torch.float32)}


class Scaled:
    """A schedule of its own: each group's lr times `factor ** step`."""

    def __init__(self, factor: float):
        self.factor = factor
        self.loaded = None

    def lrs_at(self, step, group_lrs):
        return [0.01 * self.factor**step for _ in group_lrs]

    def state_dict(self):
        return {"name": "scaled", "factor": self.factor}

    def load_state_dict(self, state):
        self.loaded = state


@pytest.mark.parametrize("stage", [2, 3])
def test_set_schedule_runs_the_next_steps_at_its_lrs(stage):
    engine = _engine(stage)
    _train_step(engine, 0)  # a step at the options' schedule first: the new one takes over mid-run
    engine.set_schedule(Scaled(0.5))
    assert engine.lrs_at(engine.global_steps) == [0.01 * 0.5] * engine.num_groups
    info = _train_step(engine, 1)
    assert info.lr == pytest.approx(0.01 * 0.5)
    info = _train_step(engine, 2)
    assert info.lr == pytest.approx(0.01 * 0.25)
    assert engine.state_meta()["scheduler"] == {"name": "scaled", "factor": 0.5}


@pytest.mark.parametrize("stage", [2, 3])
def test_a_schedule_of_lr_zero_leaves_the_params(stage):
    engine = _engine(stage)
    engine.set_schedule(Scaled(0.0))  # lr 0.01 * 0**0 = 0.01 at step 0, then 0
    _train_step(engine, 0)
    before = _weights(engine)
    info = _train_step(engine, 1)
    assert info.stepped and info.lr == 0.0
    after = _weights(engine)
    assert all(torch.equal(before[n], after[n]) for n in before)
    # a schedule with an lr above 0 does move them from there: the comparison above can fail
    engine.set_schedule(Scaled(1.0))
    _train_step(engine, 2)
    moved = _weights(engine)
    assert any(not torch.equal(after[n], moved[n]) for n in after)


def _gathered_units(engine: Engine) -> list[int]:
    schedule = engine.sharding.schedule  # a test may read the strategy; the package may not
    return [
        k for k, flat in enumerate(schedule.flats) if flat is not None and flat.gathered and not flat.resident
    ]


def test_gathered_lets_direct_forwards_read_the_whole_model_at_stage_3(stage3_hooks):
    engine = _engine(3)
    _train_step(engine, 0)
    x, _ = _batch(5)
    with torch.no_grad():
        expected = engine(x)
        assert _gathered_units(engine) == []
        with engine.gathered():
            first = engine.module(x)  # called as generate calls it: not through engine(...)
            second = engine.module(x)
            assert _gathered_units(engine) != []  # the root, held for the whole context
        assert _gathered_units(engine) == []
    torch.testing.assert_close(first, expected, rtol=0, atol=0)
    torch.testing.assert_close(second, expected, rtol=0, atol=0)


def test_gathered_inside_the_engines_forward_changes_nothing(stage3_hooks):
    engine = _engine(3)
    x, _ = _batch(6)
    seen = []

    def probe(module, args, output):
        with engine.gathered():  # inside the engine's forward: nothing to begin, nothing to end
            seen.append(_gathered_units(engine))

    engine.module.head.register_forward_hook(probe)
    with torch.no_grad():
        expected = engine(x)
        assert _gathered_units(engine) == []
        with engine.gathered():
            got = engine.module(x)
    assert seen[0] == seen[1] and seen[0] != []
    torch.testing.assert_close(got, expected, rtol=0, atol=0)


def test_gathered_is_a_no_op_at_stages_0_to_2():
    engine = _engine(2)
    _train_step(engine, 0)
    x, _ = _batch(7)
    with torch.no_grad():
        expected = engine(x)
        with engine.gathered():
            got = engine.module(x)
    torch.testing.assert_close(got, expected, rtol=0, atol=0)
