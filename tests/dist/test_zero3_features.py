"""Stage 3 beyond fp32 parity: checkpoints, 16-bit training, meta-device init on several ranks.

Tests (one spawned group of 2 gloo ranks runs every case, then the parent checks):
- checkpoint: save at step 2, train on; a fresh stage 3 engine and a stage 2 engine loading it train to the
  same weights; the parent (world size 1) loads it and sees the weights the ranks had at the save;
- bf16: shards and gathered params are bf16 (half the bytes), iter_full_state(fp32) returns the fp32 master,
  and training stays close to the fp32 reference; fp16: an overflowing first step is skipped on every rank
  and the dynamic scale halves, later steps train;
- meta init: a model built on the meta device is materialized unit by unit with rank 0's seed on every rank
  (identical weights everywhere, no rank ever sees the whole model) and trains like the reference.
Leaves out: the fp32 parity matrix (test_zero3_parity.py), CUDA streams (tests/dist/test_zero3_cuda.py).
"""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
import torch.nn.functional as F
from _spawn import run_ranks
from test_zero3_parity import STEPS, Net3, micro_batch, options, reference, rows, train

from zerolaunch.checkpoint import load_checkpoint, save_checkpoint
from zerolaunch.zero import Engine
from zerolaunch.zero.options import PrecisionOptions, ZeroOptions
from zerolaunch.zero.stage3.unit_sharding import UnitSharding


def _weights(engine) -> dict:
    return dict(engine.iter_full_state())


def _checkpoint_case(rank, world_size, root):
    opts = options(persist=20)
    model = Net3(rank)
    engine = Engine(model, opts)
    train(engine, model, {}, rank, world_size, 2)
    save_checkpoint(engine, root, step=2)
    at_save = _weights(engine)
    train(engine, model, {"skip": True}, rank, world_size, 1)
    expected = _weights(engine)
    out = {"at_save": at_save, "expected": expected}
    for label, o in (
        ("stage3", opts),
        ("stage2", replace(opts, zero=ZeroOptions(stage=2, reduce_bucket_size=50))),
    ):
        fresh_model = Net3(rank + 7)
        fresh = Engine(fresh_model, o)
        load_checkpoint(fresh, root)
        train(fresh, fresh_model, {"skip": True}, rank, world_size, 1)
        out[label] = {n: t.detach().clone() for n, t in fresh.iter_full_state()}
        out[label + "_steps"] = fresh.global_steps
    return out


def _precision_case(rank, world_size):
    out = {}
    bf16 = replace(options(persist=20), precision=PrecisionOptions(dtype="bf16"))
    model = Net3(rank)
    engine = Engine(model, bf16)
    init = {n: t.float() for n, t in engine.iter_full_state(torch.float32)}
    train(engine, model, {}, rank, world_size, STEPS)
    out["bf16_init"] = init
    out["bf16_final"] = dict(engine.iter_full_state(torch.float32))
    out["bf16_compute"] = dict(engine.iter_full_state())
    out["bf16_master"] = [m.clone() for m in engine.shards.master]
    out["bf16_param_bytes"] = engine.memory_bytes()["params"]
    out["fp32_param_bytes"] = Engine(Net3(rank), options(persist=20)).memory_bytes()["params"]
    overflow = PrecisionOptions(dtype="fp16", initial_scale_power=40, hysteresis=1)
    model = Net3(rank)
    engine = Engine(model, replace(options(), precision=overflow))
    infos = train(engine, model, {}, rank, world_size, 2)
    out["fp16_overflow"] = ([(i.stepped, i.skipped, i.loss_scale) for i in infos], engine.global_steps)
    static = replace(options(), precision=PrecisionOptions(dtype="fp16", loss_scale=128.0))
    model = Net3(rank)
    engine = Engine(model, static)
    out["fp16_init"] = {n: t.float() for n, t in engine.iter_full_state()}
    infos = train(engine, model, {}, rank, world_size, STEPS)
    out["fp16_final"] = dict(engine.iter_full_state(torch.float32))
    out["fp16_stepped"] = [i.stepped for i in infos]
    return out


def _meta_case(rank, world_size):
    torch.manual_seed(1234 + rank)  # rank 0's seed must win
    with torch.device("meta"):
        model = Net3()
    engine = Engine(model, options(persist=20))
    assert all(not t.is_meta for t in list(model.parameters()) + list(model.buffers()))
    init = _weights(engine)
    train(engine, model, {"twice": True}, rank, world_size, STEPS)
    return {
        "init": init,
        "final": _weights(engine),
        "init_peak_numel": engine.sharding.init_peak_numel,
        "largest_unit": max(f.padded_numel for f in engine.sharding.flats if f is not None),
    }


