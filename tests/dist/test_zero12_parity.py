"""Stages 0/1/2 (+ CPU optimizer offload) equal one process training on the global batch.

Tests: fp32, same initial weights (non-zero ranks start from other weights: the engine must broadcast),
per-rank data, several steps, 17x31 weights with small buckets (numel not divisible by the world size,
several buckets per group), two param groups, a frozen param, a buffer, tied weights, grad accumulation 2
and clipping; AdamW, Adam and SGD; every scheduler. Leaves out: fp16/bf16 (test_zero12_features.py).
One spawned group per world size runs all cases (each spawn costs seconds of torch import).
"""

from __future__ import annotations

from dataclasses import replace

import _reference
import pytest
import torch
import torch.nn.functional as F
from _spawn import run_ranks
from _zero_models import Net, micro_batch, reference_weights, train_engine

from zerolaunch.zero import Engine
from zerolaunch.zero.optim import shard_optimizer
from zerolaunch.zero.options import (
    EngineOptions,
    OffloadOptions,
    OptimizerOptions,
    SchedulerOptions,
    ZeroOptions,
)

STEPS = 4


def _options(
    stage,
    *,
    optimizer="adamw",
    scheduler="none",
    offload=False,
    overlap=None,
    bucket=100,
    clip=0.05,
    overlap_step=False,
    fused_step=False,
):
    sched = SchedulerOptions(
        name=scheduler,
        warmup_num_steps=2,
        total_num_steps=STEPS + 1,
        warmup_min_lr=1e-4,
        warmup_type="linear" if scheduler == "WarmupDecayLR" else "log",
    )
    return EngineOptions(
        zero=ZeroOptions(
            stage=stage,
            reduce_bucket_size=bucket,
            overlap_comm=overlap,
            offload_optimizer=OffloadOptions(device="cpu" if offload else "none", overlap_step=overlap_step),
        ),
        optimizer=OptimizerOptions(
            name=optimizer, lr=1e-2, weight_decay=0.1, momentum=0.9, fused_step=fused_step
        ),
        scheduler=sched,
        gradient_clipping=clip,
        gradient_accumulation_steps=2,
    )


CASES = {
    "stage0": _options(0),
    "stage1": _options(1),
    "stage2_overlap": _options(2, overlap=True),
    "stage2_sync": _options(2, overlap=False),
    "stage1_offload": _options(1, offload=True),
    "stage2_offload": _options(2, offload=True, overlap=True),
    # one micro-step per window: the norm's sum of squares is taken from the reduced grads on the device.
    # (SGD: with one micro-step this data leaves an Adam moment near zero, where fp32 rounding of the
    # reference itself exceeds 1e-6; clipping still depends on the norm.)
    "stage2_offload_gas1": replace(
        _options(2, optimizer="sgd", offload=True, overlap=True), gradient_accumulation_steps=1
    ),
    # the CPU step runs in the background while the next forward starts ([Note: overlapped step]).
    "stage1_offload_overlap_step": _options(1, offload=True, overlap_step=True),
    "stage2_offload_overlap_step": _options(2, offload=True, overlap=True, overlap_step=True),
    "stage1_one_bucket": _options(1, bucket=10**6),
    "stage2_adam": _options(2, optimizer="adam"),
    "stage1_sgd": _options(1, optimizer="sgd"),
    "stage2_sgd": _options(2, optimizer="sgd"),
    # SGD without clipping is not invariant to the gradient's scale: catches a wrong average.
    "stage2_sgd_noclip": _options(2, optimizer="sgd", clip=0.0),
    "stage1_sgd_noclip": _options(1, optimizer="sgd", clip=0.0),
    "stage0_sgd_noclip": _options(0, optimizer="sgd", clip=0.0),
    "stage2_WarmupLR": _options(2, scheduler="WarmupLR"),
    "stage1_WarmupDecayLR": _options(1, scheduler="WarmupDecayLR"),
    "stage2_WarmupCosineLR": _options(2, scheduler="WarmupCosineLR"),
    "stage0_cosine": _options(0, scheduler="cosine"),
    # [Note: fused step]: one pass steps each chunk and writes its params (stage 0) or all-gather input; at
    # two ranks in fp32 a chunk that is its bucket's whole shard is gathered from the master instead
    "stage0_fused_step": _options(0, fused_step=True),
    "stage1_fused_step": _options(1, fused_step=True),
    "stage2_fused_step": _options(2, overlap=True, fused_step=True),
    "stage2_adam_fused_step": _options(2, optimizer="adam", fused_step=True),
    "stage1_fused_step_WarmupDecayLR": _options(1, scheduler="WarmupDecayLR", fused_step=True),
}


