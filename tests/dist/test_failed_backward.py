"""A backward that raises part way: the engine refuses to go on with the window until discard_window(), and
after it the run equals one process that never failed ([Note: failed backward] in zerolaunch/zero/engine.py).

The model raises from the middle of its backward when armed (an autograd function between blocks 1 and 2):
the head and blocks 2-3 have produced grads (reduced into shards at stage 2/3, written into the flat grads
at stages 0/1, staged or in flight), blocks 0-1 and the input layer none. Step 0 fails at its second
micro-step, step 1 at its first; each window is then dropped and run again whole, step 2 runs as usual. The
reference is plain torch AdamW on the global batches of the three windows (no failure, nothing of the
dropped tries). A discard that left any slice ACCUMULATING, a staged grad, a held buffer or a .grad behind
adds the failed try's grads to the retried ones and misses the reference.
"""

from __future__ import annotations

import _reference
import pytest
import torch
import torch.nn.functional as F
from _spawn import run_ranks
from _zero_models import Block
from torch import nn

from zerolaunch.zero import Engine
from zerolaunch.zero.optim import shard_optimizer
from zerolaunch.zero.options import EngineOptions, OffloadOptions, OptimizerOptions, ZeroOptions

MICRO_BATCH = 3
STEPS = 3
GAS = 2
FAIL_AT = {0: 1, 1: 0}
"""optimizer step -> the micro-step whose first try raises."""


class Injected(RuntimeError):
    pass


class _TripWire(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, armed: bool):
        ctx.armed = armed
        return x.clone()

    @staticmethod
    def backward(ctx, grad):
        if ctx.armed:
            raise Injected("out of memory (injected by the test)")
        return grad, None


class Net(nn.Module):
    def __init__(self, seed: int = 0):
        super().__init__()
        torch.manual_seed(seed)
        self.inp = nn.Linear(31, 17)
        self.blocks = nn.ModuleList(Block() for _ in range(4))
        self.head = nn.Linear(17, 5)
        self.armed = False

    def forward(self, x):
        h = self.inp(x)
        for i, block in enumerate(self.blocks):
            if i == 2:
                h = _TripWire.apply(h, self.armed)
            h = block(h)
        return self.head(h)


def micro_batch(step: int, micro: int, world_size: int):
    g = torch.Generator().manual_seed(1000 * step + micro)
    return torch.randn(world_size * MICRO_BATCH, 31, generator=g), torch.randn(
        world_size * MICRO_BATCH, 5, generator=g
    )


def options(stage: int, *, offload=False, overlap=None, overlap_step=False) -> EngineOptions:
    cpu = OffloadOptions(device="cpu" if offload else "none", overlap_step=overlap_step)
    return EngineOptions(
        zero=ZeroOptions(
            stage=stage,
            reduce_bucket_size=100,  # several buckets: some issued, one staged, some untouched at the failure
            overlap_comm=overlap,
            offload_optimizer=cpu,
            offload_param=cpu if stage == 3 else OffloadOptions(),
        ),
        optimizer=OptimizerOptions(name="adamw", lr=1e-2, weight_decay=0.1),
        gradient_clipping=0.05,
        gradient_accumulation_steps=GAS,
    )


CASES = {
    "stage0": options(0),
    "stage1": options(1),
    "stage2_overlap": options(2, overlap=True),
    "stage2_sync": options(2, overlap=False),
    "stage1_offload": options(1, offload=True),
    "stage2_offload": options(2, offload=True, overlap=True),
    "stage2_offload_overlap_step": options(2, offload=True, overlap=True, overlap_step=True),
    "stage3": options(3, overlap=True),
    "stage3_offload": options(3, offload=True),
}
ONE_PROCESS = ["stage1", "stage2_overlap", "stage2_offload", "stage3", "stage3_offload"]
"""World size 1 without a process group: the direct accumulators (flat/reducer.py DirectAccumulator, stage 3's
[Note: direct grads]) and the offloaded reducing paths."""


def _forward_backward(engine, model, step, micro, rank, world_size, armed):
    x, y = micro_batch(step, micro, world_size)
    rows = slice(rank * MICRO_BATCH, (rank + 1) * MICRO_BATCH)
    model.armed = armed
    try:
        engine.backward(F.mse_loss(engine(x[rows]), y[rows]))
    finally:
        model.armed = False


def train_with_failures(engine, model, rank: int, world_size: int) -> dict:
    seen = {"refusals": [], "micro_steps_after_discard": [], "stepped": []}
    for step in range(STEPS):
        if step in FAIL_AT:
            for micro in range(FAIL_AT[step]):
                _forward_backward(engine, model, step, micro, rank, world_size, False)
                engine.step()
            try:
                _forward_backward(engine, model, step, FAIL_AT[step], rank, world_size, True)
            except Injected:
                pass
            else:
                raise AssertionError("the armed backward did not raise")
            retry = lambda s=step: _forward_backward(engine, model, s, 0, rank, world_size, False)  # noqa: E731
            for call in (engine.step, retry):
                try:
                    call()
                except RuntimeError as error:
                    seen["refusals"].append(str(error))
                else:
                    seen["refusals"].append(None)
            engine.discard_window()
            seen["micro_steps_after_discard"].append(engine.micro_steps)
        for micro in range(GAS):
            _forward_backward(engine, model, step, micro, rank, world_size, False)
            seen["stepped"].append(engine.step().stepped)
    engine.wait_for_step()
    seen["final"] = {n: t.clone() for n, t in engine.iter_full_state()}
    return seen


