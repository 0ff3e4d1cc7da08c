"""Stage 3 unit detection and parameter ownership (zero/stage3/partition.py), and one-unit-at-a-time
materialization (zero/stage3/materialize.py), on one process without torch.distributed.

Tests: the GPT's blocks are found automatically (the largest ModuleList of one class), class-name and
dotted-path overrides, a clear error for an override that matches nothing, tied weights go to the root unit,
frozen and small params stay resident; a meta-built GPT trains through the stage-3 Engine and is initialized
like the GPT's own init (same distribution), with peak init memory bounded by the largest unit (measured with
the torch profiler's allocation events); the schedule's phases (SchedulePhase) and the units' states
(UnitState) through one micro-step. Leaves out: several ranks (tests/dist/test_zero3_*.py).
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

from zerolaunch.models.gpt import build
from zerolaunch.zero import Engine
from zerolaunch.zero.options import EngineOptions, OptimizerOptions, ZeroOptions
from zerolaunch.zero.stage3.partition import ROOT, partition


def _gpt(**kw):
    return build("tiny", vocab_size=64, seq_len=16, **kw)


def test_gpt_blocks_are_the_units_and_the_tied_embedding_is_root():
    model = _gpt()
    part = partition(model, persistence_threshold=0)
    assert [u.name for u in part.units] == ["", "transformer.h.0", "transformer.h.1"]
    root = dict(part.units[ROOT].params)
    # wte is tied to lm_head: counted once, under its first name, in the root unit.
    assert "transformer.wte.weight" in root and "lm_head.weight" not in root
    assert all(n.startswith("transformer.h.1.") for n, _ in part.units[2].params)
    owned = [n for u in part.units for n, _ in u.params]
    assert len(owned) == len(set(owned)) == len(dict(model.named_parameters()))


def test_small_params_stay_resident_and_frozen_ones_are_sharded_in_their_unit():
    model = _gpt()
    model.transformer.wpe.requires_grad_(False)
    model.transformer.h[1].requires_grad_(False)
    part = partition(model, persistence_threshold=65)  # the 64-element LayerNorm weights and biases
    persistent = {n for n, _ in part.persistent}
    assert "transformer.h.0.ln_1.weight" in persistent and "transformer.ln_f.bias" in persistent
    # frozen params live in their unit like trainable ones (kept apart: no grad, no optimizer state);
    # small frozen ones stay resident like small trainable ones.
    assert [n for n, _ in part.units[ROOT].frozen] == ["transformer.wpe.weight"]
    block1_frozen = {n for n, _ in part.units[2].frozen}
    assert "transformer.h.1.attn.qkv.weight" in block1_frozen and part.units[2].params == []
    assert {n for n, _ in part.frozen} == {
        n for n, p in model.transformer.h[1].named_parameters(prefix="transformer.h.1") if p.numel() < 65
    }
    sharded = {n for u in part.units for n, _ in u.params}
    assert not sharded & persistent and "transformer.wpe.weight" not in sharded


def test_override_by_class_name_and_by_path():
    model = _gpt()
    by_class = partition(model, ("MLP",))
    assert [u.name for u in by_class.units] == ["", "transformer.h.0.mlp", "transformer.h.1.mlp"]
    by_path = partition(model, ("transformer.h.1", "lm_head"))
    assert [u.name for u in by_path.units] == ["", "transformer.h.1", "lm_head"]
    # lm_head's weight is also wte's: used by two regions, so it belongs to the root.
    assert by_path.units[2].params == [] and by_path.home_unit["transformer.wte.weight"] == ROOT


def test_override_matching_nothing_names_the_fix():
    with pytest.raises(ValueError, match=r"match no module of GPT.*present: .*Block"):
        partition(_gpt(), ("TransformerLayer",))


def test_model_without_module_list_is_one_root_unit():
    model = nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 2))
    part = partition(model)
    assert len(part.units) == 1 and len(part.units[ROOT].params) == 4


def _allocated_peak_bytes(fn) -> tuple[object, int]:
    """Run fn under the torch profiler; peak of live CPU bytes allocated by torch during it."""
    with torch.profiler.profile(
        activities=[torch.profiler.ProfilerActivity.CPU], profile_memory=True
    ) as prof:
        out = fn()
    events = sorted((e for e in prof.events() if e.name == "[memory]"), key=lambda e: e.time_range.start)
    live = peak = 0
    for e in events:
        live += e.cpu_memory_usage
        peak = max(peak, live)
    return out, peak


def test_meta_model_materializes_one_unit_at_a_time_and_trains():
    torch.manual_seed(0)
    with torch.device("meta"):
        model = build("tiny", vocab_size=64, seq_len=16, n_layer=6, d_model=64)
    n_params = sum(p.numel() for p in model.parameters())
    options = EngineOptions(
        zero=ZeroOptions(stage=3, stage3_param_persistence_threshold=0),
        optimizer=OptimizerOptions(lr=1e-3),
    )
    engine, peak = _allocated_peak_bytes(lambda: Engine(model, options))
    block = sum(p.numel() for p in model.transformer.h[0].parameters())
    root = n_params - 6 * block
    largest = max(block, root)
    # held for good: shard (compute) + fp32 master + grad shard = 3 * 4 bytes per element (world size 1);
    # transient: the fp32 init buffer and the full buffer of one unit.
    assert peak <= 4 * (3 * n_params + 2 * largest) + 64 * 1024, (peak, n_params, largest)
    # a whole-model materialization would need the transient part for every unit at once.
    assert peak < 4 * (3 * n_params + 2 * n_params)
    state = dict(engine.iter_full_state())
    assert not any(t.is_meta for t in state.values())
    # the GPT's init: N(0, 0.02) linears (residual projections scaled down), LayerNorm ones / zeros.
    assert 0.018 < float(state["transformer.h.3.mlp.fc.weight"].std()) < 0.022
    assert 0.018 < float(state["transformer.wte.weight"].std()) < 0.022
    assert torch.equal(state["transformer.h.5.ln_1.weight"], torch.ones(64))
    ids = torch.randint(0, 64, (2, 16), generator=torch.Generator().manual_seed(0))
    losses = []
    for _ in range(3):
        out = engine(ids, labels=ids)
        engine.backward(out.loss)
        engine.step()
        losses.append(float(out.loss.detach()))
    assert losses[-1] < losses[0]


def test_meta_tensor_without_init_is_a_clear_error():
    class NoInit(nn.Module):
        def __init__(self):
            super().__init__()
            self.register_buffer("table", torch.empty(3))
            self.layers = nn.ModuleList(nn.Linear(2, 2) for _ in range(2))

        def forward(self, x):
            return x

    with torch.device("meta"):
        model = NoInit()
    with pytest.raises(ValueError, match=r"buffer 'table' .*meta device and nothing initializes it"):
        Engine(model, EngineOptions(zero=ZeroOptions(stage=3)))


def test_stage3_phases_and_unit_states_through_one_micro_step(stage3_hooks):
    """SchedulePhase and UnitState name what the hooks did: IDLE -> FORWARD (each block gathered in its
    pre-hook, sharded again after) -> IDLE with only the root gathered -> BACKWARD -> IDLE, all sharded."""
    from zerolaunch.zero.stage3.schedule import SchedulePhase
    from zerolaunch.zero.stage3.unit_buffers import UnitState

    engine = Engine(_gpt(), EngineOptions(zero=ZeroOptions(stage=3, stage3_param_persistence_threshold=0)))
    schedule, flats = engine.sharding.schedule, engine.sharding.schedule.flats
    seen = []

    def pre_hook(module, args):
        seen.append((schedule.phase, flats[1].state))

    handle = engine.module.transformer.h[0].register_forward_pre_hook(pre_hook)
    assert schedule.phase is SchedulePhase.IDLE and flats[1].state is UnitState.SHARDED
    ids = torch.randint(0, 64, (2, 16), generator=torch.Generator().manual_seed(0))
    out = engine(ids, labels=ids)
    # registered after the schedule's own pre-hook: the unit is gathered by the time this one runs.
    assert seen == [(SchedulePhase.FORWARD, UnitState.GATHERED)]
    assert schedule.phase is SchedulePhase.IDLE
    assert [f.state for f in flats if f is not None and not f.resident] == [
        UnitState.GATHERED,
        UnitState.SHARDED,
        UnitState.SHARDED,
    ]
    out.loss.register_hook(lambda grad: seen.append(schedule.phase))
    engine.backward(out.loss)
    assert seen[-1] is SchedulePhase.BACKWARD
    assert schedule.phase is SchedulePhase.IDLE
    assert all(f.state is UnitState.SHARDED for f in flats if f is not None and not f.resident)
    engine.step()
    handle.remove()
