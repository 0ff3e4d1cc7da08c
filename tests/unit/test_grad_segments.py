"""The fp32 grad shards in segments: allocated one at a time in backward, freed after the step.

Tests ([Note: released grad shards] in zero/grad_shards.py): (1) the segment plan (zero/plan.py
flat_grad_segments) against hand-written cuts; (2) GradShards' contract (a range crossing segments is refused,
release frees every byte, a segment no write reached reads zeros); (3) in a real backward at world size 1,
stage 2 (the direct path) and stage 3 (units), the held grad bytes grow layer by layer as backward reaches
each layer -- nothing is held when the last layer's backward starts, everything at the end, nothing after the
step -- instead of the whole shard appearing at the first gradient; (4) the weights equal plain
torch.optim.AdamW's after a few steps, so the releasing and re-allocating loses no gradient.
Leaves out: CUDA peaks (bench/run.py and bench/mem_snapshot.py on the GPU) and several ranks (tests/dist).
"""

from __future__ import annotations

import pytest
import torch

from zerolaunch.zero import Engine, plan
from zerolaunch.zero.grad_shards import GradShards
from zerolaunch.zero.layout import ParamSpec, plan_layout
from zerolaunch.zero.options import EngineOptions, OptimizerOptions, ZeroOptions
from zerolaunch.zero.plan import GradSegment


def _cuts(segments):
    return [(s.group, s.offset, s.numel, s.bucket, s.bucket_offset) for s in segments]


def test_direct_path_cuts_buckets_at_param_boundaries():
    specs = [ParamSpec(n, (k,)) for n, k in (("a", 5), ("b", 3), ("c", 4), ("d", 6), ("e", 20))]
    lay = plan_layout(specs, world_size=1, bucket_numel=100)  # one bucket of 38
    # runs of at most 8: a+b (8), c (4, c+d would be 10), d (6), e alone (bigger than 8)
    assert _cuts(plan.flat_grad_segments(lay, direct=True, max_numel=8)) == [
        (0, 0, 8, 0, 0),
        (0, 8, 4, 0, 8),
        (0, 12, 6, 0, 12),
        (0, 18, 20, 0, 18),
    ]
    # not direct: a reduce-scatter writes a whole bucket shard, so one segment per bucket
    two = plan_layout(specs, world_size=2, bucket_numel=12)  # buckets a+b+c (12), d (6), e (20)
    assert _cuts(plan.flat_grad_segments(two, direct=False, max_numel=8)) == [
        (0, 0, 6, 0, 0),
        (0, 6, 3, 1, 0),
        (0, 9, 10, 2, 0),
    ]


def test_grad_shards_contract():
    segs = [GradSegment(0, 0, 4, 0), GradSegment(0, 4, 6, 1), GradSegment(1, 0, 3, 2)]
    shards = GradShards([10, 3], segs, torch.device("cpu"), pin=False, releasable=True)
    assert shards.index_of(0, 5) == 1 and shards.index_of(1, 2) == 2
    with pytest.raises(ValueError, match="crosses segment"):
        shards.view(0, 2, 4)
    view = shards.view(0, 5, 2)
    view.fill_(3.0)
    shards.release()
    assert shards.held_bytes == 0 and shards.capacity_bytes == 4 * 13
    assert all(t.untyped_storage().nbytes() == 0 for t in shards.tensors)
    shards.prepare_write(1)  # a writer's re-allocation: the old view is valid again
    view.fill_(1.0)
    assert shards.held_bytes == 4 * 6
    shards.zero_unwritten()  # segments 0 and 2 got no write: zeros, not stale memory
    assert shards.tensors[0].eq(0).all() and shards.tensors[2].eq(0).all()
    assert shards.tensors[1][1:3].eq(1.0).all()
    with pytest.raises(ValueError, match=r"expected \[11, 3\]"):
        GradShards([11, 3], segs, torch.device("cpu"), pin=False, releasable=True)


class Tower(torch.nn.Module):
    def __init__(self, depth=5, width=32):
        super().__init__()
        torch.manual_seed(0)
        self.layers = torch.nn.ModuleList(torch.nn.Linear(width, width) for _ in range(depth))

    def forward(self, x):
        for layer in self.layers:
            x = torch.tanh(layer(x))
        return x


def _options(stage):
    return EngineOptions(
        # without overlap each stage-3 reduce completes (and writes its segment) before backward goes on
        zero=ZeroOptions(stage=stage, stage3_param_persistence_threshold=0, overlap_comm=False),
        optimizer=OptimizerOptions(name="adamw", lr=1e-2, weight_decay=0.1, decay_1d=True),
    )


@pytest.mark.parametrize("stage", [2, 3])
def test_backward_allocates_grads_layer_by_layer(stage, monkeypatch):
    # one segment per layer (a layer is 32*32 + 32 = 1056 elements); stage 3's units are the layers anyway
    monkeypatch.setattr(plan, "GRAD_SEGMENT_NUMEL", 1056)
    engine = Engine(Tower(), _options(stage))
    shards = engine.sharding.grad_shards
    layer_bytes = 4 * 1056
    assert shards.capacity_bytes == 5 * layer_bytes
    held_at_layer = []
    for layer in engine.module.layers:
        layer.register_full_backward_pre_hook(lambda *_: held_at_layer.append(shards.held_bytes))
    # an input that requires grad: the first layer's full backward hook then fires on its input grads
    x, y = torch.randn(4, 32, requires_grad=True), torch.randn(4, 32)
    for _ in range(2):
        assert shards.held_bytes == 0  # nothing held between steps (nor before the first backward)
        held_at_layer.clear()
        engine.backward(torch.nn.functional.mse_loss(engine(x), y))
        # backward reaches layers 4, 3, ..., 0: when layer k starts, the 4 - k layers after it hold grads
        assert held_at_layer == [n * layer_bytes for n in range(5)]
        assert shards.held_bytes == 5 * layer_bytes
        assert engine.step().stepped
    assert shards.held_bytes == 0


@pytest.mark.parametrize("stage", [2, 3])
def test_released_segments_lose_no_gradient(stage, monkeypatch):
    monkeypatch.setattr(plan, "GRAD_SEGMENT_NUMEL", 1056)
    ref = Tower()
    opt = torch.optim.AdamW(ref.parameters(), lr=1e-2, weight_decay=0.1)
    engine = Engine(Tower(), _options(stage))
    for i in range(4):
        gen = torch.Generator().manual_seed(i)
        x, y = torch.randn(4, 32, generator=gen), torch.randn(4, 32, generator=gen)
        opt.zero_grad()
        torch.nn.functional.mse_loss(ref(x), y).backward()
        opt.step()
        engine.backward(torch.nn.functional.mse_loss(engine(x), y))
        engine.step()
    got = dict(engine.iter_full_state(torch.float32))
    for name, p in ref.named_parameters():
        torch.testing.assert_close(got[name], p.detach(), rtol=1e-6, atol=1e-6)
