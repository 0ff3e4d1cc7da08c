"""An engine nobody references any more is freed with every buffer it owns, and leaves the model as it was given.

The engine's hooks live on the user's model (each param's post-accumulate-grad hook, stage 3's module forward
hooks), which usually outlives the engine: a notebook, a second Trainer on the same model, a reference model.
Tests ([Note: weak hooks] in zero/weak_hooks.py), stages 1-3, with and without cpu offload (stage 3: of params
too), the model kept or dropped with the engine: (1) after a step and `del engine` + gc.collect(), the engine
object and the storages it alone owns (fp32 grad shards, optimizer state, the master unless it is the params'
own buffers, stage 3's compute-dtype unit shards) are gone; a kept model has none of the engine's hooks left
and still runs at stages 1-2 (its params are its own), while at stage 3, whose sharded weights went with the
engine, running it raises a clear error instead of computing with zero placeholders, and so does building
another engine on it, even while the first is alive (it used to start from the zeros); (2) stages 1-2: a new
engine on a model whose first engine was dropped trains exactly as an engine on a fresh copy of the model (a
dropped engine's hooks used to take the grads first); (3) the HF Trainer's stage-3 additions to the model
(hf/: direct-call guard, synced generate) work while the engine lives and do not keep it; (4) a deep copy of
the model carries no live engine hook (stage 3: it refuses to run, its params being copied placeholders).
Leaves out: CUDA memory (the same objects hold it) and world size > 1 (the hooks do not depend on it).
"""

from __future__ import annotations

import copy
import gc
import weakref
from dataclasses import replace

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from zerolaunch.zero import Engine
from zerolaunch.zero.options import EngineOptions, OffloadOptions, OptimizerOptions, ZeroOptions
from zerolaunch.zero.weak_hooks import refuse_when_gone

# stage 3 here is the hooked path (units gathered and freed around their forward); one GPU with nothing to
# gather runs without forward hooks, its params the engine's own buffers: the last test below
pytestmark = pytest.mark.usefixtures("stage3_hooks")


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(8, 8)

    def forward(self, x):
        return x + torch.tanh(self.fc(x))


class Net(nn.Module):
    """Blocks in a ModuleList: stage 3 makes each one a unit, with its own forward hooks."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.inp = nn.Linear(5, 8)
        self.blocks = nn.ModuleList(Block() for _ in range(2))
        self.head = nn.Linear(8, 3)

    def forward(self, x):
        h = self.inp(x)
        for block in self.blocks:
            h = block(h)
        return self.head(h)


def _options(stage: int, offload: bool) -> EngineOptions:
    host = OffloadOptions(device="cpu" if offload else "none")
    return EngineOptions(
        zero=ZeroOptions(
            stage=stage,
            stage3_param_persistence_threshold=0,  # every param sharded in its unit
            offload_optimizer=host,
            offload_param=host if stage == 3 else OffloadOptions(),
        ),
        optimizer=OptimizerOptions(name="adamw", lr=1e-2, weight_decay=0.1),
    )


def _train(engine, steps: int = 1) -> None:
    for step in range(steps):
        g = torch.Generator().manual_seed(step)
        x, y = torch.randn(4, 5, generator=g), torch.randn(4, 3, generator=g)
        engine.backward(F.mse_loss(engine(x), y))
        engine.step()


def _owned_storages(engine) -> list[torch.UntypedStorage]:
    """Storages only the engine holds: a weakref to one dies with the last tensor on it."""
    sharding = engine.sharding
    tensors = list(sharding.grad_shards.tensors)
    tensors += [t for kinds in sharding.shards.state for t in kinds.values()]
    if (
        not sharding.shards.master_is_external
    ):  # else the master is the model's params ([Note: master is params])
        tensors += sharding.shards.master
    tensors += [f.shard for f in getattr(sharding, "flats", ()) if f is not None and f.shard is not None]
    assert tensors
    return [t.untyped_storage() for t in tensors]


def _hooks_left(model: nn.Module) -> list[str]:
    """The hooks on `model` that are not stage 3's refusal to run without the engine."""
    hooks = []
    for name, module in model.named_modules():
        if module._forward_hooks or module._state_dict_pre_hooks:
            hooks.append(f"module {name!r}")
        if any(not isinstance(h, refuse_when_gone) for h in module._forward_pre_hooks.values()):
            hooks.append(f"module {name!r} pre-forward")
    for name, p in model.named_parameters():
        if getattr(p, "_post_accumulate_grad_hooks", None):
            hooks.append(f"param {name}")
    return hooks


@pytest.mark.parametrize("keep_model", [True, False], ids=["model_kept", "model_dropped"])
@pytest.mark.parametrize("offload", [False, True], ids=["device", "offload"])
@pytest.mark.parametrize("stage", [1, 2, 3])
def test_dropped_engine_frees_its_buffers(stage, offload, keep_model):
    model = Net()
    engine = Engine(model, _options(stage, offload))
    _train(engine)
    x = torch.randn(2, 5)
    with torch.no_grad():
        last_output = engine(x)
    engine_ref = weakref.ref(engine)
    storage_refs = [weakref.ref(s) for s in _owned_storages(engine)]
    del engine
    if not keep_model:
        del model
    gc.collect()
    assert engine_ref() is None
    alive = [i for i, ref in enumerate(storage_refs) if ref() is not None]
    assert not alive, f"{len(alive)} of {len(storage_refs)} engine storages outlive the engine"
    if not keep_model:
        return
    assert _hooks_left(model) == []
    with torch.no_grad():
        if stage == 3:  # the sharded weights went with the engine: refused, not zeros
            with pytest.raises(RuntimeError, match="stage-3 engine that has been freed"):
                model(x)
        else:  # the params are the model's own
            torch.testing.assert_close(model(x), last_output, rtol=0, atol=0)


