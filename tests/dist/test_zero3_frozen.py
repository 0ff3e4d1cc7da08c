"""Stage 3 shards frozen params (a LoRA base, a frozen bottom) like trainable ones, and still trains exactly.

One spawned group per world size runs every case (fp32, gloo): the final weights match one process running
plain torch AdamW on the global batch (tests/dist/_reference.py, independent of zerolaunch), the frozen
params come back unchanged, and a rank holds 1/N of the frozen bytes (plus padding) between steps and at
most two units gathered at once, where it used to hold every frozen param whole.

The model: a frozen input projection in the root, then 4 units (awkward widths: 23, numel not divisible by
2 or 3). Units 0-1 are wholly frozen; units 2-3 are the PEFT layout: a frozen base Linear + LayerNorm and a
trainable low-rank adapter (lora_a, lora_b) in the same unit. A trainable gain in the root makes the grads
flow back through the frozen units (so their backward needs their gathered weights) unless `gain` is off.
Cases: no checkpointing, torch.utils.checkpoint non-reentrant and reentrant over every unit, checkpointing
with no grad below the adapters, param + optimizer offload to the host (also with reentrant checkpointing,
and that case again at 3 ranks: other padding), small frozen params resident, a LoRA unit called twice per
forward (plain and checkpointed), two forwards before one backward (DPO's chosen and rejected).

Checkpoints (same spawn, then this process): a stage-3 checkpoint holds each frozen param once, as the ranks'
frozen fragments in the compute dtype (not replicated); it resumes exactly at 2 ranks, at 1 process, at
stage 1, after an offline reshard to 3 ranks, and convert-checkpoint writes the frozen params; a stage-1
checkpoint (frozen params replicated, as every checkpoint before stage 3 sharded them) loads into stage 3.

The inference engine (build_inference_engine, for reference models): at stages 0-3, fp32 and bf16, with
offload_param at stage 3, its outputs equal the plain model's (cast to the compute dtype); at stage 3 a rank
holds 1/N of the weights (+ padding) and gathers at most the root, the running unit and one prefetched.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import _reference
import torch
import torch.nn.functional as F
from _spawn import run_ranks
from safetensors.torch import load_file
from torch import nn
from torch.utils.checkpoint import checkpoint

from zerolaunch.build import build_inference_engine
from zerolaunch.checkpoint.convert import convert_checkpoint
from zerolaunch.checkpoint.load import load_checkpoint
from zerolaunch.checkpoint.reshard import reshard_checkpoint
from zerolaunch.checkpoint.save import resolve_checkpoint, save_checkpoint
from zerolaunch.zero import Engine
from zerolaunch.zero.options import (
    EngineOptions,
    OffloadOptions,
    OptimizerOptions,
    PrecisionOptions,
    ZeroOptions,
)

WIDTH, RANK_R, MICRO_BATCH, STEPS = 23, 3, 3, 3


class Layer(nn.Module):
    def __init__(self, lora: bool):
        super().__init__()
        self.base = nn.Linear(WIDTH, WIDTH)
        self.ln = nn.LayerNorm(WIDTH)
        self.base.requires_grad_(False)
        self.ln.requires_grad_(False)
        self.lora_a = nn.Linear(WIDTH, RANK_R, bias=False) if lora else None
        self.lora_b = nn.Linear(RANK_R, WIDTH, bias=False) if lora else None
        if lora:
            nn.init.normal_(self.lora_b.weight, std=0.1)  # PEFT starts B at 0; nonzero exercises both grads

    def forward(self, x):
        h = self.base(self.ln(x))
        if self.lora_a is not None:
            h = h + self.lora_b(self.lora_a(x))
        return x + torch.tanh(h)


class FrozenNet(nn.Module):
    def __init__(self, seed: int = 0, gain: bool = True):
        super().__init__()
        torch.manual_seed(seed)
        self.inp = nn.Linear(13, WIDTH)
        self.inp.requires_grad_(False)
        self.gain = nn.Parameter(torch.ones(WIDTH), requires_grad=gain)
        self.layers = nn.ModuleList(Layer(lora=i >= 2) for i in range(4))
        self.head = nn.Linear(WIDTH, 5)
        self.ckpt = None
        self.twice = False

    def forward(self, x):
        h = self.inp(x) * self.gain
        for i, layer in enumerate(self.layers):
            for _ in range(2 if self.twice and i == 2 else 1):  # a mixed (LoRA) unit called twice
                if self.ckpt is None:
                    h = layer(h)
                else:
                    h = checkpoint(layer, h, use_reentrant=self.ckpt == "reentrant")
        return self.head(h)


def micro_batch(step: int, micro: int, world_size: int):
    g = torch.Generator().manual_seed(1000 * step + micro)
    return torch.randn(world_size * MICRO_BATCH, 13, generator=g), torch.randn(
        world_size * MICRO_BATCH, 5, generator=g
    )


def options(*, offload=False, persist=0):
    where = OffloadOptions(device="cpu" if offload else "none")
    return EngineOptions(
        zero=ZeroOptions(
            stage=3,
            stage3_param_persistence_threshold=persist,
            stage3_prefetch_bucket_size=800,  # one unit ahead (the largest is 736 elements)
            offload_param=where,
            offload_optimizer=where,
        ),
        optimizer=OptimizerOptions(name="adamw", lr=1e-2, weight_decay=0.1),
        gradient_clipping=0.05,
        gradient_accumulation_steps=2,
    )


# name -> (options, checkpointing, gain trainable)
CASES = {
    "plain": (options(), None, True),
    "checkpoint_nonreentrant": (options(), "nonreentrant", True),
    "checkpoint_reentrant": (options(), "reentrant", True),
    "checkpoint_no_grad_below": (options(), "nonreentrant", False),
    "offload": (options(offload=True), None, True),
    "small_frozen_resident": (options(persist=30), "reentrant", True),
    "offload_checkpoint_reentrant": (options(offload=True), "reentrant", True),
    "called_twice": (options(), None, True),
    "called_twice_checkpointed": (options(), "nonreentrant", True),
    "two_forwards_one_backward": (options(), None, True),
}
TWICE = {"called_twice", "called_twice_checkpointed"}
"""Cases whose model calls unit 2 twice per forward (its adapter grads arrive once, after both uses)."""
SPLIT = {"two_forwards_one_backward"}
"""Cases that run two forwards (the micro-batch in two parts, DPO's chosen/rejected) before one backward."""


def _frozen_names(model) -> set[str]:
    return {n for n, p in model.named_parameters() if not p.requires_grad}


def _train(engine, rank, world_size, steps, first=0):
    gas = engine.options.gradient_accumulation_steps
    for step in range(first, first + steps):
        for micro in range(gas):
            x, y = micro_batch(step, micro, world_size)
            rows = slice(rank * MICRO_BATCH, (rank + 1) * MICRO_BATCH)
            engine.backward(F.mse_loss(engine(x[rows]), y[rows]))
            engine.step()


def _full(engine) -> dict:
    return {n: t.clone() for n, t in engine.iter_full_state()}


def _checkpoint_round_trip(rank, world_size, folder):
    """Train, save, train on; a fresh engine (other weights) loads the save and trains the same steps on."""
    engine = Engine(FrozenNet(seed=0), options())
    _train(engine, rank, world_size, 1)
    save_checkpoint(engine, folder, step=1)
    saved = _full(engine)
    _train(engine, rank, world_size, 1, first=1)
    fresh = Engine(FrozenNet(seed=5), options())
    load_checkpoint(fresh, folder)
    loaded = _full(fresh)
    _train(fresh, rank, world_size, 1, first=1)
    return {"saved": saved, "loaded": loaded, "after": _full(engine), "fresh_after": _full(fresh)}


# name -> (stage, dtype, offload_param)
INFERENCE_CASES = {
    "stage0": (0, "fp32", False),
    "stage1_bf16": (1, "bf16", False),
    "stage2": (2, "fp32", False),
    "stage3": (3, "fp32", False),
    "stage3_bf16": (3, "bf16", False),
    "stage3_offload_param": (3, "fp32", True),
}


def _inference(rank, world_size):
    out = {}
    x = torch.randn(4, 13, generator=torch.Generator().manual_seed(3))
    for name, (stage, dtype, offload) in INFERENCE_CASES.items():
        base = options(offload=offload)
        opts = replace(
            base,
            zero=replace(base.zero, stage=stage),
            precision=PrecisionOptions(dtype=dtype),
        )
        model = FrozenNet(seed=rank)  # rank 0's weights must win
        engine = build_inference_engine(model, opts)
        with torch.no_grad():
            first, second = engine(x.to(engine.dtype)), engine(x.to(engine.dtype))
        flats = [f for f in engine.sharding.flats if f is not None] if stage == 3 else []
        out[name] = {
            "out": first,
            "again": second,
            "module_is_model": engine.module is model,
            "trainable": [n for n, p in model.named_parameters() if p.requires_grad],
            "bytes": engine.memory_bytes(),
            "numel": sum(p.numel() for p in FrozenNet().parameters()),
            "peak_live": engine.sharding.schedule.peak_live_numel if stage == 3 else 0,
            "units": sorted((f.padded_numel for f in flats), reverse=True),
            "root_numel": flats[0].padded_numel if flats else 0,
            "shard_on": [str(f.shard.device) for f in flats if f.shard is not None],
        }
    return out


def _check_inference(results, world_size):
    x = torch.randn(4, 13, generator=torch.Generator().manual_seed(3))
    for name, (stage, dtype, _) in INFERENCE_CASES.items():
        torch_dtype = {"fp32": torch.float32, "bf16": torch.bfloat16}[dtype]
        with torch.no_grad():
            want = FrozenNet(0).to(torch_dtype)(x.to(torch_dtype))
        for rank, got in enumerate(r["inference"][name] for r in results):
            label = f"inference {name} rank {rank}"
            torch.testing.assert_close(got["out"], want, rtol=0, atol=0, msg=label)
            torch.testing.assert_close(got["again"], want, rtol=0, atol=0, msg=label)
            assert got["module_is_model"] and got["trainable"] == [], label
            b = got["bytes"]
            assert b["grads"] == b["master"] == b["optimizer"] == 0, (label, b)
            whole = got["numel"] * torch_dtype.itemsize
            if stage < 3:
                assert b["params"] == whole, (label, b)
                continue
            # 1/N of the weights (+ at most one padded bucket per unit), no unit left gathered
            assert b["params"] <= whole / world_size + 6 * world_size * torch_dtype.itemsize, (label, b)
            units = got["units"]
            assert got["peak_live"] <= got["root_numel"] + units[0] + units[1], label
            assert set(got["shard_on"]) == {"cpu"}, label  # offloaded, or the compute device (cpu here)


def _run_cases(rank, world_size, names, folder=None, inference=True):
    out = {"inference": _inference(rank, world_size)} if inference else {}
    if folder is not None:
        out["checkpoint"] = _checkpoint_round_trip(rank, world_size, folder)
    for name in names:
        opts, ckpt, gain = CASES[name]
        model = FrozenNet(seed=rank, gain=gain)  # rank 0's weights must win
        frozen = _frozen_names(model)
        frozen_bytes = sum(p.numel() * 4 for n, p in model.named_parameters() if n in frozen)
        engine = Engine(model, opts)
        model.ckpt, model.twice = ckpt, name in TWICE
        init = {n: t.clone() for n, t in engine.iter_full_state()}
        flats = [f for f in engine.sharding.flats if f is not None]
        for step in range(STEPS):
            for micro in range(opts.gradient_accumulation_steps):
                x, y = micro_batch(step, micro, world_size)
                x, y = (
                    x[rank * MICRO_BATCH : (rank + 1) * MICRO_BATCH],
                    y[rank * MICRO_BATCH : (rank + 1) * MICRO_BATCH],
                )
                if name in SPLIT:  # the same mean over the rows, from two forwards
                    parts = [
                        F.mse_loss(engine(x[a:b]), y[a:b], reduction="sum") for a, b in ((0, 1), (1, None))
                    ]
                    loss = (parts[0] + parts[1]) / y.numel()
                else:
                    loss = F.mse_loss(engine(x), y)
                engine.backward(loss)
                engine.step()
        out[name] = {
            "init": init,
            "final": {n: t.clone() for n, t in engine.iter_full_state()},
            "frozen": frozen,
            "frozen_bytes": frozen_bytes,
            # this rank's frozen shard bytes (the frozen buckets' share of every unit's shard)
            "frozen_shard_bytes": sum(f.buckets[i].shard_numel * 4 for f in flats for i in f.frozen_buckets),
            "resident_frozen_bytes": sum(p.numel() * 4 for _, p in engine.sharding.frozen_params),
            "param_bytes": engine.memory_bytes()["params"],
            "full_alive": sum(f.full_bytes_alive for f in flats if not f.resident),
            "peak_live": engine.sharding.schedule.peak_live_numel,
            "units": sorted((f.padded_numel for f in flats if not f.resident), reverse=True),
            "root_numel": engine.sharding.flats[0].padded_numel,
            "trainable_bytes": sum(f.train_shard_numel * 4 for f in flats),
        }
    return out


def reference(init: dict, ckpt, gain: bool, world_size: int, dtype=torch.float32, twice=False):
    model = FrozenNet(0, gain=gain).to(dtype)
    with torch.no_grad():
        for n, p in model.named_parameters():
            p.copy_(init[n])
    model.ckpt, model.twice = ckpt, twice
    opts = options()

    def micro_loss(step, micro):
        x, y = micro_batch(step, micro, world_size)
        return F.mse_loss(model(x.to(dtype)), y.to(dtype))

    _reference.train(model, opts, STEPS, micro_loss)
    return {n: p.detach().clone() for n, p in model.named_parameters()}


def _check(results, world_size):
    for name, (_, ckpt, gain) in CASES.items():
        if name not in results[0]:
            continue
        init = results[0][name]["init"]
        ref32 = reference(init, ckpt, gain, world_size, twice=name in TWICE)
        ref64 = reference(init, ckpt, gain, world_size, torch.float64, twice=name in TWICE)
        torch.testing.assert_close(
            init["layers.0.base.weight"], FrozenNet(0).layers[0].base.weight, rtol=0, atol=0
        )
        for rank, got in enumerate(r[name] for r in results):
            for pname, w in ref32.items():
                label = f"{name} N={world_size} rank {rank} {pname}"
                if pname in got["frozen"]:  # never stepped, never changed
                    torch.testing.assert_close(got["final"][pname], init[pname], rtol=0, atol=0, msg=label)
                else:
                    _reference.assert_adam_close(got["final"][pname], w, ref64[pname], label)
            # the adapters moved (a test whose trainable params never change could not fail)
            assert not torch.equal(got["final"]["layers.3.lora_a.weight"], init["layers.3.lora_a.weight"])
            # memory: no unit gathered between steps; the frozen params are 1/N per rank (+ padding),
            # not the whole copy every rank held before; gathered at once at most the root, the running unit
            # and the one prefetched.
            assert got["full_alive"] == 0, name
            pad = 4 * 6 * (world_size - 1)  # at most one padded bucket per unit
            sharded_frozen = got["frozen_bytes"] - got["resident_frozen_bytes"]
            assert got["frozen_shard_bytes"] <= sharded_frozen / world_size + pad, (name, got)
            assert got["frozen_shard_bytes"] + got["resident_frozen_bytes"] <= 0.6 * got["frozen_bytes"]
            units = got["units"]
            # a unit called twice: its second backward prefetches anew, past the unit already prefetched
            # (schedule.py counts only newly gathered units against stage3_prefetch_bucket_size). Two
            # forwards before one backward: a unit stays gathered from the second forward's backward to the
            # first's (its grads arrive once, after both), as for trainable units: no bound but the model.
            extra = units[2] if name in TWICE else sum(units) if name in SPLIT else 0
            bound = got["root_numel"] + units[0] + units[1] + extra
            assert got["peak_live"] <= bound, (name, got["peak_live"], units)


def _assert_equal(got: dict, want: dict, label: str) -> None:
    assert sorted(got) == sorted(want), label
    for n, t in want.items():
        torch.testing.assert_close(got[n], t, rtol=0, atol=0, msg=f"{label}: {n}")


def _check_checkpoints(results, folder, tmp_path):
    import json

    for rank, r in enumerate(x["checkpoint"] for x in results):
        _assert_equal(r["loaded"], r["saved"], f"rank {rank} load")
        _assert_equal(r["fresh_after"], r["after"], f"rank {rank} resumed step")
    saved = results[0]["checkpoint"]["saved"]
    folder = resolve_checkpoint(Path(folder))
    manifest = json.loads((folder / "manifest.json").read_text())
    frozen = {n for n in saved if "base" in n or ".ln." in n or n.startswith("inp.")}
    assert not frozen & {r["name"] for r in manifest["replicated"]}
    held = {}
    for r in manifest["ranks"]:
        for n, a, b in r["frozen_fragments"]:
            held[n] = held.get(n, 0) + b - a
    assert held == {n: saved[n].numel() for n in frozen}  # every element once, over both ranks
    # one process, stage 3 and stage 1; after an offline reshard to 3 ranks
    resharded = reshard_checkpoint(folder, tmp_path / "ws3", 3)
    for stage, source in ((3, folder), (1, folder), (3, resharded)):
        engine = Engine(FrozenNet(seed=7), replace(options(), zero=replace(options().zero, stage=stage)))
        load_checkpoint(engine, source)
        _assert_equal(_full(engine), saved, f"stage {stage} at 1 process from {source.name}")
    out = convert_checkpoint(folder, tmp_path / "model.safetensors")
    _assert_equal(load_file(out), saved, "convert-checkpoint")
    # a checkpoint with the frozen params replicated (stage 1) loads into stage 3
    stage1 = Engine(FrozenNet(seed=8), replace(options(), zero=replace(options().zero, stage=1)))
    _train(stage1, 0, 1, 1)
    old = save_checkpoint(stage1, tmp_path / "stage1", step=1)
    engine = Engine(FrozenNet(seed=9), options())
    load_checkpoint(engine, old)
    _assert_equal(_full(engine), _full(stage1), "stage-1 checkpoint into stage 3")


def test_frozen_params_sharded_parity_and_checkpoints_two_ranks(tmp_path):
    folder = tmp_path / "ck"
    results = run_ranks(_run_cases, 2, list(CASES), str(folder))
    _check(results, 2)
    _check_checkpoints(results, folder, tmp_path)
    _check_inference(results, 2)


def test_frozen_params_sharded_parity_three_ranks():
    """N=3: every bucket's padding differs from N=2's (529-element bases, 23-element norms)."""
    results = run_ranks(_run_cases, 3, ["offload_checkpoint_reentrant"], None, False)
    _check(results, 3)
