"""What a world-size-1 step moves: stage 3's gathered params are views of the unit's shard (no all-gather, no
copy; stage3/unit_buffers.py [Note: world size 1 aliases]), and the step reads at most one value back to the
host. One process, CPU; the parity reference is plain torch (tests/dist/_reference.py).
Leaves out: CUDA streams (tests/dist/*cuda*)."""

from __future__ import annotations

import collections
import os
import sys
from dataclasses import replace

import pytest
import torch
import torch.nn.functional as F
from torch.profiler import ProfilerActivity, profile
from torch.utils._python_dispatch import TorchDispatchMode

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(__file__)), "dist"))

from _zero_models import Net, micro_batch, reference_weights  # noqa: E402

from zerolaunch.zero import Engine  # noqa: E402
from zerolaunch.zero.optim import fused_step, shard_optimizer  # noqa: E402
from zerolaunch.zero.options import (  # noqa: E402
    EngineOptions,
    OffloadOptions,
    OptimizerOptions,
    PrecisionOptions,
    ZeroOptions,
)


class CountOps(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.calls = collections.Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.calls[func.overloadpacket] += 1
        return func(*args, **(kwargs or {}))


def make_options(
    stage: int, dtype: str = "fp32", master: str = "fp32", offload_param: str = "none", fused=False
):
    return EngineOptions(
        zero=ZeroOptions(
            stage=stage,
            stage3_param_persistence_threshold=0,
            offload_param=OffloadOptions(device=offload_param),
        ),
        precision=PrecisionOptions(dtype=dtype, master_dtype=master),
        optimizer=OptimizerOptions(name="adamw", lr=1e-2, fused_step=fused),
    )


def train_step(engine, step: int):
    x, y = micro_batch(step, 0, 1)
    engine.backward(F.mse_loss(engine(x.to(engine.dtype)), y.to(engine.dtype)))
    return engine.step()


def counted_step(engine, step: int) -> collections.Counter:
    with CountOps() as mode:
        train_step(engine, step)
    return mode.calls


def storage_span(t: torch.Tensor) -> tuple[int, int]:
    s = t.untyped_storage()
    return s.data_ptr(), s.data_ptr() + s.nbytes()


@pytest.mark.parametrize("dtype, master", [("fp32", "fp32"), ("bf16", "bf16")], ids=["fp32", "pure-bf16"])
def test_gathered_params_are_views_of_their_source(dtype, master):
    engine = Engine(Net(), make_options(3, dtype, master))
    flats = [f for f in engine.sharding.flats if f is not None]
    model = engine.module
    seen = {}

    def inside(module, args, out):
        flat = engine.sharding.flats[engine.sharding._flat_of["l1.weight"]]
        seen["gathered"] = flat.gathered
        seen["full_bytes"] = flat.full_bytes_alive
        # the trainable weight lies inside its group's master, the frozen one inside the unit's shard
        lo, hi = storage_span(engine.sharding.shards.master[0])
        seen["in_master"] = lo <= module.weight.data_ptr() < hi
        frozen_flat = engine.sharding.flats[engine.sharding._flat_of["frozen.weight"]]
        lo, hi = storage_span(frozen_flat.shard)
        seen["frozen_in_shard"] = lo <= model.frozen.weight.data_ptr() < hi

    handle = model.l1.register_forward_hook(inside)
    train_step(engine, 0)
    handle.remove()
    assert seen == {"gathered": True, "full_bytes": 0, "in_master": True, "frozen_in_shard": True}
    assert all(f.aliases_source and f.full_bytes_alive == 0 for f in flats)
    # never freed ([Note: hook-free forward]): after the step the param still views the (stepped) master
    assert engine.forward_hooks_free
    lo, hi = storage_span(engine.sharding.shards.master[0])
    assert lo <= model.l1.weight.data_ptr() < hi and float(model.l1.weight.detach().abs().sum()) > 0


def test_a_cast_or_an_offloaded_shard_is_still_gathered():
    # an fp32 master under a bf16 model needs its cast; on CUDA an offloaded shard is a host->device copy
    engine = Engine(Net(), make_options(3, "bf16", "fp32"))
    assert not any(f.aliases_source for f in engine.sharding.flats if f is not None)
    assert not engine.forward_hooks_free  # its forward hooks gather each unit
    train_step(engine, 0)


@pytest.mark.parametrize("dtype, master", [("fp32", "fp32"), ("bf16", "bf16")], ids=["fp32", "pure-bf16"])
def test_stage3_copies_no_more_than_stage2(dtype, master):
    # at world size 1 stage 3's gathers move nothing: its step copies what stage 2's does (grads into their
    # shards, the step's own), not one per gathered unit more.
    copies = {}
    for stage in (2, 3):
        engine = Engine(Net(), make_options(stage, dtype, master))
        train_step(engine, 0)
        calls = counted_step(engine, 1)
        copies[stage] = calls[torch.ops.aten.copy_]
    assert copies[3] <= copies[2], copies


@pytest.mark.parametrize("offload_param", ["none", "cpu"])
def test_stage3_world1_matches_adamw(offload_param):
    options = make_options(3, offload_param=offload_param)
    engine = Engine(Net(0), options)
    for step in range(3):
        train_step(engine, step)
    want, _ = reference_weights(options, 1, 3)
    got = dict(engine.sharding.full_params())
    for name, value in want.items():
        torch.testing.assert_close(got[name].float(), value, atol=2e-6, rtol=1e-5, msg=name)


@pytest.mark.parametrize("stage", [2, 3])
def test_a_step_reads_at_most_one_value_back(stage, monkeypatch):
    # the fused step compiled as on CUDA (dynamo only, no inductor: the host reads are dynamo's graph inputs)
    kernel = fused_step._compiled(backend=lambda gm, inputs: gm.forward)
    monkeypatch.setattr(shard_optimizer, "adam_chunk_for", lambda device: kernel)
    engine = Engine(Net(), make_options(stage, "bf16", "bf16", fused=True))
    train_step(engine, 0)
    # the profiler, not a dispatch mode: under a mode dynamo runs the kernel's code unconverted
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        train_step(engine, 1)
    reads = sum(e.name == "aten::_local_scalar_dense" for e in prof.events())
    assert reads <= 1, reads


def test_the_fused_step_patches_dynamo_config_once_a_step(monkeypatch):
    # the chunks launch after the norm's host sync, so host work per chunk is step time on the GPU: the
    # specialize_float patch (about half a compiled call's host time) is entered once a step, not per chunk
    kernel = fused_step._compiled(backend=lambda gm, inputs: gm.forward)
    monkeypatch.setattr(shard_optimizer, "adam_chunk_for", lambda device: kernel)
    options = make_options(2, "bf16", "bf16", fused=True)
    options = replace(options, zero=replace(options.zero, reduce_bucket_size=200))
    engine = Engine(Net(), options)
    assert len(engine.shards.chunks) >= 3
    train_step(engine, 0)
    config_type = type(torch._dynamo.config)
    writes = []
    original = config_type.__setattr__

    def counting(self, name, value):
        if name == "specialize_float":
            writes.append(value)
        original(self, name, value)

    monkeypatch.setattr(config_type, "__setattr__", counting)
    train_step(engine, 1)
    assert writes == [True, False], writes  # entered and left once
