"""Save / resume of the real Engine on CPU gloo ranks.

Tests: (1) same world size and stage -> the resumed run continues bit-exactly (losses and weights equal
with atol=rtol=0) from a fresh model with other initial weights; (2) 2 -> 3 and 3 -> 2 ranks, and stage
2 -> stage 3, -> right after the load the weights equal the saved ones exactly, and the continued run
matches the uninterrupted one up to float rounding (the data is one global batch of 6 rows split evenly,
so every world size trains on the same samples; only the reduction order differs).
Leaves out: fp16/bf16 resume (the fp16 loss scale travels in state_meta, tested by the engine's tests).
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from _spawn import run_ranks
from _zero_models import Net

from zerolaunch.checkpoint import load_checkpoint, save_checkpoint
from zerolaunch.zero import Engine
from zerolaunch.zero.options import EngineOptions, OptimizerOptions, ZeroOptions

GLOBAL_ROWS = 6  # divisible by 2 and 3: every world size sees the same global batch
SAVE_AT, STEPS = 2, 4


def _options(stage: int) -> EngineOptions:
    return EngineOptions(
        zero=ZeroOptions(stage=stage, reduce_bucket_size=100, stage3_param_persistence_threshold=0),
        optimizer=OptimizerOptions(name="adamw", lr=1e-2, weight_decay=0.1),
        gradient_clipping=1.0,
    )


def _batch(step: int, rank: int, world_size: int):
    g = torch.Generator().manual_seed(500 + step)
    x, y = torch.randn(GLOBAL_ROWS, 31, generator=g), torch.randn(GLOBAL_ROWS, 5, generator=g)
    rows = GLOBAL_ROWS // world_size
    return x[rank * rows : (rank + 1) * rows], y[rank * rows : (rank + 1) * rows]


def _train(engine, rank, world_size, start, stop):
    losses = []
    for step in range(start, stop):
        x, y = _batch(step, rank, world_size)
        loss = F.mse_loss(engine(x), y)
        engine.backward(loss)
        engine.step()
        losses.append(loss.detach().clone())
    return losses


def _full(engine):
    return {n: t.clone() for n, t in engine.iter_full_state(torch.float32)}


def _run_and_save(rank, world_size, root, stage):
    """Uninterrupted run that saves at SAVE_AT; then, in the same ranks, a fresh engine resumes from it."""
    engine = Engine(Net(0), _options(stage))
    first = _train(engine, rank, world_size, 0, SAVE_AT)
    saved = _full(engine)
    rng = torch.get_rng_state()
    save_checkpoint(engine, root, step=SAVE_AT, extra={"data": {"next_step": SAVE_AT}, "rng": rng}, keep=2)
    rest = _train(engine, rank, world_size, SAVE_AT, STEPS)
    final = _full(engine)
    resumed = Engine(Net(7), _options(stage))  # other initial weights: the load must overwrite all of them
    extra = load_checkpoint(resumed, root)
    assert extra["data"]["next_step"] == SAVE_AT and torch.equal(extra["rng"], rng)
    loaded = _full(resumed)
    again = _train(resumed, rank, world_size, SAVE_AT, STEPS)
    return {
        "losses": first + rest,
        "saved": saved,
        "final": final,
        "loaded": loaded,
        "resumed_losses": again,
        "resumed_final": _full(resumed),
        "global_steps": resumed.global_steps,
    }


def _resume(rank, world_size, root, stage):
    engine = Engine(Net(7), _options(stage))
    load_checkpoint(engine, root)
    loaded = _full(engine)
    losses = _train(engine, rank, world_size, SAVE_AT, STEPS)
    return {"loaded": loaded, "losses": losses, "final": _full(engine), "global_steps": engine.global_steps}


def _phase_two_ranks(rank, world_size, root):
    """Bit-exact resume at stages 1 and 3, and the stage-2 checkpoint the 3-rank phase resumes from."""
    return {stage: _run_and_save(rank, world_size, f"{root}/ws2_s{stage}", stage) for stage in (1, 2, 3)}


def _phase_three_ranks(rank, world_size, root):
    """The 3-rank uninterrupted run (saving the checkpoint the last phase resumes), and 2 -> 3 at stage 1."""
    return {
        "run": _run_and_save(rank, world_size, f"{root}/ws3_s1", 1),
        "from2": _resume(rank, world_size, f"{root}/ws2_s2", 1),
    }


@pytest.fixture(scope="module")
def phases(tmp_path_factory):
    """Three spawns in all (each costs seconds of torch import), shared by the tests below."""
    root = str(tmp_path_factory.mktemp("ckpt"))
    two = run_ranks(_phase_two_ranks, 2, root)[0]
    three = run_ranks(_phase_three_ranks, 3, root)[0]
    back = run_ranks(_resume, 2, f"{root}/ws3_s1", 3)[0]  # 3 ranks at stage 1 -> 2 ranks at stage 3
    return two, three, back


def _assert_same(a: dict, b: dict, exact: bool):
    assert a.keys() == b.keys()
    for k in a:
        if exact:
            assert torch.equal(a[k], b[k]), k
        else:
            torch.testing.assert_close(a[k], b[k], rtol=1e-5, atol=1e-6, msg=k)


@pytest.mark.parametrize("stage", [1, 2, 3])
def test_same_world_size_resume_is_bit_exact(phases, stage):
    out = phases[0][stage]
    _assert_same(out["loaded"], out["saved"], exact=True)
    _assert_same(out["resumed_final"], out["final"], exact=True)
    assert all(torch.equal(a, b) for a, b in zip(out["resumed_losses"], out["losses"][SAVE_AT:], strict=True))
    assert out["global_steps"] == STEPS


def test_reshard_2_to_3_and_3_to_2_with_stage_change(phases):
    two, three, back = phases
    _assert_same(two[2]["final"], three["run"]["final"], exact=False)  # same global batch at both sizes
    for resumed, origin in ((three["from2"], two[2]), (back, three["run"])):
        _assert_same(resumed["loaded"], origin["saved"], exact=True)
        _assert_same(resumed["final"], origin["final"], exact=False)
        assert resumed["global_steps"] == STEPS