def _run_cases(rank, world_size, names):
    shard_optimizer.HOST_CHUNK_NUMEL = 7  # offloaded steps in chunks that end mid-parameter
    out = {}
    for name in names:
        model = Net(seed=rank)  # rank 0's weights must win
        engine = Engine(model, CASES[name])
        init = {n: t.clone() for n, t in engine.iter_full_state()}  # stages 0-2 yield the live params
        out[name] = {"init": init, **train_with_failures(engine, model, rank, world_size)}
        out[name]["buffer_bytes"] = engine.memory_bytes()["buckets"]
        engine.close()
        # the same run with nothing failing: a discard must hand every staging buffer back for reuse
        clean = Engine(Net(seed=rank), CASES[name])
        for step in range(STEPS):
            for micro in range(GAS):
                _forward_backward(clean, clean.module, step, micro, rank, world_size, False)
                clean.step()
        out[name]["clean_buffer_bytes"] = clean.memory_bytes()["buckets"]
        clean.close()
    return out


def reference(init: dict, world_size: int, opts: EngineOptions) -> dict:
    model = Net(0)
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.copy_(init[name])

    def micro_loss(step, micro):
        x, y = micro_batch(step, micro, world_size)
        return F.mse_loss(model(x), y)

    _reference.train(model, opts, STEPS, micro_loss)
    return {n: p.detach() for n, p in model.named_parameters()}


def _check(results: list[dict], world_size: int, names) -> None:
    for name in names:
        for rank, got in enumerate(results):
            got = got[name]
            label = f"{name} rank {rank}"
            assert got["stepped"] == [False, True] * STEPS, label
            step_refusal, backward_refusal = got["refusals"][:2]
            assert step_refusal is not None and "engine.step()" in step_refusal, label
            assert backward_refusal is not None and "engine.backward()" in backward_refusal, label
            for text in got["refusals"]:
                assert text is not None and "discard_window()" in text and "Injected: out of memory" in text
            # back at the last boundary: 0 micro-steps before step 0's window, 2 before step 1's
            assert got["micro_steps_after_discard"] == [0, GAS], label
            assert got["buffer_bytes"] == got["clean_buffer_bytes"], label
            ref = reference(got["init"], world_size, CASES[name])
            for pname, w in ref.items():
                torch.testing.assert_close(
                    got["final"][pname],
                    w,
                    rtol=1e-6,
                    atol=1e-6,
                    msg=lambda m, p=pname, lb=label: f"{lb} {p}: {m}",
                )


def test_discarded_windows_equal_a_run_without_failures_two_ranks():
    names = list(CASES)
    _check(run_ranks(_run_cases, 2, names), 2, names)


@pytest.mark.parametrize("name", ONE_PROCESS)
def test_discarded_windows_equal_a_run_without_failures_one_process(name):
    _check([_run_cases(0, 1, [name])], 1, [name])


def test_a_failed_forward_needs_no_discard():
    # a forward that raises has written no grad: the window goes on (stage 3 frees what it gathered).
    for name in ("stage2_overlap", "stage3"):
        model = Net(0)
        engine = Engine(model, CASES[name])
        init = {n: t.clone() for n, t in engine.iter_full_state()}
        with pytest.raises(RuntimeError, match="mat1 and mat2"):
            engine(torch.randn(MICRO_BATCH, 30))
        for step in range(STEPS):
            for micro in range(GAS):
                _forward_backward(engine, model, step, micro, 0, 1, False)
                engine.step()
        ref = reference(init, 1, CASES[name])
        final = dict(engine.iter_full_state())
        for pname, w in ref.items():
            torch.testing.assert_close(final[pname], w, rtol=1e-6, atol=1e-6)


def test_the_refusal_names_the_error_and_the_fix():
    model = Net(0)
    engine = Engine(model, CASES["stage2_overlap"])
    with pytest.raises(Injected):
        _forward_backward(engine, model, 0, 0, 0, 1, True)
    with pytest.raises(RuntimeError) as refused:
        engine.step()
    text = str(refused.value)
    assert (
        "a backward of this accumulation window raised (Injected: out of memory (injected by the test))"
        in text
    )
    assert "engine.discard_window()" in text
    engine.discard_window()
    _forward_backward(engine, model, 0, 0, 0, 1, False)
    assert not engine.step().stepped


def test_the_deepspeed_surface_discards_the_window_and_its_losses():
    # initialize()'s engine averages the window's losses for the monitors: the dropped try's loss must go too.
    from zerolaunch.api import ZeroLaunchEngine

    model = Net(0)
    engine = ZeroLaunchEngine(Engine(model, CASES["stage2_overlap"]))
    engine._monitors = object()  # as with a monitors block: backward() keeps each loss for the mean
    x, y = micro_batch(0, 0, 1)
    engine.backward(F.mse_loss(engine(x[:MICRO_BATCH]), y[:MICRO_BATCH]))
    engine._monitors = None
    engine.step()
    engine._monitors = object()
    model.armed = True
    with pytest.raises(Injected):
        engine.backward(F.mse_loss(engine(x[:MICRO_BATCH]), y[:MICRO_BATCH]))
    model.armed = False
    assert len(engine._losses) == 2
    engine.discard_window()
    assert engine._losses == [] and engine.micro_steps == 0
