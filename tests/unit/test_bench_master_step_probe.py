"""bench/master_step_probe.py's fused kernel computes torch's AdamW: its "fused" rows (bench/RESULTS.md) are only a
lever if they keep the numerics. Checked on CPU, eagerly, against torch.optim.AdamW over fp32 params fed the
clipped, upcast bf16 grads; plus the script's answer where no GPU is visible. Leaves out: the timing and the
compiled kernel (CUDA)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch
from _helpers import load_bench_script

SCRIPT = Path(__file__).resolve().parents[2] / "bench" / "master_step_probe.py"


@pytest.fixture(scope="module")
def probe():
    return load_bench_script("master_step_probe")


@pytest.mark.parametrize("steps", [1, 3])
def test_fused_kernel_matches_torch_adamw_with_the_bf16_copy(probe, steps):
    gen = torch.Generator().manual_seed(1)
    start = torch.randn(4096, generator=gen) * 0.02
    grads = [(torch.randn(4096, generator=gen) * 1e-2).to(torch.bfloat16) for _ in range(steps)]

    # reference: torch's AdamW (for-loop kernel), grads clipped to norm CLIP as clip_grad_norm_ scales them
    ref = start.clone().requires_grad_(True)
    opt = torch.optim.AdamW(
        [ref],
        lr=probe.LR,
        betas=(probe.BETA1, probe.BETA2),
        eps=probe.EPS,
        weight_decay=probe.WD,
        foreach=False,
    )
    for g in grads:
        ref.grad = g.float()
        torch.nn.utils.clip_grad_norm_([ref], probe.CLIP)
        opt.step()

    master, m, v = start.clone(), torch.zeros(4096), torch.zeros(4096)
    param16 = torch.empty(4096, dtype=torch.bfloat16)
    for step, g in enumerate(grads, start=1):
        bc1 = torch.tensor(1 - probe.BETA1**step)
        bc2 = torch.tensor(1 - probe.BETA2**step)
        probe.fused(master, g, m, v, param16, probe._adamw_into, bc1, bc2)

    torch.testing.assert_close(master, ref.detach(), rtol=1e-6, atol=1e-7)
    assert torch.equal(param16, master.to(torch.bfloat16))


def test_without_a_gpu_it_says_so_in_one_line():
    if torch.cuda.is_available():
        pytest.skip("a GPU is visible: the script would measure")
    proc = subprocess.run([sys.executable, str(SCRIPT)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1
    assert proc.stderr.strip() == "master_step_probe.py measures CUDA kernels; no GPU is visible here"
