"""Stages 0/1/2 on CUDA with nccl: side-stream overlap, pinned CPU offload, fused optimizers (torch's, and the
compiled fused step of optim/fused_step.py), bf16.

Skipped without a GPU (CI is CPU-only; this runs on the GPU machine): 2 ranks when 2 GPUs exist, else one
rank (collectives short-cut, but streams, fused CUDA kernels and pinned copies are real). Parity is against the same
one-process CPU fp32 reference as test_zero12_parity.py, to 1e-5 (GPU and CPU kernels round differently).
"""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
import torch.nn.functional as F
from _spawn import run_ranks
from _zero_models import Net, micro_batch, rank_rows, reference_weights
from test_zero12_parity import CASES, STEPS, _options

from zerolaunch.zero import Engine, plan
from zerolaunch.zero.optim import shard_optimizer
from zerolaunch.zero.options import PrecisionOptions

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")

NAMES = [
    "stage0",
    "stage1",
    "stage2_overlap",
    "stage2_sync",
    "stage1_offload",
    "stage2_offload",
    "stage2_offload_gas1",
    "stage1_offload_overlap_step",
    "stage2_offload_overlap_step",
    "stage2_sgd_noclip",
    # [Note: fused step]: the torch.compile'd chunk step (inductor on CUDA; eager on CPU elsewhere)
    "stage0_fused_step",
    "stage1_fused_step",
    "stage2_fused_step",
    "stage2_adam_fused_step",
]


def _pinned(name):
    o = CASES[name]
    if o.zero.offload_optimizer.device != "cpu":
        return o
    z = o.zero
    return replace(o, zero=replace(z, offload_optimizer=replace(z.offload_optimizer, pin_memory=True)))


def _cuda_cases(rank, world_size):
    device = torch.device("cuda", rank)
    # offloaded steps in chunks of 7 elements: many async host->device copies per bucket.
    shard_optimizer.HOST_CHUNK_NUMEL = 7
    out = {}
    for name in NAMES:
        engine = Engine(Net(seed=rank), _pinned(name), device=device)
        infos = []
        gas = engine.options.gradient_accumulation_steps
        for step in range(STEPS):
            for micro in range(gas):
                x, y = micro_batch(step, micro, world_size)
                engine.backward(
                    F.mse_loss(engine(rank_rows(x, rank).to(device)), rank_rows(y, rank).to(device))
                )
                infos.append(engine.step())
        engine.wait_for_step()  # params are read below outside any forward
        out[name] = {n: p.detach().cpu() for n, p in engine.module.named_parameters()}
        if engine.master_device.type == "cpu":
            assert engine.shards.master[0].is_pinned()
    o = _options(2, overlap=True)
    bf16 = type(o)(zero=o.zero, precision=PrecisionOptions(dtype="bf16"), optimizer=o.optimizer)
    engine = Engine(Net(0), bf16, device=device)
    x, y = micro_batch(0, 0, world_size)
    losses = []
    for _ in range(20):
        loss = F.mse_loss(
            engine(rank_rows(x, rank).to(device).bfloat16()).float(), rank_rows(y, rank).to(device)
        )
        engine.backward(loss)
        engine.step()
        losses.append(float(loss.detach()))
    out["bf16_losses"] = losses
    # the compiled fused step writes the bf16 params (or all-gather input) from the new master in one pass
    engine = Engine(Net(0), replace(bf16, optimizer=replace(bf16.optimizer, fused_step=True)), device=device)
    for _ in range(5):
        loss = F.mse_loss(
            engine(rank_rows(x, rank).to(device).bfloat16()).float(), rank_rows(y, rank).to(device)
        )
        engine.backward(loss)
        engine.step()
    master = dict(engine.iter_full_state(torch.float32))
    out["fused_bf16_cast_exact"] = all(
        torch.equal(p.cpu(), master[n].cpu().to(torch.bfloat16)) for n, p in engine.module.named_parameters()
    )
    # [Note: compute-dtype grads]: at world size 1 that engine kept its grads in bf16 and the compiled kernel
    # upcast them; the same run with fp32 grad shards forced must give the same master
    out["compute_dtype_grads"] = engine.sharding.grad_shards.compute_dtype is not None
    if world_size == 1:
        plan.grads_in_compute_dtype, kept = (lambda *a: False), plan.grads_in_compute_dtype
        try:
            wide = Engine(
                Net(0), replace(bf16, optimizer=replace(bf16.optimizer, fused_step=True)), device=device
            )
        finally:
            plan.grads_in_compute_dtype = kept
        for _ in range(5):
            loss = F.mse_loss(
                wide(rank_rows(x, rank).to(device).bfloat16()).float(), rank_rows(y, rank).to(device)
            )
            wide.backward(loss)
            wide.step()
        out["fp32_grads_master"] = {n: t.cpu() for n, t in wide.iter_full_state(torch.float32)}
        out["bf16_grads_master"] = {n: t.cpu() for n, t in master.items()}
    return out


def test_cuda_parity():
    world_size = min(2, torch.cuda.device_count())
    results = run_ranks(_cuda_cases, world_size, backend="nccl", timeout_s=300)
    for name in NAMES:
        ref, _ = reference_weights(CASES[name], world_size, STEPS)
        for res in results:
            for pname, w in ref.items():
                torch.testing.assert_close(
                    res[name][pname], w, rtol=1e-5, atol=1e-6, msg=lambda m, n=name: f"{n}: {m}"
                )
    for res in results:
        assert res["bf16_losses"][-1] < 0.5 * res["bf16_losses"][0]
        assert res["fused_bf16_cast_exact"]
        assert res["compute_dtype_grads"] is (world_size == 1)
        if world_size == 1:
            for n, w in res["fp32_grads_master"].items():
                # the same values; the grad norm's reduction over bf16 or fp32 inputs may round differently
                torch.testing.assert_close(res["bf16_grads_master"][n], w, rtol=1e-6, atol=1e-7, msg=n)
