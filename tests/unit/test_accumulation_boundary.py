"""Engine.step(boundary=...): the caller's accumulation boundary (the API's set_gradient_accumulation_boundary).

One process, no process group, stages 1-3 with and without CPU optimizer offload, clipping on: a window of 3
backwards closed by one step(boundary=True) (after two step(boundary=False)) gives the weights of plain torch
SGD on the sum of the three losses / gradient_accumulation_steps, clipped by its global norm, at accumulation
1 (where the offload path would otherwise take the norm per backward) and 2. DeepSpeed's side by side check is
tests/dist/test_ds_api_methods.py.
"""

from __future__ import annotations

import pytest
import torch

from zerolaunch.zero import Engine
from zerolaunch.zero.options import EngineOptions, OffloadOptions, OptimizerOptions, ZeroOptions

LR, CLIP = 0.1, 0.05


def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(5, 7), torch.nn.Tanh(), torch.nn.Linear(7, 3))


def _loss(model, i: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(i)
    x, y = torch.randn(4, 5, generator=gen), torch.randn(4, 3, generator=gen)
    return torch.nn.functional.mse_loss(model(x), y)


@pytest.mark.parametrize("gas", [1, 2])
@pytest.mark.parametrize("offload", ["none", "cpu"])
@pytest.mark.parametrize("stage", [1, 2, 3])
def test_a_caller_set_window_of_three_backwards_is_one_clipped_step(stage, offload, gas):
    options = EngineOptions(
        zero=ZeroOptions(
            stage=stage,
            offload_optimizer=OffloadOptions(device=offload),
            stage3_param_persistence_threshold=0,
        ),
        optimizer=OptimizerOptions(name="sgd", lr=LR, weight_decay=0.0),
        gradient_clipping=CLIP,
        gradient_accumulation_steps=gas,
    )
    model = _model()
    engine = Engine(model, options)
    for window in range(2):
        for i in range(3):
            engine.backward(_loss(engine, 10 * window + i))
            info = engine.step(boundary=i == 2)
            assert info.stepped == (i == 2)
    assert engine.global_steps == 2 and engine.micro_steps == 6

    ref = _model()
    for window in range(2):
        ref.zero_grad()
        (sum(_loss(ref, 10 * window + i) for i in range(3)) / gas).backward()
        torch.nn.utils.clip_grad_norm_(ref.parameters(), CLIP)
        with torch.no_grad():
            for p in ref.parameters():
                p -= LR * p.grad
    ours = dict(engine.iter_full_state())
    for name, expected in ref.state_dict().items():
        torch.testing.assert_close(ours[name], expected, rtol=1e-5, atol=1e-6, msg=name)


@pytest.mark.parametrize("offload", ["none", "cpu"])
@pytest.mark.parametrize("stage", [1, 2, 3])
def test_a_boundary_with_no_backward_steps_on_zero_grads(stage, offload):
    # DeepSpeed's set_gradient_accumulation_boundary lets a caller end a window that had no backward: "no
    # gradient" is zero. SGD without momentum or decay then leaves every weight where it was, whatever the
    # last window's grads were (host shards under offload keep them unless zeroed).
    torch.manual_seed(0)
    model = _model()
    options = EngineOptions(
        zero=ZeroOptions(stage=stage, offload_optimizer=OffloadOptions(device=offload)),
        optimizer=OptimizerOptions(name="sgd", lr=LR, momentum=0.0, weight_decay=0.0),
    )
    engine = Engine(model, options)
    engine.backward(_loss(engine, 0))
    assert engine.step().stepped
    before = {n: t.clone() for n, t in engine.iter_full_state(torch.float32)}
    info = engine.step(boundary=True)
    assert info.stepped and info.grad_norm == 0.0
    for name, t in engine.iter_full_state(torch.float32):
        torch.testing.assert_close(t, before[name], rtol=0, atol=0, msg=name)
