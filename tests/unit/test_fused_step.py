"""zero/optim/fused_step.py's chunk step is torch's Adam / AdamW: several steps of it, eagerly on CPU, against
torch.optim (the for-loop implementation, an independent reference) fed the same grads times the multiplier,
with and without weight decay; the params copy it writes is the master cast; grads are only read.
Leaves out: the compiled kernel under inductor (CUDA: tests/dist/test_zero12_cuda.py); its host reads are
counted under dynamo alone."""

from __future__ import annotations

import pytest
import torch

from zerolaunch.zero.optim.fused_step import adam_chunk, adam_chunk_for, step_scalars

BETAS, EPS, LR = (0.9, 0.95), 1e-8, 3e-3


@pytest.mark.parametrize("decoupled", [True, False], ids=["adamw", "adam"])
@pytest.mark.parametrize("weight_decay", [0.0, 0.1])
@pytest.mark.parametrize("out_dtype", [torch.bfloat16, torch.float32, None])
def test_steps_equal_torch_optim(decoupled, weight_decay, out_dtype):
    gen = torch.Generator().manual_seed(0)
    start = torch.randn(3001, generator=gen) * 0.05
    grads = [torch.randn(3001, generator=gen) * 10.0 ** (-k) for k in range(1, 5)]
    multipliers = [None, torch.tensor(0.25), torch.tensor(3.0), None]

    ref = start.clone().requires_grad_(True)
    kind = torch.optim.AdamW if decoupled else torch.optim.Adam
    opt = kind([ref], lr=LR, betas=BETAS, eps=EPS, weight_decay=weight_decay, foreach=False)
    for g, m in zip(grads, multipliers, strict=True):
        ref.grad = g if m is None else g * m
        opt.step()

    master, exp_avg, exp_avg_sq = start.clone(), torch.zeros(3001), torch.zeros(3001)
    out = None if out_dtype is None else torch.empty(3001, dtype=out_dtype)
    for step, (g, m) in enumerate(zip(grads, multipliers, strict=True), start=1):
        before = g.clone()
        lr, bc1, bc2_sqrt = step_scalars(LR, *BETAS, step, torch.device("cpu"))
        adam_chunk(
            master, g, exp_avg, exp_avg_sq, out, m, lr, bc1, bc2_sqrt, *BETAS, EPS, weight_decay, decoupled
        )
        assert torch.equal(g, before)  # the grad shard is read, never scaled in place

    torch.testing.assert_close(master, ref.detach(), rtol=1e-6, atol=1e-8)
    # moments to fp32 rounding of their own scale: where a moment cancels to ~0 the reference's lerp and the
    # fused kernel's beta1 * m + (1 - beta1) * g round differently
    for mine, theirs in ((exp_avg, opt.state[ref]["exp_avg"]), (exp_avg_sq, opt.state[ref]["exp_avg_sq"])):
        torch.testing.assert_close(mine, theirs, rtol=1e-6, atol=1e-6 * theirs.abs().max().item())
    if out is not None:
        assert torch.equal(out, master.to(out_dtype))


def test_step_scalars_are_the_bias_corrections_of_that_step():
    lr, bc1, bc2_sqrt = step_scalars(1e-3, 0.9, 0.999, 3, torch.device("cpu"))
    assert lr.shape == () and lr.dtype == torch.float32
    assert lr.item() == pytest.approx(1e-3)
    assert bc1.item() == pytest.approx(1 - 0.9**3)
    assert bc2_sqrt.item() == pytest.approx((1 - 0.999**3) ** 0.5)


def test_only_cuda_compiles():
    assert adam_chunk_for(torch.device("cpu")) is adam_chunk


@pytest.mark.parametrize("optimizer, offload", [("sgd", "none"), ("adamw", "cpu")], ids=["sgd", "offloaded"])
def test_the_shard_optimizer_refuses_what_the_fused_step_cannot_do(optimizer, offload):
    from zerolaunch.zero.optim.shard_optimizer import Chunk, ShardOptimizer
    from zerolaunch.zero.options import OffloadOptions, OptimizerOptions

    with pytest.raises(ValueError, match="the fused step is Adam / AdamW over a master on the device"):
        ShardOptimizer(
            OptimizerOptions(name=optimizer),
            OffloadOptions(device=offload),
            [8],
            [0.0],
            [Chunk(0, 0, 8)],
            device=torch.device("cpu"),
            fused_step=True,
        )


def test_the_compiled_chunk_step_reads_nothing_back_to_the_host():
    # betas, eps and weight decay left as dynamo's dynamic floats became graph inputs read with .item() on
    # every call (four host reads per chunk). Dynamo alone (a backend that runs the captured graph)
    # shows the reads; the values must still be torch's.
    from torch.profiler import ProfilerActivity, profile

    from zerolaunch.zero.optim import fused_step

    kernel = fused_step._compiled(backend=lambda gm, inputs: gm.forward)
    gen = torch.Generator().manual_seed(0)
    for numel, weight_decay in [(101, 0.1), (37, 0.0), (64, 0.1)]:
        master, grad = torch.randn(numel, generator=gen), torch.randn(numel, generator=gen)
        want = master.clone()
        states = [torch.zeros(numel) for _ in range(4)]
        scalars = step_scalars(LR, *BETAS, 1, torch.device("cpu"))
        args = (*scalars, *BETAS, EPS, weight_decay, True)
        adam_chunk(want, grad, states[0], states[1], None, None, *args)
        with profile(activities=[ProfilerActivity.CPU]) as prof, fused_step.constants_traced():
            kernel(master, grad, states[2], states[3], None, None, *args)
        assert torch.equal(master, want)
        assert not [e for e in prof.events() if e.name == "aten::_local_scalar_dense"]
