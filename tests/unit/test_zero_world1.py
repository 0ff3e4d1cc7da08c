"""World size 1: the stage 0-2 engine holds no gradient buffer beyond one fp32 grad per trainable element.

Tests ([Note: world size 1] in zero/flat/reducer.py): (1) memory: after a real backward + step, the engine's
own accounting (`memory_bytes()`) is params + fp32 master (none in fp32: the params are it, [Note: master is
params]) + fp32 grad shard + optimizer state, and,
independently, the bytes of every live tensor storage found by the garbage collector are that less the grad
shard, which is released between steps and back after the next backward ([Note: released grad shards] in
zero/grad_shards.py; before, stages 0/1 also held a compute-dtype full gradient buffer and stage 2 its
staging buckets); (2) values: the direct path gives the same weights, bit for bit (atol=0), as the reducing
path it replaces (forced here by patching `FlatSharding._accumulates_directly`), for stages 0-2, fp32 and
bf16, one and three micro-steps, a param without a gradient in a micro-step, clipping and fp16 loss scaling;
(3) where it is not exact (stage 1, bf16, accumulation), the reducing path is kept; (4) the layout
estimate-memory plans (memory/engine_layout.py, from names and shapes) equals the engine's, with and without
decay_1d.
Leaves out: more than one rank (tests/dist parity tests) and CUDA peaks (bench/run.py on the GPU).
"""

from __future__ import annotations

import os
import sys
from dataclasses import replace

import pytest
import torch
import torch.nn.functional as F
from _helpers import forget_compiled_models, hold_cpu_tensors, live_cpu_storage_bytes  # noqa: E402

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(__file__)), "dist"))

from _zero_models import Net, micro_batch  # noqa: E402

from zerolaunch.memory import engine_layout  # noqa: E402
from zerolaunch.zero import Engine  # noqa: E402
from zerolaunch.zero.flat.flat_sharding import FlatSharding  # noqa: E402
from zerolaunch.zero.flat.full_grads import FullGrads  # noqa: E402
from zerolaunch.zero.layout import ParamSpec  # noqa: E402
from zerolaunch.zero.options import (  # noqa: E402
    EngineOptions,
    OptimizerOptions,
    PrecisionOptions,
    ZeroOptions,
)
from zerolaunch.zero.param_groups import collect_params  # noqa: E402


def _options(stage, dtype="fp32", gas=1, bucket=500_000_000, clip=0.05) -> EngineOptions:
    return EngineOptions(
        zero=ZeroOptions(stage=stage, reduce_bucket_size=bucket, overlap_comm=True),
        precision=PrecisionOptions(dtype=dtype),
        optimizer=OptimizerOptions(name="adamw", lr=1e-2, weight_decay=0.1),
        gradient_clipping=clip,
        gradient_accumulation_steps=gas,
    )


