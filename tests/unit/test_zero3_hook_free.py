"""Stage 3 at world size 1 where every unit aliases its source ([Note: hook-free forward] in
zero/stage3/schedule.py): no module forward hook, so engine.compile() takes the whole forward as one graph.

Tests: fp32 and pure bf16 register no forward hook on any module and say Engine.forward_hooks_free; a bf16
model over an fp32 master (each gather a cast) keeps its hooks; engine.compile() then gives one dynamo graph
(no break: the whole forward, loss included) holding the embedding (the root unit's compute) on the
hook-free engine, and only the blocks' graph on the hooked one; on a model with tied weights and a frozen
layer, with the optimizer on the device or offloaded, 3 steps of the compiled stage-3 engine leave the
weights of the uncompiled stage-3 engine (bit for bit), of stage 2 and of plain torch AdamW
(tests/dist/_reference.py; fp32, 1e-6); and a direct forward of the module, without Engine.gathered, gives
the engine's output. One process, CPU, dynamo's graphs run as captured (no inductor). Leaves out: inductor's
kernels, the speed and the memory (the GPU machine), several ranks (tests/dist/test_zero3_*.py).
"""

from __future__ import annotations

import os
import sys

import pytest
import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(__file__)), "dist"))

from _zero_models import MICRO_BATCH, Net, reference_weights, train_engine  # noqa: E402

import zerolaunch  # noqa: E402
from zerolaunch.models.gpt import build  # noqa: E402
from zerolaunch.zero.weak_hooks import refuse_when_gone  # noqa: E402

PURE_BF16 = {"enabled": True, "bf16_master_weights_and_grads": True, "bf16_optimizer_states": True}


ABOVE_EVERY_PARAM = 10**12
"""A stage3_param_persistence_threshold that makes every param persistent (resident, never gathered)."""


def _engine(stage: int, bf16: dict | None = None, persistence_threshold: int = 0):
    torch.manual_seed(0)
    config = {
        "train_micro_batch_size_per_gpu": 2,
        "zero_optimization": {"stage": stage, "stage3_param_persistence_threshold": persistence_threshold},
        "optimizer": {"type": "AdamW", "params": {"lr": 1e-2, "weight_decay": 0.1}},
        "gradient_clipping": 1.0,
    }
    if bf16 is not None:
        config["bf16"] = bf16
    engine = zerolaunch.initialize(build(size="tiny", vocab_size=97, seq_len=16), config=config)
    return engine[0] if isinstance(engine, tuple) else engine


def _batch(step: int) -> torch.Tensor:
    return torch.randint(0, 97, (2, 16), generator=torch.Generator().manual_seed(step))


def _train(engine, steps: int = 3, dtype: torch.dtype | None = None) -> dict[str, torch.Tensor]:
    """The weights after `steps` steps; dtype fp32 over a 16-bit model: the fp32 master."""
    for step in range(steps):
        ids = _batch(step)
        engine.backward(engine(input_ids=ids, labels=ids).loss)
        engine.step()
    return {name: t.clone() for name, t in engine.engine.iter_full_state(dtype)}


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    """Dynamo's caches hold each compiled model (its params, its example activations) after the test, and
    free them later, in the middle of another test that counts live storages (tests/unit/test_zero_world1.py)."""
    yield
    torch._dynamo.reset()


def _forward_hooks(module: torch.nn.Module) -> int:
    return sum(len(m._forward_pre_hooks) + len(m._forward_hooks) for m in module.modules())


def _recording_backend(graphs: list):
    def backend(gm: torch.fx.GraphModule, example_inputs):
        graphs.append(gm)
        return gm.forward  # run what dynamo captured, as captured

    return backend


def _targets(gm: torch.fx.GraphModule) -> set[str]:
    return {getattr(n.target, "__name__", str(n.target)) for n in gm.graph.nodes if n.op == "call_function"}


@pytest.mark.parametrize("bf16", [None, PURE_BF16], ids=["fp32", "pure-bf16"])
def test_an_aliasing_stage3_engine_hooks_no_forward(bf16):
    engine = _engine(3, bf16)
    assert all(f.aliases_source for f in engine.engine.sharding.flats if f is not None)
    assert engine.engine.forward_hooks_free
    assert _forward_hooks(engine.module) == 0


def test_a_bf16_model_over_an_fp32_master_keeps_its_gather_hooks():
    engine = _engine(3, {"enabled": True})
    assert not engine.engine.forward_hooks_free
    # a pre and a post hook on each of the 2 blocks (besides each sharded unit's refusal to run once the engine
    # is gone: [Note: weak hooks] in zero/weak_hooks.py)
    refusals = sum(
        isinstance(h, refuse_when_gone)
        for m in engine.module.modules()
        for h in m._forward_pre_hooks.values()
    )
    assert refusals > 0
    assert _forward_hooks(engine.module) - refusals == 2 * 2


def test_a_bf16_model_over_an_fp32_master_with_every_param_persistent_hooks_no_forward():
    # the resident unit holds the whole 16-bit model, cast from the master after each step: nothing to gather
    engine = _engine(3, {"enabled": True}, ABOVE_EVERY_PARAM)
    flats = [f for f in engine.engine.sharding.flats if f is not None]
    assert [f.resident for f in flats] == [True] and not flats[0].aliases_source
    assert engine.engine.forward_hooks_free
    assert _forward_hooks(engine.module) == 0


