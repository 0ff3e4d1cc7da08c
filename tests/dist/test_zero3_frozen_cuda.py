"""Stage 3 with frozen params on CUDA: the frozen bucket's compute-dtype shard on the device (or pinned on the
host with offload_param), gathered on the side stream with the unit, freed after, never reduced.

Skipped without a GPU (CI is CPU-only; this runs on the GPU machine), one process (world size 1: the collectives
short-cut, but the streams, the storage free/re-allocate of every unit and the host->device copies of offloaded
shards are real). The model and cases are test_zero3_frozen.py's (a LoRA layout and wholly frozen units,
checkpointing reentrant and not, offload, a unit called twice, two forwards before one backward); fp32 is held
against that file's one-process CPU reference (as close to the fp64 answer as fp32 torch, + 1e-5: GPU kernels
round differently), frozen params must come back bit-equal, and no unit stays gathered between steps. The
inference engine's bf16 forward is held to the plain model's in bf16 on the same GPU.
"""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
import torch.nn.functional as F
from test_zero3_frozen import CASES, MICRO_BATCH, SPLIT, STEPS, TWICE, FrozenNet, micro_batch, reference

from zerolaunch.build import build_inference_engine
from zerolaunch.zero import Engine
from zerolaunch.zero.options import OffloadOptions, PrecisionOptions

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")

NAMES = [
    "plain",
    "checkpoint_reentrant",
    "checkpoint_nonreentrant",
    "offload_checkpoint_reentrant",
    "called_twice",
    "two_forwards_one_backward",
]


def _pinned(opts):
    if opts.zero.offload_param.device == "none":
        return opts
    pinned = OffloadOptions(device="cpu", pin_memory=True)
    return replace(opts, zero=replace(opts.zero, offload_param=pinned, offload_optimizer=pinned))


@pytest.mark.parametrize("name", NAMES)
def test_frozen_stage3_cuda_matches_cpu_reference(name):
    opts, ckpt, gain = CASES[name]
    device = torch.device("cuda", 0)
    model = FrozenNet(seed=0, gain=gain)
    engine = Engine(model, _pinned(opts), device=device)
    model.ckpt, model.twice = ckpt, name in TWICE
    init = {n: t.cpu().clone() for n, t in engine.iter_full_state()}
    frozen = {n for n, p in model.named_parameters() if not p.requires_grad}
    for step in range(STEPS):
        for micro in range(opts.gradient_accumulation_steps):
            x, y = (t[:MICRO_BATCH].to(device) for t in micro_batch(step, micro, 1))
            if name in SPLIT:
                parts = [F.mse_loss(engine(x[a:b]), y[a:b], reduction="sum") for a, b in ((0, 1), (1, None))]
                loss = (parts[0] + parts[1]) / y.numel()
            else:
                loss = F.mse_loss(engine(x), y)
            engine.backward(loss)
            engine.step()
    torch.cuda.synchronize()
    flats = [f for f in engine.sharding.flats if f is not None]
    assert all(f.full_bytes_alive == 0 for f in flats if not f.resident), name
    ref = reference(init, ckpt, gain, 1, twice=name in TWICE)
    ref64 = reference(init, ckpt, gain, 1, torch.float64, twice=name in TWICE)
    final = {n: t.cpu() for n, t in engine.iter_full_state()}
    assert not torch.equal(final["layers.3.lora_a.weight"], init["layers.3.lora_a.weight"])
    for pname, w in ref.items():
        if pname in frozen:
            assert torch.equal(final[pname], init[pname]), (name, pname)
            continue
        err = (final[pname].double() - ref64[pname]).abs().max().item()
        bound = 3 * (w.double() - ref64[pname]).abs().max().item() + 1e-5
        assert err <= bound, (name, pname, err, bound)


@pytest.mark.parametrize("offload", [False, True])
def test_inference_engine_bf16_cuda(offload):
    device = torch.device("cuda", 0)
    opts = replace(CASES["plain"][0], precision=PrecisionOptions(dtype="bf16"))
    if offload:
        opts = _pinned(replace(opts, zero=replace(opts.zero, offload_param=OffloadOptions(device="cpu"))))
    plain = FrozenNet(seed=0).to(device, torch.bfloat16)
    engine = build_inference_engine(FrozenNet(seed=0), opts, device=device)
    x, _ = micro_batch(0, 0, 1)
    with torch.no_grad():
        got = engine(x.to(device, torch.bfloat16))
        want = plain(x.to(device, torch.bfloat16))
    torch.testing.assert_close(got, want, rtol=0, atol=0)
    flats = [f for f in engine.sharding.flats if f is not None]
    assert all(f.full_bytes_alive == 0 for f in flats if not f.resident)