def _all_cases(rank, world_size, root):
    return {
        "checkpoint": _checkpoint_case(rank, world_size, root),
        "precision": _precision_case(rank, world_size),
        "meta": _meta_case(rank, world_size),
    }


def test_stage3_features_two_ranks(tmp_path):
    root = str(tmp_path / "ckpt")
    results = run_ranks(_all_cases, 2, root)
    world_size = 2

    for r in results:
        ck = r["checkpoint"]
        assert ck["stage3_steps"] == ck["stage2_steps"] == 3
        for name, w in ck["expected"].items():
            torch.testing.assert_close(ck["stage3"][name], w, rtol=0, atol=0, msg=f"stage3 resume {name}")
            torch.testing.assert_close(
                ck["stage2"][name], w, rtol=1e-6, atol=1e-7, msg=f"stage2 resume {name}"
            )
    # another world size: one process reads the 2-rank checkpoint.
    single = Engine(Net3(5), options(persist=20))
    load_checkpoint(single, root)
    for name, t in single.iter_full_state():
        torch.testing.assert_close(t, results[0]["checkpoint"]["at_save"][name], rtol=0, atol=0, msg=name)

    ref, _ = reference(options(persist=20), {}, results[0]["precision"]["bf16_init"], world_size, STEPS)
    ref16, _ = reference(options(), {}, results[0]["precision"]["fp16_init"], world_size, STEPS)
    for r in results:
        p = r["precision"]
        assert all(t.dtype == torch.bfloat16 for t in p["bf16_compute"].values())
        for name, w in ref.items():
            # 16-bit forward/backward: close to the fp32 run, not equal.
            torch.testing.assert_close(p["bf16_final"][name], w, rtol=0, atol=3e-2, msg=name)
            torch.testing.assert_close(p["fp16_final"][name], ref16[name], rtol=0, atol=1e-2, msg=name)
        # the fp32 view is the master (not representable in bf16); the bf16 params are the master rounded.
        w = p["bf16_final"]["inp.weight"]
        assert not torch.equal(w, w.bfloat16().float())
        assert torch.equal(p["bf16_compute"]["inp.weight"], w.bfloat16())
        assert p["bf16_param_bytes"] * 2 == p["fp32_param_bytes"]  # every param held in 2 bytes, not 4
        infos, steps = p["fp16_overflow"]
        # every boundary overflows at 2**40 and 2**39: skipped on every rank, the scale halves, no step.
        assert (
            infos
            == [
                (False, False, 2.0**40),
                (False, True, 2.0**40),
                (False, False, 2.0**39),
                (False, True, 2.0**39),
            ]
            and steps == 0
        )
        assert p["fp16_stepped"] == [False, True] * STEPS
    meta = [r["meta"] for r in results]
    for name, t in meta[0]["init"].items():
        torch.testing.assert_close(meta[1]["init"][name], t, rtol=0, atol=0, msg=name)
        torch.testing.assert_close(meta[1]["final"][name], meta[0]["final"][name], rtol=0, atol=0, msg=name)
    assert meta[0]["init_peak_numel"] == meta[0]["largest_unit"]
    ref, _ = reference(options(persist=20), {"twice": True}, meta[0]["init"], world_size, STEPS)
    ref64, _ = reference(
        options(persist=20), {"twice": True}, meta[0]["init"], world_size, STEPS, torch.float64
    )
    for name, w in ref.items():
        err = (meta[0]["final"][name].double() - ref64[name]).abs().max()
        assert err <= 3 * (w.double() - ref64[name]).abs().max() + 1e-6, name


def test_bad_stage3_options_name_the_fix():
    with pytest.raises(ValueError, match="stage3_max_live_parameters must be >= 0"):
        Engine(Net3(0), replace(options(), zero=replace(options().zero, stage3_max_live_parameters=-1)))
    with pytest.raises(ValueError, match="stage3_units .* match no module"):
        Engine(Net3(0), replace(options(), zero=replace(options().zero, stage3_units=("Nope",))))
    with pytest.raises(ValueError, match="stage3_param_persistence_threshold must be >= 0"):
        Engine(
            Net3(0), replace(options(), zero=replace(options().zero, stage3_param_persistence_threshold=-1))
        )
    x, y = micro_batch(0, 0, 1)
    engine = Engine(Net3(0), options())
    try:
        engine.backward(F.mse_loss(engine(rows(x, 0)), rows(y, 0), reduction="none"))
    except ValueError as e:
        assert "scalar loss" in str(e)
    else:
        raise AssertionError("a non-scalar loss must be refused")


