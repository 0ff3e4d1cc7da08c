"""World size 1, one micro-step per window, 16-bit model, fused step: grads stay in the compute dtype.

Tests ([Note: compute-dtype grads] in zero/grad_shards.py): (1) the engine takes the mode exactly there
(plan.grads_in_compute_dtype: not for fp32, accumulation, the torch step or more than one rank); (2) values:
the weights and grad norms equal, bit for bit (atol=0), the same engine with fp32 grad shards (the mode forced
off), for stages 0-3, bf16 and fp16 (loss scaling, an overflowing step skipped), clipping active and a param
without a gradient in a step; (3) a caller-set boundary with several backwards per window sums them in fp32
(the segments promoted), again bit for bit, and the next window starts in the compute dtype; (4) memory: the
engine reports and holds 2 bytes of grads per element where it held 4; (5) GradShards' contract in the mode;
(6) estimate-memory counts the same grad bytes as the engine.
Leaves out: the compiled kernel reading 16-bit grads (CUDA: tests/dist/test_zero12_cuda.py) and the speed
(bench/run.py's -fused rows on the GPU).
"""

from __future__ import annotations

import os
import sys
from dataclasses import replace

import pytest
import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(__file__)), "dist"))

from _zero_models import Net, micro_batch  # noqa: E402

from zerolaunch.zero import Engine, plan  # noqa: E402
from zerolaunch.zero.grad_shards import GradShards  # noqa: E402
from zerolaunch.zero.options import (  # noqa: E402
    EngineOptions,
    OptimizerOptions,
    PrecisionOptions,
    ZeroOptions,
)
from zerolaunch.zero.plan import GradSegment  # noqa: E402

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}


def _options(stage, dtype="bf16", gas=1, fused=True, clip=0.05) -> EngineOptions:
    return EngineOptions(
        zero=ZeroOptions(stage=stage, reduce_bucket_size=100, overlap_comm=True),
        # fp16: a small initial scale, so that no step of these tiny grads overflows unasked
        precision=PrecisionOptions(dtype=dtype, initial_scale_power=4),
        optimizer=OptimizerOptions(name="adamw", lr=1e-2, weight_decay=0.1, fused_step=fused),
        gradient_clipping=clip,
        gradient_accumulation_steps=gas,
    )


def _window_dtypes(engine) -> set[torch.dtype]:
    return {t.dtype for t in engine.sharding.grad_shards.window_tensors()}


@pytest.mark.parametrize(
    "stage,dtype,gas,fused,expected",
    [
        (2, "bf16", 1, True, True),
        (0, "fp16", 1, True, True),
        (1, "bf16", 1, True, True),
        (3, "bf16", 1, True, True),
        (3, "fp16", 2, True, False),
        (2, "fp32", 1, True, False),  # fp32 grads are what the step reads anyway
        (2, "bf16", 2, True, False),  # micro-steps are summed in fp32
        (2, "bf16", 1, False, False),  # torch's fused AdamW wants grads in the master's dtype
    ],
)
def test_the_engine_keeps_compute_dtype_grads_exactly_where_asked(stage, dtype, gas, fused, expected):
    engine = Engine(Net(0), _options(stage, dtype, gas, fused))
    narrow = engine.sharding.grad_shards.compute_dtype
    assert (narrow is not None) is expected
    assert _window_dtypes(engine) == {DTYPES[dtype] if expected else torch.float32}


def test_more_than_one_rank_or_offload_keeps_fp32_grads():
    # the direct path is one rank without offload; a reduce-scatter sums in the comm dtype (fp32)
    assert plan.grads_in_compute_dtype(True, "bf16", 1, True)
    assert not plan.grads_in_compute_dtype(
        plan.accumulates_directly(2, 2, False, "bf16", "fp32", 1), "bf16", 1, True
    )
    assert not plan.grads_in_compute_dtype(
        plan.accumulates_directly(2, 1, True, "bf16", "fp32", 1), "bf16", 1, True
    )