@pytest.mark.parametrize("stage", [1, 2])
def test_new_engine_on_a_model_whose_engine_was_dropped(stage):
    reused = Net()
    first = Engine(reused, _options(stage, offload=False))
    _train(first)
    del first
    gc.collect()
    second = Engine(reused, _options(stage, offload=False))
    weights_after_first = [p.detach().clone() for p in reused.parameters()]

    fresh = Net()
    with torch.no_grad():
        for p, w in zip(fresh.parameters(), weights_after_first, strict=True):
            p.copy_(w)
    reference = Engine(fresh, _options(stage, offload=False))
    _train(second, steps=2)
    _train(reference, steps=2)
    for p, q in zip(reused.parameters(), fresh.parameters(), strict=True):
        torch.testing.assert_close(p, q, rtol=0, atol=0)


@pytest.mark.parametrize("first_alive", [True, False], ids=["first_alive", "first_freed"])
def test_no_second_engine_on_a_model_stage_3_sharded(first_alive):
    """Its params are zero placeholders: a new engine (any stage) would silently start from zeros."""
    model = Net()
    first = Engine(model, _options(3, offload=False))
    if not first_alive:
        del first
        gc.collect()
    for stage in (1, 3):
        with pytest.raises(ValueError, match="already sharded by a ZeRO stage-3 engine"):
            Engine(model, _options(stage, offload=False))


@pytest.mark.parametrize("stage", [2, 3])
def test_deep_copy_of_the_model_is_no_part_of_the_engine(stage):
    """Stage 2 with overlap_step (module hooks that wait for the step): the copy is a plain model with the
    same weights. Stage 3: the copy's params are copies of placeholders, so it refuses to run by name."""
    options = _options(stage, offload=stage == 2)
    if stage == 2:
        offload = replace(options.zero.offload_optimizer, overlap_step=True)
        options = replace(options, zero=replace(options.zero, offload_optimizer=offload))
    model = Net()
    engine = Engine(model, options)
    _train(engine)
    engine.wait_for_step()
    copied = copy.deepcopy(model)
    x = torch.randn(2, 5)
    with torch.no_grad():
        if stage == 3:
            with pytest.raises(RuntimeError, match="deep copy of a module a ZeRO stage-3 engine sharded"):
                copied(x)
            return
        torch.testing.assert_close(copied(x), engine(x), rtol=0, atol=0)
    copied(x).sum().backward()  # the copy's grads are its own: no engine hook takes them
    assert all(p.grad is not None for p in copied.parameters())


class GeneratingNet(Net):
    def generate(self, x, synced_gpus=None):
        return self(x)


def test_trainer_hooks_on_the_model_do_not_keep_the_engine():
    """The Trainer's stage-3 additions to the model it trains (hf/): the direct-call guard (forward hooks
    on the root) and the synced generate (an attribute of the model)."""
    from zerolaunch.hf.reference import guard_direct_calls
    from zerolaunch.hf.trainer import _synced_generate

    model = GeneratingNet()
    engine = Engine(model, _options(3, offload=False))
    _train(engine)
    guard_direct_calls(engine)
    model.generate = _synced_generate(model.generate, engine)
    x = torch.randn(2, 5)
    with torch.no_grad():
        expected = engine(x)
        torch.testing.assert_close(model(x), expected, rtol=0, atol=0)  # the guard gathers the root
        torch.testing.assert_close(model.generate(x), expected, rtol=0, atol=0)
    engine_ref = weakref.ref(engine)
    del engine
    gc.collect()
    assert engine_ref() is None
    assert _hooks_left(model) == []


def test_hook_free_stage_3_leaves_a_model_that_runs(monkeypatch):
    """One rank, nothing to gather ([Note: hook-free forward]): every param stays a view of the engine's master,
    so a kept model holds its trained weights and runs on without the engine (no refusal hook is left to
    enter a compiled forward); the grad shards and optimizer state still go with the engine."""
    monkeypatch.undo()  # this module's stage3_hooks fixture: here the engine runs as it does by default
    model = Net()
    engine = Engine(model, _options(3, offload=False))
    assert engine.forward_hooks_free
    _train(engine)
    x = torch.randn(2, 5)
    with torch.no_grad():
        last_output = engine(x)
    sharding = engine.sharding
    owned = list(sharding.grad_shards.tensors) + [
        t for kinds in sharding.shards.state for t in kinds.values()
    ]
    storage_refs = [weakref.ref(t.untyped_storage()) for t in owned]
    del engine, sharding, owned
    gc.collect()
    assert [ref() for ref in storage_refs] == [None] * len(storage_refs)
    assert _hooks_left(model) == []
    assert not any(
        isinstance(h, refuse_when_gone) for m in model.modules() for h in m._forward_pre_hooks.values()
    )
    with torch.no_grad():
        torch.testing.assert_close(model(x), last_output, rtol=0, atol=0)
