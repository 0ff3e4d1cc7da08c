"""Stage 3 without offload gathers each unit from its fp32 master, bit for bit as from the 16-bit shard.

[Note: gather from master] in zerolaunch/zero/stage3/unit_buffers.py: with no offload a unit keeps no
compute-dtype shard; its gather casts the fp32 master. Tests: the same training run both ways -- the new path
and the old one (a compute-dtype shard written after every step, forced by patching the decision
`unit_sharding.gathers_from_master`) -- gives equal losses, grad norms, fp32 masters and gathered weights
(atol=0), through a checkpoint save + load + one more step, for bf16, fp16 and fp32 compute, with persistent
params (the resident unit re-gathers after the step), activation checkpointing, a unit called twice and
one skipped; on 2 gloo ranks (a transient cast buffer is the all-gather input), in one process without a
group (the cast goes straight into the full buffer) and, on a GPU only, in one process with zero.overlap's
side streams (the cast runs on the gather stream). The old path's shard is the cast of the master.
Leaves out: memory (tests/unit/test_zero3_no_shard_memory.py).
"""

from __future__ import annotations

import os
import tempfile
from dataclasses import replace
from unittest import mock

import pytest
import torch
import torch.nn.functional as F
from test_zero3_parity import Net3, micro_batch, options, rows, set_mode

from zerolaunch.checkpoint import load_checkpoint, save_checkpoint
from zerolaunch.zero import Engine
from zerolaunch.zero.options import PrecisionOptions
from zerolaunch.zero.stage3 import unit_sharding

STEPS = 3

# name -> (compute dtype, persistence threshold, Net3 mode)
CASES = {
    "bf16_persistent": ("bf16", 20, {}),
    "bf16_ckpt_twice_skip": ("bf16", 0, {"ckpt": True, "twice": True, "skip": True}),
    "fp16_persistent": ("fp16", 20, {"skip": True}),
    "fp32": ("fp32", 20, {"twice": True}),
}


def _train(engine, model, mode, rank, world_size, steps, first_step=0) -> tuple[list, list]:
    losses, norms = [], []
    for step in range(first_step, first_step + steps):
        for micro in range(engine.options.gradient_accumulation_steps):
            set_mode(model, mode, step, micro)
            x, y = micro_batch(step, micro, world_size)
            out = engine(rows(x, rank).to(engine.device, engine.dtype)).float()
            loss = F.mse_loss(out, rows(y, rank).to(engine.device))
            losses.append(loss.detach().clone())
            engine.backward(loss)
            info = engine.step()
        norms.append(info.grad_norm)
    return losses, norms


def _run(rank, world_size, name, root, device, *, keep_shard: bool) -> dict:
    dtype, persist, mode = CASES[name]
    opts = replace(options(persist=persist, overlap=True), precision=PrecisionOptions(dtype=dtype))
    model = Net3(rank)
    engine = Engine(model, opts, device=torch.device(device))
    flats = [f for f in engine.sharding.flats if f is not None]
    assert engine.sharding.gathers_from_master is not keep_shard
    # a unit with frozen params keeps their shard either way (they have no master)
    assert all((f.shard is not None) is (keep_shard or len(f.frozen_buckets) > 0) for f in flats)
    losses, norms = _train(engine, model, mode, rank, world_size, STEPS)
    out = {
        "losses": losses,
        "norms": norms,
        "compute": dict(engine.iter_full_state()),
        "fp32": dict(engine.iter_full_state(torch.float32)),
        "master": [m.clone() for m in engine.shards.master],
        "steps": engine.global_steps,
    }
    if keep_shard:  # the premise: the old shard is always the cast of the fp32 master
        for f in flats:
            for i, b in enumerate(f.buckets[: f.n_trainable_buckets]):
                master = engine.shards.read("master", b.group, f.master_offsets[i], b.shard_numel)
                assert torch.equal(f.bucket_shard(f.shard, i), master.to(f.dtype)), (name, f.index, i)
    save_checkpoint(engine, root, step=STEPS)
    fresh_model = Net3(rank + 7)
    fresh = Engine(fresh_model, opts, device=torch.device(device))
    load_checkpoint(fresh, root)
    out["loaded"] = _train(fresh, fresh_model, mode, rank, world_size, 1, first_step=STEPS)
    out["loaded_compute"] = dict(fresh.iter_full_state())
    out["loaded_master"] = [m.clone() for m in fresh.shards.master]
    return out


def run_both(rank, world_size, names, root, device="cpu") -> dict:
    out = {}
    for name in names:
        new = _run(rank, world_size, name, os.path.join(root, name, "new"), device, keep_shard=False)
        with mock.patch.object(unit_sharding, "gathers_from_master", lambda *_: False):
            old = _run(rank, world_size, name, os.path.join(root, name, "old"), device, keep_shard=True)
        out[name] = (new, old)
    return out


def check_bit_identical(results: list[dict]) -> None:
    for rank, per_name in enumerate(results):
        for name, (new, old) in per_name.items():
            assert new["steps"] == old["steps"] > 0, name
            label = f"{name} rank {rank}"
            torch.testing.assert_close(new, old, rtol=0, atol=0, msg=lambda m, label=label: f"{label}: {m}")
            assert all(t.dtype == torch.float32 for t in new["fp32"].values())


def test_gather_from_master_is_bit_identical_on_two_ranks():
    from _spawn import run_ranks

    with tempfile.TemporaryDirectory(prefix="zl-s3master-") as root:
        results = run_ranks(run_both, 2, list(CASES), root, timeout_s=300)
    check_bit_identical(results)


def test_gather_from_master_is_bit_identical_in_one_process():
    with tempfile.TemporaryDirectory(prefix="zl-s3master-") as root:
        check_bit_identical([run_both(0, 1, list(CASES), root)])


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_gather_from_master_is_bit_identical_on_cuda_side_streams():
    with tempfile.TemporaryDirectory(prefix="zl-s3master-") as root:
        check_bit_identical([run_both(0, 1, list(CASES), root, "cuda:0")])