def _train_cases(rank, world_size, names):
    # offloaded steps walk the shards in chunks of this many elements (odd: chunks end mid-parameter).
    shard_optimizer.HOST_CHUNK_NUMEL = 7
    out = {}
    for name in names:
        model = Net(seed=rank)  # rank 0's weights must win
        engine = Engine(model, CASES[name])
        infos = train_engine(engine, rank, world_size, STEPS)
        engine.wait_for_step()  # params are read below outside any forward
        out[name] = {
            "weights": {n: p.detach().clone() for n, p in engine.module.named_parameters()},
            "buffer": engine.module.shift.clone(),
            "stepped": [i.stepped for i in infos],
            "norms": [i.grad_norm for i in infos if i.stepped],
        }
    return out


def _check(results, world_size, names):
    for name in names:
        ref, ref_norms = reference_weights(CASES[name], world_size, STEPS)
        for rank, res in enumerate(results):
            got = res[name]
            gas = CASES[name].gradient_accumulation_steps
            assert got["stepped"] == ([False] * (gas - 1) + [True]) * STEPS, name
            assert set(got["weights"]) == set(ref), name
            for pname, w in ref.items():
                torch.testing.assert_close(
                    got["weights"][pname],
                    w,
                    rtol=1e-6,
                    atol=1e-7,
                    msg=lambda m, n=name, p=pname, r=rank: f"{n} rank {r} {p}: {m}",
                )
            torch.testing.assert_close(got["buffer"], Net(0).shift, rtol=0, atol=0)
            # the exact global norm (clipping is active: reference norms are above the 0.05 threshold).
            torch.testing.assert_close(torch.tensor(got["norms"]), torch.tensor(ref_norms), rtol=1e-5, atol=0)
            assert min(ref_norms) > 0.05


def test_parity_two_ranks_all_cases():
    names = list(CASES)
    _check(run_ranks(_train_cases, 2, names), 2, names)


@pytest.mark.parametrize("world_size", [3])
def test_parity_three_ranks(world_size):
    names = [
        "stage1",
        "stage2_overlap",
        "stage2_offload",
        "stage2_offload_gas1",
        "stage2_offload_overlap_step",
    ]
    _check(run_ranks(_train_cases, world_size, names), world_size, names)


def test_parity_one_process_without_process_group():
    # no torch.distributed at all: the engine must still work (world size 1); the fused step then writes the
    # params themselves
    for name in ("stage1", "stage2_overlap", "stage1_fused_step", "stage2_adam_fused_step"):
        engine = Engine(Net(0), CASES[name])
        infos = train_engine(engine, 0, 1, STEPS)
        assert sum(i.stepped for i in infos) == STEPS
        _assert_like_one_process(engine, CASES[name], name)


def _assert_like_one_process(engine, options, label):
    """The engine's weights against one fp32 process on the same batches, as close to the fp64 answer as
    that process is (_reference.assert_adam_close: at world size 1 the engine sums each micro-batch's grads
    into the fp32 shard, the reference sums them in autograd, and Adam can make that rounding visible)."""
    ref32, _ = reference_weights(options, 1, STEPS)
    ref64, _ = reference_weights(options, 1, STEPS, dtype=torch.float64)
    got = dict(engine.module.named_parameters())
    for pname in ref32:
        _reference.assert_adam_close(got[pname].detach(), ref32[pname], ref64[pname], f"{label} {pname}")


def test_stage1_survives_model_zero_grad():
    # zero_grad(set_to_none=True) drops the grad views; the engine must re-attach them, not lose grads.
    engine = Engine(Net(0), CASES["stage1"])
    gas = CASES["stage1"].gradient_accumulation_steps
    for step in range(STEPS):
        for micro in range(gas):
            x, y = micro_batch(step, micro, 1)
            engine.backward(F.mse_loss(engine(x), y))
            engine.step()
        engine.module.zero_grad()
    _assert_like_one_process(engine, CASES["stage1"], "stage1 after zero_grad")
