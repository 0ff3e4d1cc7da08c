"""DeepSpeed's `engine.compile()` on the engine zerolaunch.initialize returns (zerolaunch/api.py).

Tests: stages 2 and 3 on the tiny GPT, compiled with the aot_eager backend (no C++ toolchain needed), give the
losses of the same engine uncompiled to 1e-5 over 3 steps and say is_compiled; stage 2 and stage 3 at world
size 1 in fp32 (nothing to gather: no forward hooks) compile the whole forward, stage 3 with a bf16 model over
an fp32 master each unit (its gather hooks stay eager); a second call does nothing; the inductor
backend turns the fused optimizer step on (torch.compile stubbed: what is compiled is not the point there) and
an engine switched to it before its first step trains exactly as one built with it; DeepCompile's `schedule`
and `compiled_autograd_enabled=True` are refused, and a `backend` in compile_kwargs is overridden with a
warning, as DeepSpeed does. Leaves out: inductor's kernels and the speed (the GPU machine).
"""

from __future__ import annotations

import pytest
import torch

import zerolaunch
from zerolaunch.models.gpt import build
from zerolaunch.zero import Engine
from zerolaunch.zero.options import EngineOptions, OptimizerOptions, ZeroOptions


def _config(stage: int, **extra) -> dict:
    return {
        "train_micro_batch_size_per_gpu": 2,
        "zero_optimization": {"stage": stage, "stage3_param_persistence_threshold": 0},
        "optimizer": {"type": "AdamW", "params": {"lr": 1e-2, "weight_decay": 0.1}},
        "gradient_clipping": 1.0,
        **extra,
    }


def _engine(stage: int, **extra):
    torch.manual_seed(0)
    engine = zerolaunch.initialize(
        build(size="tiny", vocab_size=97, seq_len=16), config=_config(stage, **extra)
    )
    return engine[0] if isinstance(engine, tuple) else engine


def _losses(engine, steps=3):
    out = []
    for step in range(steps):
        ids = torch.randint(0, 97, (2, 16), generator=torch.Generator().manual_seed(step))
        loss = engine(input_ids=ids, labels=ids).loss
        engine.backward(loss)
        engine.step()
        out.append(loss.item())
    return out


# stage 3 at world size 1 in fp32 gathers nothing and hooks no forward: the whole forward compiles, as at
# stage 2; with a bf16 model over an fp32 master each unit's gather is a cast in a hook: the blocks compile.
@pytest.mark.parametrize(
    "stage, extra, compiled",
    [
        (2, {}, "the whole forward"),
        (3, {}, "the whole forward"),
        (3, {"bf16": {"enabled": True}}, "2 blocks"),
    ],
    ids=["stage2", "stage3-world1-fp32", "stage3-world1-bf16-fp32-master"],
)
def test_compiled_losses_equal_eager(stage, extra, compiled):
    want = _losses(_engine(stage, **extra))
    engine = _engine(stage, **extra)
    assert engine.engine.forward_hooks_free == (compiled == "the whole forward")
    assert not engine.is_compiled
    engine.compile(backend="aot_eager")
    assert engine.is_compiled and engine.compiled == compiled
    engine.compile(backend="aot_eager")  # a second call does nothing (DeepSpeed's)
    got = _losses(engine)
    assert got == pytest.approx(want, rel=1e-5, abs=1e-6)
    assert not engine.engine.options.optimizer.fused_step  # only the inductor backend fuses the step


def test_the_inductor_backend_fuses_the_optimizer_step(monkeypatch):
    monkeypatch.setattr(torch, "compile", lambda fn, **_: fn)
    engine = _engine(2)
    engine.compile()
    assert engine.engine.options.optimizer.fused_step and engine.engine.shards.fused_step


def test_switching_the_fused_step_on_before_the_first_step_is_building_with_it():
    def engine(fused_from_the_start: bool):
        torch.manual_seed(0)
        options = EngineOptions(
            zero=ZeroOptions(stage=2, reduce_bucket_size=300),
            optimizer=OptimizerOptions(lr=1e-2, weight_decay=0.1, fused_step=fused_from_the_start),
            gradient_clipping=1.0,
        )
        e = Engine(build(size="tiny", vocab_size=97, seq_len=16), options)
        if not fused_from_the_start:
            assert e.use_fused_step() and e.options.optimizer.fused_step
        return e

    a, b = engine(True), engine(False)
    assert _losses(a) == _losses(b)
    wa, wb = dict(a.iter_full_state()), dict(b.iter_full_state())
    assert all(torch.equal(wa[n], wb[n]) for n in wa)


def test_sgd_keeps_torchs_step():
    engine = Engine(
        build(size="tiny", vocab_size=97, seq_len=16), EngineOptions(optimizer=OptimizerOptions("sgd"))
    )
    assert not engine.use_fused_step() and not engine.shards.fused_step


def test_what_zerolaunch_does_not_have_is_refused():
    engine = _engine(2)
    with pytest.raises(ValueError, match="DeepCompile"):
        engine.compile(schedule=[(0, "pass")])
    with pytest.raises(ValueError, match="compiled_autograd_enabled"):
        engine.compile(compiled_autograd_enabled=True)
    assert not engine.is_compiled
    with pytest.warns(UserWarning, match="overridden"):
        engine.compile(backend="aot_eager", compile_kwargs={"backend": "inductor"})
    assert engine.is_compiled and not engine.engine.options.optimizer.fused_step
