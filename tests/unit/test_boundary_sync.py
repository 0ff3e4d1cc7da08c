"""[Note: boundary sync] (zerolaunch/zero/sharding.py): at an accumulation boundary the host waits for the device
only when it reads grads the device wrote (optimizer offload while training on an accelerator). With the shards
on the device the norm check's read waits for the stream anyway, and an earlier wait would idle the GPU while
the host launches the norm's kernels (bench/RESULTS.md 2026-12-05, call D).

Covers: plan.host_waits_at_boundary's table; that the strategies consult it at each boundary (stages 0-3,
no offload, cpu and nvme offload) and wait exactly when it says so; and that a step on the device reads a
tensor to the host once (the skip decision and the reported norm together, before the step's kernels: a read
after them would wait for the whole step). Leaves out: the GPU timeline itself (bench/step_profile.py).
"""

from __future__ import annotations

import pytest
import torch

from zerolaunch.zero import Engine, placement, plan
from zerolaunch.zero.options import EngineOptions, OffloadOptions, PrecisionOptions, ZeroOptions


@pytest.mark.parametrize(
    ("device", "grads", "waits"),
    [("cuda", "cpu", True), ("cuda", "cuda", False), ("cpu", "cpu", False), ("xpu", "cpu", True)],
)
def test_the_host_waits_only_for_grads_an_accelerator_wrote_to_the_host(device, grads, waits):
    assert plan.host_waits_at_boundary(device, grads) is waits


STAGE_OFFLOAD = [(0, "none")] + [(stage, off) for stage in (1, 2, 3) for off in ("none", "cpu", "nvme")]
"""Stage 0 has no optimizer offload."""


@pytest.mark.parametrize("says", [True, False])
@pytest.mark.parametrize(("stage", "offload"), STAGE_OFFLOAD)
def test_each_boundary_asks_the_rule_with_where_the_grads_live(stage, offload, says, tmp_path, monkeypatch):
    zero = ZeroOptions(
        stage=stage,
        offload_optimizer=OffloadOptions(
            device=offload, nvme_path=str(tmp_path) if offload == "nvme" else None
        ),
    )
    engine = Engine(_model(), EngineOptions(zero=zero))
    asked, waits = [], []
    monkeypatch.setattr(plan, "host_waits_at_boundary", lambda *types: asked.append(types) or says)
    monkeypatch.setattr(placement, "sync", lambda device: waits.append(device))
    for _ in range(2):
        engine.backward(engine(torch.randn(4, 5)).square().mean())
        assert engine.step().stepped
    engine.close()
    assert (
        asked == [("cpu", "cpu")] * 2
    )  # the grad shards' device: the host with offload, here the CPU anyway
    assert waits == ([engine.device] * 2 if says else [])


@pytest.mark.parametrize("dtype", ["fp32", "bf16", "fp16"])
@pytest.mark.parametrize("stage", [0, 1, 2, 3])
def test_a_device_step_reads_the_device_once(stage, dtype, monkeypatch):
    options = EngineOptions(
        zero=ZeroOptions(stage=stage), precision=PrecisionOptions(dtype=dtype), gradient_clipping=1.0
    )
    engine = Engine(_model(), options)
    engine.backward(engine(torch.randn(4, 5).to(engine.dtype)).float().square().mean())
    reads = []
    for name in ("tolist", "item", "__bool__", "__float__", "__int__"):
        read = getattr(torch.Tensor, name)
        monkeypatch.setattr(
            torch.Tensor,
            name,
            lambda self, *a, _read=read, _name=name: reads.append(_name) or _read(self, *a),
        )
    info = engine.step()
    monkeypatch.undo()
    assert info.stepped and info.grad_norm > 0
    assert reads == ["tolist"]


def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(5, 7), torch.nn.Tanh(), torch.nn.Linear(7, 3))
