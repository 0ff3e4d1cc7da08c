"""bench/run.py's diagnostic GPT rows on the CPU at the tiny size, world size 1, so a device call cannot end on
a row that does not build.

Covers: `torch-compile-fwdbwd` runs forward and backward and never changes a weight (the floor row: no clip, no
optimizer step); `zl-...-fused` holds its grads in bf16 ([Note: compute-dtype grads]) and `-fp32grads` the
same engine with fp32 grad shards; `-purebf16` keeps a bf16 master ([Note: bf16 master]); all step. torch.compile is replaced by the identity (an inductor build
on the CPU takes minutes; what is compiled is not what these rows check). Leaves out: CUDA timing.
"""

from __future__ import annotations

import pytest
import torch


def _batches(bench, n=2):
    return bench._batches(50304, 16, 2, n, torch.device("cpu"))


def test_the_floor_row_steps_no_weight(bench, group, torchrun_env, monkeypatch):
    monkeypatch.setattr(torch, "compile", lambda fn, **_: fn)
    step, _, parts = bench.build_step("torch-compile-fwdbwd", "tiny", 16, device="cpu")
    before = {n: p.detach().clone() for n, p in parts["module"].named_parameters()}
    seen = []
    for p in parts["module"].parameters():
        p.register_post_accumulate_grad_hook(lambda q: seen.append(q.grad is not None))
    for b in _batches(bench):
        assert torch.isfinite(step(b)).item()
    assert seen and all(seen)  # backward ran
    for n, p in parts["module"].named_parameters():
        assert torch.equal(p.detach(), before[n]), n
        assert p.grad is None


@pytest.mark.parametrize(
    "engine, grad_dtype",
    [
        ("zl-z2-fused", torch.bfloat16),
        ("zl-z2-fused-fp32grads", torch.float32),
        ("zl-z2", torch.float32),
        ("zl-z2-purebf16", torch.bfloat16),
        ("zl-z3-purebf16", torch.bfloat16),
    ],
)
def test_fused_rows_hold_the_grads_they_name(bench, group, torchrun_env, monkeypatch, engine, grad_dtype):
    step, _, parts = bench.build_step(engine, "tiny", 16, device="cpu")
    eng = parts["engine"]
    assert eng.shards.fused_step is ("fused" in engine)
    assert eng.master_dtype == (torch.bfloat16 if engine.endswith("-purebf16") else torch.float32)
    assert {t.dtype for t in eng.sharding.grad_shards.window_tensors()} == {grad_dtype}
    before = {n: t.clone() for n, t in eng.iter_full_state(torch.float32)}
    for b in _batches(bench):
        assert torch.isfinite(step(b)).item()
    after = dict(eng.iter_full_state(torch.float32))
    assert any(not torch.equal(after[n], before[n]) for n in before)


@pytest.mark.parametrize("pure_bf16", [False, True])
def test_the_deepspeed_rows_config_means_the_same_to_zerolaunch(bench, group, torchrun_env, pure_bf16):
    # the ds-* rows hand DeepSpeed this config; zerolaunch.initialize reads DeepSpeed's vocabulary, so it must
    # accept it and build the same numerics (a key DeepSpeed would take and zerolaunch refuse fails here)
    import zerolaunch
    from zerolaunch.models.gpt import build

    config = bench._ds_config(2, False, 3e-4, pure_bf16=pure_bf16)
    engine = zerolaunch.initialize(build(size="tiny", vocab_size=256, seq_len=16), config=config)
    engine = engine[0] if isinstance(engine, tuple) else engine
    assert engine.options.zero.stage == 2 and engine.options.precision.dtype == "bf16"
    assert engine.engine.master_dtype == (torch.bfloat16 if pure_bf16 else torch.float32)
    assert config["optimizer"]["params"].get("fused") is (True if pure_bf16 else None)
