"""The attributes of the engine zerolaunch.initialize returns (zerolaunch/api.py ZeroLaunchEngine).

Tests: the inner-engine state scripts read (global_steps, micro_steps, options) follows the engine through a
step; a name the wrapper does not define raises AttributeError instead of reaching the inner engine: the
message says it is not a supported DeepSpeed attribute, names the closest supported one, and for a member of
the inner engine says how to reach it there; hasattr / getattr with a default answer False / the default;
copy.copy still works. consolidated_state_dict on one process is the model's state dict (the 2-rank cases at
every stage: tests/dist/test_consolidated_state_dict.py).
"""

from __future__ import annotations

import copy

import pytest
import torch

import zerolaunch
from zerolaunch.zero import EngineOptions


def _engine():
    torch.manual_seed(0)
    return zerolaunch.initialize(torch.nn.Linear(4, 3), EngineOptions(), device="cpu")


def test_engine_state_follows_the_steps():
    engine = _engine()
    assert (engine.global_steps, engine.micro_steps) == (0, 0)
    assert engine.options is engine.engine.options
    engine.backward(engine(torch.ones(2, 4)).square().mean())
    engine.step()
    assert (engine.global_steps, engine.micro_steps) == (1, 1)


def test_unknown_names_are_refused_with_the_closest_supported_one():
    engine = _engine()
    with pytest.raises(
        AttributeError, match="not a DeepSpeed engine attribute zerolaunch supports"
    ) as caught:
        engine.global_step  # noqa: B018
    assert "did you mean 'global_steps'" in str(caught.value)
    with pytest.raises(AttributeError, match=r"engine\.engine\.sharding reaches it"):
        engine.sharding  # noqa: B018 (the inner engine's member, not forwarded)
    with pytest.raises(AttributeError, match="'iter_full_state'"):
        engine.iter_full_state()
    assert not hasattr(engine, "optimizer") and getattr(engine, "lr_scheduler", None) is None
    assert copy.copy(engine).engine is engine.engine


def test_consolidated_state_dict_on_one_process():
    engine = _engine()
    want = {k: v.clone() for k, v in engine.module.state_dict().items()}
    got = engine.consolidated_state_dict()
    assert list(got) == list(want) and all(torch.equal(got[k], want[k]) for k in want)