def _train(options, *, narrow: bool, monkeypatch, steps=4, boundaries=None, skip_param_at=None):
    """Weights, grad norms, StepInfos and the engine after `steps` windows. boundaries: backwards per window
    (a caller-set boundary, engine.step(boundary=...)); None: the options' accumulation."""
    with monkeypatch.context() as m:
        if not narrow:
            m.setattr(plan, "grads_in_compute_dtype", lambda *a: False)
        engine = Engine(Net(0), options)
    assert (engine.sharding.grad_shards.compute_dtype is not None) is narrow
    infos = []
    for step in range(steps):
        n = 1 if boundaries is None else boundaries
        for micro in range(n):
            x, y = micro_batch(step, micro, 1)
            x = x.to(engine.dtype)
            out = engine(x)
            if skip_param_at == (step, micro):  # l1 / l2 (tied) and the frozen layer get no gradient
                out = engine.module.head(engine.module.norm(engine.module.inp(x)))
            engine.backward(F.mse_loss(out.float(), y))
            infos.append(engine.step(boundary=None if boundaries is None else micro == n - 1))
    weights = {n: p.detach().clone() for n, p in engine.module.named_parameters()}
    master = {n: t.clone() for n, t in engine.iter_full_state(torch.float32)}
    return weights, master, infos, engine


@pytest.mark.parametrize("stage", [0, 1, 2, 3])
@pytest.mark.parametrize("dtype", ["bf16", "fp16"])
def test_weights_are_the_fp32_grad_paths_bit_for_bit(stage, dtype, monkeypatch):
    options = _options(stage, dtype)
    want, want_master, want_infos, _ = _train(
        options, narrow=False, monkeypatch=monkeypatch, skip_param_at=(1, 0)
    )
    got, got_master, got_infos, eng = _train(
        options, narrow=True, monkeypatch=monkeypatch, skip_param_at=(1, 0)
    )
    assert [i.grad_norm for i in got_infos] == [i.grad_norm for i in want_infos]
    assert all(i.stepped for i in got_infos)
    assert max(i.grad_norm for i in got_infos) > options.gradient_clipping  # clipping did scale the grads
    for name, w in want.items():
        torch.testing.assert_close(got[name], w, rtol=0, atol=0, msg=name)
        torch.testing.assert_close(got_master[name], want_master[name], rtol=0, atol=0, msg=name)
    assert eng.sharding.grad_shards.held_bytes == 0  # released after the step, both dtypes


def test_an_fp16_overflow_is_skipped_as_with_fp32_grads(monkeypatch):
    # an initial scale of 2^18 overflows these fp16 grads: the first steps are skipped and the scale halves
    options = replace(_options(2, "fp16"), precision=PrecisionOptions(dtype="fp16", initial_scale_power=18))
    want, _, want_infos, _ = _train(options, narrow=False, monkeypatch=monkeypatch, steps=8)
    got, _, got_infos, _ = _train(options, narrow=True, monkeypatch=monkeypatch, steps=8)
    assert [(i.stepped, i.skipped, i.loss_scale) for i in got_infos] == [
        (i.stepped, i.skipped, i.loss_scale) for i in want_infos
    ]
    assert any(i.skipped for i in got_infos) and any(i.stepped for i in got_infos)
    for name, w in want.items():
        torch.testing.assert_close(got[name], w, rtol=0, atol=0, msg=name)


@pytest.mark.parametrize("stage", [0, 2, 3])
def test_several_backwards_per_window_sum_in_fp32(stage, monkeypatch):
    options = _options(stage, "bf16")
    want, want_master, want_infos, _ = _train(options, narrow=False, monkeypatch=monkeypatch, boundaries=3)
    got, got_master, got_infos, eng = _train(options, narrow=True, monkeypatch=monkeypatch, boundaries=3)
    assert [i.grad_norm for i in got_infos] == [i.grad_norm for i in want_infos]
    for name, w in want.items():
        torch.testing.assert_close(got[name], w, rtol=0, atol=0, msg=name)
        torch.testing.assert_close(got_master[name], want_master[name], rtol=0, atol=0, msg=name)
    # a later window of one backward holds its grads in bf16 again
    shards = eng.sharding.grad_shards
    x, y = micro_batch(9, 0, 1)
    eng.backward(F.mse_loss(eng(x.to(eng.dtype)).float(), y))
    assert _window_dtypes(eng) == {torch.bfloat16}
    eng.backward(F.mse_loss(eng(x.to(eng.dtype)).float(), y))  # the second backward promotes every segment
    assert _window_dtypes(eng) == {torch.float32}
    assert shards.held_bytes == 4 * sum(s.numel for s in shards.segments)  # the bf16 copies are freed
    eng.step()