def test_units_reduce_during_backward_and_free_after_use(monkeypatch):
    # one process: the schedule is the same code at any world size, once the world-size-1 direct path
    # ([Note: direct grads]) is turned off. The input layer's output grad is the last thing backward computes
    # before the root's own grads: by then every block was reduce-scattered and freed, while the root is
    # still gathered.
    monkeypatch.setattr(UnitSharding, "_accumulates_directly", lambda self, o: False)
    # and the forward hooks kept: every unit aliases its source here ([Note: hook-free forward])
    monkeypatch.setattr(UnitSharding, "_forward_without_hooks", lambda self: False)
    opts = options(overlap=True)
    model = Net3(0)
    engine = Engine(model, opts)
    seen = {}

    def at_input_grad(grad):
        blocks = [f for f in engine.sharding.flats[1:-1] if f is not None]
        seen["issued"] = engine.sharding.schedule.issued_count
        seen["blocks_alive"] = sum(f.full_bytes_alive for f in blocks)
        seen["root_gathered"] = engine.sharding.flats[0].gathered

    x, y = micro_batch(0, 0, 1)

    def watch_input_grad(module, args, out):
        out.register_hook(at_input_grad)  # returns None: the output itself is left as it is

    handle = model.inp.register_forward_hook(watch_input_grad)
    engine.backward(F.mse_loss(engine(rows(x, 0)), rows(y, 0)))
    handle.remove()
    n_blocks = sum(f is not None for f in engine.sharding.flats[1:-1])
    assert seen["issued"] >= n_blocks - 1 and seen["blocks_alive"] == 0 and seen["root_gathered"], seen
    assert engine.sharding.schedule.issued_count == 0  # reset for the next micro-step, after all were issued
    assert all(f.full_bytes_alive == 0 for f in engine.sharding.flats if f is not None and not f.resident)
    # a freed param keeps its shape and reads as zeros (never the released memory); writes are refused.
    w = model.blocks[0].fc.weight
    assert w.shape == (17, 17) and float(w.detach().abs().sum()) == 0.0
    with torch.no_grad(), pytest.raises(RuntimeError):
        w.add_(1.0)
    engine.backward(F.mse_loss(engine(rows(x, 0)), rows(y, 0)))  # still trains after the reads
    assert engine.step().stepped is False and engine.step().stepped is True


@pytest.mark.parametrize(
    "dtype,gas,persist,ckpt",
    [("fp32", 1, 0, False), ("fp32", 3, 0, False), ("bf16", 3, 40, False), ("bf16", 2, 0, True)],
)
def test_world_size_1_direct_grads_are_bit_identical_to_the_reducing_path(
    dtype, gas, persist, ckpt, monkeypatch
):
    # [Note: direct grads]: one rank, no offload, grads straight into the grad shard. The reducing path
    # (forced) is the reference: same weights and norms to the bit, with tied weights across units, resident
    # params (persist), a unit skipped in one micro-step of a window (its params get no grad there: their
    # slices must read zero in the window's first micro-step, not the last window's values), a unit called
    # twice, and activation checkpointing.
    def run(direct: bool):
        with monkeypatch.context() as m:
            if not direct:
                m.setattr(UnitSharding, "_accumulates_directly", lambda self, o: False)
            opts = replace(
                options(persist=persist),
                precision=PrecisionOptions(dtype=dtype),
                gradient_accumulation_steps=gas,
            )
            engine = Engine(Net3(0), opts)
        assert engine.sharding.schedule.direct is direct
        model, norms = engine.module, []
        model.ckpt = ckpt
        for step in range(4):
            for micro in range(gas):
                model.skip = (step, micro) == (1, 0)
                model.twice = (step, micro) == (2, gas - 1)
                x, y = micro_batch(step, micro, 1)
                engine.backward(F.mse_loss(engine(rows(x, 0).to(engine.dtype)).float(), rows(y, 0)))
                info = engine.step()
            norms.append(info.grad_norm)
        staging = engine.sharding.schedule.staging_bytes
        return (
            dict(engine.iter_full_state(torch.float32)),
            norms,
            staging,
            engine.sharding.schedule.issued_count,
        )

    want, want_norms, _, _ = run(direct=False)
    got, got_norms, staging, issued = run(direct=True)
    assert staging == 0 and issued == 0  # nothing staged, nothing issued
    assert got_norms == want_norms
    for name, w in want.items():
        torch.testing.assert_close(got[name], w, rtol=0, atol=0, msg=name)
