"""Stage 3 without offload holds no compute-dtype shard: its params' bytes are the resident tensors alone.

[Note: gather from master] in zerolaunch/zero/stage3/unit_buffers.py. Tests (one process, bf16, AdamW):
after a real backward + step, `memory_bytes()["params"]` is the resident unit's full buffer (the persistent
params) and nothing of the units, 2 bytes per sharded element less than the old path (a compute-dtype shard
beside the master, forced by patching `unit_sharding.gathers_from_master`), which offload keeps; and,
independently, the bytes of every live tensor storage found by the garbage collector are the model states
(params + fp32 master + AdamW moments; the grad shards are released between steps) without any shard.
Leaves out: values (tests/dist/test_zero3_gather_from_master.py), the estimate (test_memory_engine.py) and
CUDA peaks (bench/run.py on the GPU).
"""

from __future__ import annotations

from unittest import mock

import pytest
import torch
import torch.nn.functional as F
from _helpers import forget_compiled_models, hold_cpu_tensors, live_cpu_storage_bytes  # noqa: E402

from zerolaunch.zero import Engine
from zerolaunch.zero.options import (
    EngineOptions,
    OffloadOptions,
    OptimizerOptions,
    PrecisionOptions,
    ZeroOptions,
)
from zerolaunch.zero.stage3 import unit_sharding


class Blocks(torch.nn.Module):
    """~0.9M elements in five units (the root and three blocks): a spare shard dwarfs the small scalars."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.inp = torch.nn.Linear(64, 512)
        self.blocks = torch.nn.ModuleList(torch.nn.Linear(512, 512) for _ in range(3))
        self.head = torch.nn.Linear(512, 64)

    def forward(self, x):
        h = self.inp(x)
        for block in self.blocks:
            h = torch.relu(block(h))
        return self.head(h)


def _options(offload: str = "none") -> EngineOptions:
    return EngineOptions(
        # biases (512, 64 elements) stay resident: the resident unit re-gathers after the step
        zero=ZeroOptions(
            stage=3, stage3_param_persistence_threshold=1000, offload_optimizer=OffloadOptions(device=offload)
        ),
        precision=PrecisionOptions(dtype="bf16"),
        optimizer=OptimizerOptions(name="adamw", lr=1e-2, weight_decay=0.1),
    )


def _stepped(options: EngineOptions) -> Engine:
    engine = Engine(Blocks(), options)
    x, y = torch.randn(8, 64), torch.randn(8, 64)
    engine.backward(F.mse_loss(engine(x.to(engine.dtype)).float(), y))
    engine.step()
    return engine


def _sharded_numel(engine) -> int:
    return sum(f.shard_numel for f in engine.sharding.flats if f is not None)


def test_no_compute_dtype_shard_without_offload():
    forget_compiled_models()  # an earlier test's compiled model must not be freed mid-count
    held = hold_cpu_tensors()  # nothing alive now can vanish from the count
    before = live_cpu_storage_bytes()
    engine = _stepped(_options())
    flats = [f for f in engine.sharding.flats if f is not None]
    assert engine.sharding.gathers_from_master and all(f.shard is None for f in flats)
    mem = engine.memory_bytes()
    resident = [f for f in flats if f.resident]
    assert len(resident) == 1 and len(flats) > 2
    # the persistent params' full buffer (bf16), nothing of the units (freed, no shard), no frozen params
    assert mem["params"] == 2 * resident[0].padded_numel, mem
    assert mem["grads"] == 4 * _sharded_numel(engine) and mem["buckets"] == 0, mem
    model_states = mem["params"] + mem["master"] + mem["optimizer"]
    assert mem["master"] == 4 * _sharded_numel(engine) and mem["optimizer"] == 2 * mem["master"], mem
    # the grad shards are released between steps ([Note: released grad shards]): the live bytes are the
    # model states. Small tensors (lr, loss scale, counters) are allowed; a shard (2 B per sharded element,
    # > 1.7 MB here) is not.
    live = live_cpu_storage_bytes() - before
    del held
    assert abs(live - model_states) < 64 * 1024, (live, model_states)


@pytest.mark.parametrize("offload", ["none", "cpu"])
def test_the_shard_bytes_saved_and_kept_under_offload(offload):
    """The old path (patched) and an offloaded optimizer hold the shard; the new path saves exactly it."""
    new = _stepped(_options())
    if offload == "none":
        with mock.patch.object(unit_sharding, "gathers_from_master", lambda *_: False):
            old = _stepped(_options())
    else:
        old = _stepped(_options(offload))
    assert not old.sharding.gathers_from_master
    shard_bytes = 2 * _sharded_numel(old)
    resident_full = 2 * next(f for f in new.sharding.flats if f is not None and f.resident).padded_numel
    # one rank: the shard path's resident unit views its bf16 shard, no full buffer beside it ([Note: world
    # size 1 aliases]); the fp32 master's resident unit needs its bf16 cast
    old_flats = [f for f in old.sharding.flats if f is not None]
    assert all(f.aliases_source for f in old_flats) and not any(
        f.aliases_source for f in new.sharding.flats if f
    )
    assert new.memory_bytes()["params"] == resident_full
    assert old.memory_bytes()["params"] == shard_bytes > 1_000_000