@pytest.mark.parametrize("stage", [0, 2, 3])
def test_two_bytes_of_grads_per_element(stage):
    engine = Engine(Net(0), _options(stage))
    shards = engine.sharding.grad_shards
    padded = sum(s.numel for s in shards.segments)
    if stage < 3:
        assert padded == sum(b.numel() for b in engine.sharding.flat_params.buffers)
    assert engine.memory_bytes()["grads"] == 2 * padded
    assert shards.held_bytes == 0
    x, y = micro_batch(0, 0, 1)
    engine.backward(F.mse_loss(engine(x.to(engine.dtype)).float(), y))
    # what backward allocated is the bf16 shard alone: no fp32 segment is held
    assert shards.held_bytes == 2 * padded
    assert all(t.untyped_storage().nbytes() == 0 for t in shards.tensors)
    engine.step()
    assert shards.held_bytes == 0


def test_grad_shards_contract_in_the_compute_dtype():
    segs = [GradSegment(0, 0, 4, 0), GradSegment(0, 4, 6, 1)]
    shards = GradShards(
        [10], segs, torch.device("cpu"), pin=False, releasable=True, compute_dtype=torch.bfloat16
    )
    a, b = shards.slice(0, 0, 4), shards.slice(0, 5, 3)
    shards.release()
    assert shards.capacity_bytes == 2 * 10 and shards.held_bytes == 0
    shards.write(a, torch.full((4,), 1.5), accumulate=False)  # 1.5 is exact in bf16
    assert shards.held_bytes == 2 * 4 and shards.window_tensors()[0].dtype == torch.bfloat16
    third = torch.tensor(1 / 3)
    shards.write(a, third.expand(4), accumulate=True)  # summed in fp32, not rounded to bf16
    assert shards.window_tensors()[0].dtype == torch.float32 and shards.held_bytes == 4 * 4
    assert shards.window_view(0, 0, 4).eq(1.5 + third).all()
    shards.write(b, torch.ones(3), accumulate=False)
    shards.zero_unwritten()  # nothing to zero: both segments written
    assert shards.window_view(0, 5, 3).eq(1.0).all() and shards.window_tensors()[1].dtype == torch.bfloat16
    shards.release()
    assert shards.held_bytes == 0 and {t.dtype for t in shards.window_tensors()} == {torch.bfloat16}
    with pytest.raises(ValueError, match="releasable"):
        GradShards([10], segs, torch.device("cpu"), pin=False, releasable=False, compute_dtype=torch.bfloat16)


@pytest.mark.parametrize("stage", [0, 2, 3])
def test_estimate_memory_counts_the_engines_grad_bytes(stage):
    from zerolaunch.memory import STATE_KEYS, Setup, estimate
    from zerolaunch.memory.shape import from_module

    options = _options(stage)
    engine = Engine(Net(0), options)
    x, y = micro_batch(0, 0, 1)
    engine.backward(F.mse_loss(engine(x.to(engine.dtype)).float(), y))
    engine.step()
    got = engine.memory_bytes()
    row = estimate(from_module(Net(0), source="net"), Setup(engine=options)).row(stage, "none")
    assert {k: row.gpu[k] for k in STATE_KEYS} == {k: got[k] for k in STATE_KEYS}
    assert row.gpu["grads"] == 2 * sum(s.numel for s in engine.sharding.grad_shards.segments)