class WideNet(torch.nn.Module):
    """Large enough (~400k elements) that a spare gradient buffer dwarfs the engine's small scalars."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.a = torch.nn.Linear(64, 3000)
        self.b = torch.nn.Linear(3000, 64)

    def forward(self, x):
        return self.b(torch.relu(self.a(x)))


@pytest.mark.parametrize("stage", [0, 1, 2])
@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
def test_one_fp32_grad_per_element_and_nothing_else(stage, dtype):
    x = torch.randn(8, 64)
    y = torch.randn(8, 64)
    forget_compiled_models()  # an earlier test's compiled model must not be freed mid-count
    held = hold_cpu_tensors()  # nothing alive now can vanish from the count
    before = live_cpu_storage_bytes()
    engine = Engine(WideNet(), _options(stage, dtype))
    # not held before the first backward
    assert sum(t.untyped_storage().nbytes() for t in engine.sharding.grad_shards.tensors) == 0
    loss = F.mse_loss(engine(x.to(engine.dtype)).float(), y)
    engine.backward(loss)
    engine.step()
    del loss
    padded = sum(b.numel() for b in engine.sharding.flat_params.buffers)
    elem = torch.empty((), dtype=engine.dtype).element_size()
    mem = engine.memory_bytes()
    assert mem["grads"] == 4 * padded, mem  # the fp32 grad shard alone
    assert mem["buckets"] == 0, mem
    # params, master, grad shard, AdamW moments; in fp32 the params are the master ([Note: master is params])
    master = 0 if dtype == "fp32" else 4 * padded
    assert mem["master"] == master, mem
    model_states = elem * padded + master + 4 * padded * (1 + 2)
    assert mem["params"] + mem["grads"] + mem["master"] + mem["optimizer"] == model_states, mem
    assert all(p.grad is None for p in engine.module.parameters())
    # between steps the grad shard's storage is released ([Note: released grad shards]): the live bytes are
    # the model states less the grad shard. Small tensors (lr, loss scale, counters) are allowed; a second
    # grad buffer (>= 2 * padded) or a grad shard kept alive is not.
    live = live_cpu_storage_bytes() - before
    assert abs(live - (model_states - 4 * padded)) < 64 * 1024, (live, model_states)
    # the next backward brings it back (its first gradient re-allocates it), and the values are still
    # exactly what a fresh shard would get (covered by the bit-identity test below over several steps)
    loss = F.mse_loss(engine(x.to(engine.dtype)).float(), y)
    engine.backward(loss)
    del loss
    live = live_cpu_storage_bytes() - before
    del held
    assert abs(live - model_states) < 64 * 1024, (live, model_states)
    assert sum(t.untyped_storage().nbytes() for t in engine.sharding.grad_shards.tensors) == 4 * padded


def _train(options: EngineOptions, *, direct: bool, monkeypatch, steps=4, skip_param_on_micro=None):
    with monkeypatch.context() as m:
        if not direct:
            m.setattr(FlatSharding, "_accumulates_directly", lambda self, o: False)
        engine = Engine(Net(0), options)
    gas = options.gradient_accumulation_steps
    norms = []
    for step in range(steps):
        for micro in range(gas):
            x, y = micro_batch(step, micro, 1)
            out = engine(x.to(engine.dtype))
            if skip_param_on_micro == (step, micro):
                out = engine.module.head(engine.module.norm(engine.module.inp(x.to(engine.dtype)))[:, :17])
            engine.backward(F.mse_loss(out.float(), y))
            info = engine.step()
        norms.append(info.grad_norm)
    return {n: p.detach().clone() for n, p in engine.module.named_parameters()}, norms, engine


CASES = [
    (0, "fp32", 1),
    (0, "fp32", 3),
    (1, "fp32", 3),
    (1, "bf16", 1),
    (2, "fp32", 3),
    (2, "bf16", 3),
    (2, "fp16", 2),
]


@pytest.mark.parametrize("stage,dtype,gas", CASES)
def test_direct_path_is_bit_identical_to_the_reducing_path(stage, dtype, gas, monkeypatch):
    options = _options(stage, dtype, gas, bucket=100)
    # step 1, micro-step 0: l1/l2 (tied) get no gradient, so their slice must be zeroed, not kept.
    skip = (1, 0)
    want, want_norms, ref = _train(options, direct=False, monkeypatch=monkeypatch, skip_param_on_micro=skip)
    got, got_norms, eng = _train(options, direct=True, monkeypatch=monkeypatch, skip_param_on_micro=skip)
    assert ref.sharding.reducer.full_grad_bytes + ref.sharding.reducer.staging_bytes > 0  # it reduced
    assert eng.sharding.reducer.full_grad_bytes == 0 and eng.sharding.reducer.staging_bytes == 0
    assert got_norms == want_norms
    for name, w in want.items():
        torch.testing.assert_close(got[name], w, rtol=0, atol=0, msg=name)


def test_stage1_bf16_accumulation_keeps_the_reducing_path():
    # bf16 stages 0/1 accumulate micro-steps in bf16; going straight to fp32 would change the values.
    engine = Engine(Net(0), _options(1, "bf16", gas=2))
    assert isinstance(engine.sharding.reducer, FullGrads) and engine.sharding.reducer.full_grad_bytes > 0


@pytest.mark.parametrize("decay_1d", [False, True])
@pytest.mark.parametrize("stage", [0, 2])
def test_estimate_layout_is_the_engines_layout(stage, decay_1d):
    """memory/engine_layout.py plans from names and shapes alone; the engine from its tensors and groups."""
    options = _options(stage, bucket=150)
    options = replace(options, optimizer=replace(options.optimizer, decay_1d=decay_1d))
    engine = Engine(Net(0), options)
    specs = [ParamSpec(n, tuple(p.shape)) for n, p in collect_params(engine.module) if p.requires_grad]
    assert (
        engine_layout.stage012_layout(specs, stage, 1, options.zero.bucket_numel, decay_1d=decay_1d)
        == engine.sharding.layout
    )
    assert engine.sharding.layout.num_groups == (1 if decay_1d else 2)
