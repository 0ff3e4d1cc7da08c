"""`stage3_max_reuse_distance`: a stage-3 unit reused soon after its forward stays gathered into its backward.

Tests (2 gloo ranks, fp32, Net3 of test_zero3_parity.py: the root plus four block units, 3 steps x 2
micro-steps): the all-gathers counted by the engine's CommStats with distance 0 (every unit freed after its
forward and gathered again for its backward), 1 (only the unit that ends the forward is reused before any
other unit's elements are gathered: one gather fewer per micro-step), a distance that covers one other
block (the last two units kept), and 1e9 (every block kept; a block is gathered once per micro-step);
also a case with a large distance and stage3_max_live_parameters that leaves room for only two kept
blocks at once. Every case ends with the same weights as distance 0 (bit for bit: a kept unit holds exactly what a
re-gather would bring) and as one process running torch AdamW on the global batch (test_zero3_parity.py's bound); the gathered elements
never exceed stage3_max_live_parameters. The same with a unit called twice plus activation checkpointing,
and with a skipped unit (a wrong predicted trace). Also the options' checks. Leaves out: the unit schedule itself
(test_zero3_parity.py), CUDA streams.
"""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
from _spawn import run_ranks
from test_zero3_parity import STEPS, Net3, _assert_matches, options, reference, train

from zerolaunch.zero import Engine
from zerolaunch.zero.stage3.partition import ROOT

MICRO_STEPS = STEPS * 2  # options() accumulates over 2 micro-steps
MODES = {"twice_ckpt": {"twice": True, "ckpt": True}, "skip": {"skip": True}}


def _opts(reuse: int, max_live: int = 10**9):
    base = options(max_live=max_live)
    return replace(base, zero=replace(base.zero, stage3_max_reuse_distance=reuse))


def _run(rank, world_size, reuse, max_live, mode=None):
    model = Net3(seed=rank)
    engine = Engine(model, _opts(reuse, max_live))
    init = dict(engine.iter_full_state())
    engine.comm_stats.reset()
    train(engine, model, mode or {}, rank, world_size, STEPS)
    gathers = engine.comm_stats.ops["all_gather"].count
    flats = engine.sharding.flats
    blocks = [f for k, f in enumerate(flats) if f is not None and k != ROOT and not f.resident]
    return {
        "init": init,
        "final": dict(engine.iter_full_state()),
        "gathers": gathers,
        "kept": engine.sharding.schedule.reuse_kept,
        "peak_live": engine.sharding.schedule.peak_live_numel,
        "root": flats[ROOT].padded_numel if flats[ROOT] is not None and not flats[ROOT].resident else 0,
        "block_numels": [f.padded_numel for f in blocks],
        "buckets": [len(f.buckets) for f in blocks],
    }


def _cases(rank, world_size):
    # the unit sizes (independent of the distance) fix the distances and the max_live of the later cases
    out = {"zero": _run(rank, world_size, 0, 10**9)}
    block = max(out["zero"]["block_numels"])
    out["one"] = _run(rank, world_size, 1, 10**9)
    out["one_block"] = _run(rank, world_size, block + 1, 10**9)
    out["large"] = _run(rank, world_size, 10**9, 10**9)
    # room for the root and two blocks: a block is kept only while it and the largest one gathered before
    # its reuse fit beside the root and the blocks already kept
    live = out["zero"]["root"] + 2 * block
    out["live_bound"] = _run(rank, world_size, 10**9, live)
    out["live_bound"]["max_live"] = live
    # a unit called twice, activation checkpointing (forward re-run inside backward), a skipped unit (the
    # predicted trace is wrong): with every unit kept, the same weights as with none
    for name, mode in MODES.items():
        out[f"zero_{name}"] = _run(rank, world_size, 0, 10**9, mode)
        out[f"large_{name}"] = _run(rank, world_size, 10**9, 10**9, mode)
    return out


@pytest.mark.dist
def test_reuse_distance_saves_gathers_and_keeps_the_weights():
    results = run_ranks(_cases, 2)
    r = results[0]
    zero, one, one_block, large, bound = (r[k] for k in ("zero", "one", "one_block", "large", "live_bound"))
    blocks = len(zero["block_numels"])
    assert blocks == 4
    buckets = zero["buckets"]  # all-gathers per gather of each block, in forward order (one per bucket)
    print(
        "all-gathers over",
        MICRO_STEPS,
        "micro-steps: distance 0:",
        zero["gathers"],
        "| 1:",
        one["gathers"],
        "| one block:",
        one_block["gathers"],
        "| 1e9:",
        large["gathers"],
        "| 1e9 with max_live for 2 blocks:",
        bound["gathers"],
        "(kept:",
        bound["kept"],
        ")",
    )
    assert zero["kept"] == 0
    # each kept block saves its backward's gather, every micro-step: distance 1 keeps the block that ends
    # the forward, block+1 elements the last two, 1e9 all four.
    assert one["kept"] == MICRO_STEPS
    assert zero["gathers"] - one["gathers"] == MICRO_STEPS * buckets[-1]
    assert one_block["kept"] == 2 * MICRO_STEPS
    assert zero["gathers"] - one_block["gathers"] == MICRO_STEPS * sum(buckets[-2:])
    assert large["kept"] == blocks * MICRO_STEPS
    assert zero["gathers"] - large["gathers"] == MICRO_STEPS * sum(buckets)
    # the live bound stops the reuse part way, and is never exceeded
    assert 0 < bound["kept"] < large["kept"]
    assert large["gathers"] < bound["gathers"] < zero["gathers"]
    assert bound["peak_live"] <= bound["max_live"] < large["peak_live"]

    ref, _ = reference(options(), {}, zero["init"], 2, STEPS)
    ref64, _ = reference(options(), {}, zero["init"], 2, STEPS, torch.float64)
    for res in results:
        for key in ("one", "one_block", "large", "live_bound"):
            for name, w in res["zero"]["final"].items():
                torch.testing.assert_close(res[key]["final"][name], w, rtol=0, atol=0, msg=f"{key} {name}")
        for name, w in ref.items():
            # AdamW: as close to the fp64 answer as fp32 torch is (test_zero3_parity.py's rule)
            _assert_matches(res["zero"]["final"][name], w, ref64[name], name, exact=False)
        for mode in MODES:
            assert res[f"large_{mode}"]["kept"] > 0
            assert res[f"large_{mode}"]["gathers"] < res[f"zero_{mode}"]["gathers"]
            for name, w in res[f"zero_{mode}"]["final"].items():
                torch.testing.assert_close(res[f"large_{mode}"]["final"][name], w, rtol=0, atol=0, msg=name)


def test_negative_distance_is_refused():
    with pytest.raises(ValueError, match="stage3_max_reuse_distance must be >= 0"):
        Engine(Net3(0), _opts(-1))