def test_stage2_has_no_forward_hooks_either():
    engine = _engine(2)
    assert engine.engine.forward_hooks_free and _forward_hooks(engine.module) == 0


@pytest.mark.parametrize(
    "bf16, persistence_threshold, whole",
    [(None, 0, True), ({"enabled": True}, 0, False), ({"enabled": True}, ABOVE_EVERY_PARAM, True)],
    ids=["fp32", "bf16-fp32-master", "bf16-fp32-master-persistent"],
)
def test_compile_takes_the_whole_forward_exactly_where_no_hook_runs_in_it(bf16, persistence_threshold, whole):
    torch._dynamo.reset()
    graphs = []
    engine = _engine(3, bf16, persistence_threshold)
    engine.compile(backend=_recording_backend(graphs))
    assert engine.compiled == ("the whole forward" if whole else "2 blocks")
    ids = _batch(0)
    engine.backward(engine(input_ids=ids, labels=ids).loss)
    engine.step()
    ops = set().union(*(_targets(gm) for gm in graphs))
    if whole:
        # one graph, no break: the embedding and the loss (the root unit's compute) are inside it
        assert len(graphs) == 1 and "embedding" in ops
    else:
        # the blocks' graph only (both blocks share it): the root unit's compute stays eager
        assert len(graphs) == 1 and "embedding" not in ops


def _net_engine(stage: int, offload: str = "none"):
    config = {
        "train_micro_batch_size_per_gpu": MICRO_BATCH,
        "zero_optimization": {
            "stage": stage,
            "stage3_param_persistence_threshold": 0,
            "offload_optimizer": {"device": offload},
        },
        "optimizer": {"type": "AdamW", "params": {"lr": 1e-2, "weight_decay": 0.1}},
        "gradient_clipping": 1.0,
    }
    engine = zerolaunch.initialize(Net(0), config=config)
    return engine[0] if isinstance(engine, tuple) else engine


@pytest.mark.parametrize("offload", ["none", "cpu"])
def test_the_compiled_hook_free_forward_trains_as_eager_stage3_stage2_and_torch(offload):
    # the awkward model: tied weights and a frozen layer (a unit with frozen params: no input wrapper now);
    # with the optimizer offloaded the units alias their compute-dtype shards and grads take the reducing path
    torch._dynamo.reset()
    steps, graphs = 3, []
    compiled = _net_engine(3, offload)
    compiled.compile(backend=_recording_backend(graphs))
    assert compiled.compiled == "the whole forward"
    runs = {}
    engines = (
        ("stage 2", _net_engine(2, offload)),
        ("stage 3", _net_engine(3, offload)),
        ("compiled", compiled),
    )
    for name, engine in engines:
        train_engine(engine.engine, 0, 1, steps)
        runs[name] = dict(engine.engine.iter_full_state())
    assert len(graphs) == 1  # the forward traced once, reused for every step
    want, _ = reference_weights(compiled.engine.options, 1, steps)
    for name, value in want.items():
        for run, weights in runs.items():
            torch.testing.assert_close(weights[name], value, rtol=1e-6, atol=1e-6, msg=f"{run} {name}")
        assert torch.equal(runs["compiled"][name], runs["stage 3"][name]), name


def test_a_direct_forward_reads_the_trained_weights_without_gathered():
    engine = _engine(3)
    _train(engine, steps=1)
    ids = _batch(5)
    with torch.no_grad():
        expected = engine(input_ids=ids, labels=ids).loss
        direct = engine.module(input_ids=ids, labels=ids).loss  # as generate calls it
        with engine.engine.gathered():
            inside = engine.module(input_ids=ids, labels=ids).loss
    torch.testing.assert_close(direct, expected, rtol=0, atol=0)
    torch.testing.assert_close(inside, expected, rtol=0, atol=0)


def test_the_compiled_persistent_bf16_engine_trains_as_eager_as_the_gathering_units_and_as_stage2():
    # bf16 compute over an fp32 master, every param persistent: the resident unit's 16-bit copy is refreshed
    # from the master after each step, as stage 2 refreshes its params; with threshold 0 the units cast their
    # master slices in each gather instead. All read the same bf16 values, from the same master start
    # (sharding.master_start). Compared after one step: Adam's first update is about lr * sign(grad), so later
    # steps turn an ulp of difference in a near-zero grad (a norm summed in another order) into 2 * lr.
    torch._dynamo.reset()
    graphs, master = [], torch.float32
    compiled = _engine(3, {"enabled": True}, ABOVE_EVERY_PARAM)
    compiled.compile(backend=_recording_backend(graphs))
    compiled_weights = _train(compiled, dtype=master)
    eager_weights = _train(_engine(3, {"enabled": True}, ABOVE_EVERY_PARAM), dtype=master)
    assert len(graphs) == 1
    for name, value in eager_weights.items():
        assert value.dtype == master, name
        assert torch.equal(compiled_weights[name], value), name
    one_step = _train(_engine(3, {"enabled": True}, ABOVE_EVERY_PARAM), steps=1, dtype=master)
    others = {
        "stage 3 gathering": _train(_engine(3, {"enabled": True}), steps=1, dtype=master),
        "stage 2": _train(_engine(2, {"enabled": True}), steps=1, dtype=master),
    }
    for run, weights in others.items():
        for name, value in weights.items():
            torch.testing.assert_close(one_step[name], value, rtol=1e-6, atol=1e-6, msg=f"{run} {name}")
