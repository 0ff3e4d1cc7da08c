"""Optimizer offload with gradient accumulation: grads summed on the device, copied to the host once a step.

Tests ([Note: device-summed window] in zerolaunch/zero/reduce.py): at accumulation 4, stages 2 and 3 with
the optimizer on the host (and overlap_step, and nvme) train to the weights and norms of one process with
plain torch on the global batch (fp32, world size 1 in this process and 2 gloo ranks in one spawn); each grad
element is copied to the host shard once per optimizer step, not once per micro-step (counted at
placement.to_host, the one device->host grad copy); a boundary the caller sets earlier or later than the
engine expects gives the weights of the same engine without offload. Leaves out: CUDA streams and pinned
copies (bench/offload.py on the device).
"""

from __future__ import annotations

from dataclasses import replace

import _reference
import pytest
import torch
import torch.nn.functional as F
from _spawn import run_ranks
from _zero_models import Net, micro_batch, rank_rows, reference_weights, train_engine

from zerolaunch.zero import Engine, placement
from zerolaunch.zero.optim import shard_optimizer
from zerolaunch.zero.options import EngineOptions, OffloadOptions, OptimizerOptions, ZeroOptions

STEPS = 3
GAS = 4


def _options(stage: int, *, device: str = "cpu", overlap_step: bool = False, nvme_path=None):
    return EngineOptions(
        zero=ZeroOptions(
            stage=stage,
            reduce_bucket_size=100,
            overlap_comm=True,
            stage3_units=("Linear",) if stage == 3 else (),
            offload_optimizer=OffloadOptions(device=device, overlap_step=overlap_step, nvme_path=nvme_path),
        ),
        optimizer=OptimizerOptions(name="adamw", lr=1e-2, weight_decay=0.1),
        gradient_clipping=0.05,
        gradient_accumulation_steps=GAS,
    )


CASES = {
    "stage2": _options(2),
    "stage2_overlap_step": _options(2, overlap_step=True),
    "stage3": _options(3),
}


class CopyCounter:
    """Elements written into host grad shards through placement.to_host, per optimizer step."""

    def __init__(self, monkeypatch=None):
        self.elements = 0
        real = placement.to_host

        def counting(dst, src, **kwargs):
            self.elements += src.numel()
            real(dst, src, **kwargs)

        if monkeypatch is not None:
            monkeypatch.setattr(placement, "to_host", counting)
        else:
            placement.to_host = counting


def _shard_numel(engine) -> int:
    return sum(t.numel() for t in engine.sharding.grad_shards.tensors)


def _train(options, rank: int, world_size: int, counter: CopyCounter) -> dict:
    engine = Engine(Net(seed=rank), options)
    before = counter.elements
    infos = train_engine(engine, rank, world_size, STEPS)
    copied = counter.elements - before
    engine.wait_for_step()
    out = {
        "weights": {n: p.detach().clone() for n, p in engine.module.named_parameters()},
        "norms": [i.grad_norm for i in infos if i.stepped],
        "stepped": [i.stepped for i in infos],
        "copied_per_step": copied / STEPS,
        "shard_numel": _shard_numel(engine),
    }
    engine.close()
    return out


def _cases_on_ranks(rank, world_size, names):
    shard_optimizer.HOST_CHUNK_NUMEL = 7  # chunks end mid-parameter
    counter = CopyCounter()
    return {name: _train(CASES[name], rank, world_size, counter) for name in names}


def _assert_weights(got: dict, options, world_size: int, label: str) -> list[float]:
    """got's weights against one fp32 process with torch's AdamW on the global batch, as close to the fp64
    answer as that process is (_reference.assert_adam_close); returns the reference's grad norms."""
    ref32, ref_norms = reference_weights(options, world_size, STEPS)
    ref64, _ = reference_weights(options, world_size, STEPS, dtype=torch.float64)
    for pname in ref32:
        _reference.assert_adam_close(got["weights"][pname], ref32[pname], ref64[pname], f"{label} {pname}")
    return ref_norms


def _check(results: list[dict], world_size: int) -> None:
    for name, options in CASES.items():
        for rank, res in enumerate(results):
            got = res[name]
            label = f"{name} world {world_size} rank {rank}"
            assert got["stepped"] == ([False] * (GAS - 1) + [True]) * STEPS, label
            ref_norms = _assert_weights(got, options, world_size, label)
            torch.testing.assert_close(torch.tensor(got["norms"]), torch.tensor(ref_norms), rtol=1e-5, atol=0)
            # each element of this rank's grad shard reaches the host once a step, not once a micro-step
            assert got["copied_per_step"] == got["shard_numel"], label


def test_offload_accumulation_matches_adamw_on_the_global_batch(monkeypatch):
    counter = CopyCounter(monkeypatch)
    monkeypatch.setattr(shard_optimizer, "HOST_CHUNK_NUMEL", 7)
    one = {name: _train(CASES[name], 0, 1, counter) for name in CASES}
    _check([one], 1)
    _check(run_ranks(_cases_on_ranks, 2, list(CASES)), 2)


def test_nvme_offload_accumulation_copies_once_a_step(monkeypatch, tmp_path):
    counter = CopyCounter(monkeypatch)
    options = _options(2, device="nvme", nvme_path=str(tmp_path))
    got = _train(options, 0, 1, counter)
    _assert_weights(got, options, 1, "nvme")
    assert got["copied_per_step"] == got["shard_numel"]


def _run_windows(engine, windows: list[list[bool | None]]) -> None:
    """One optimizer step per window; each entry is one micro-step's backward, told window_ends=entry; the
    last micro-step of a window calls step(boundary=True), the others step(boundary=False)."""
    for w, window in enumerate(windows):
        for m, ends in enumerate(window):
            x, y = micro_batch(w, m, 1)
            engine.backward(F.mse_loss(engine(rank_rows(x, 0)), rank_rows(y, 0)), window_ends=ends)
            engine.step(boundary=m == len(window) - 1)


@pytest.mark.parametrize("stage", [2, 3])
def test_boundary_other_than_expected_gives_the_same_weights(monkeypatch, stage):
    counter = CopyCounter(monkeypatch)
    # a counted window; one ended early (its sums are copied at the boundary); one ended late (copied at the
    # backward told it ends the window, and again at the boundary)
    windows = [[None] * GAS, [False, False], [False, True, False, False, False]]
    offloaded = Engine(Net(0), _options(stage))
    options = _options(stage)
    on_device = Engine(
        Net(0), replace(options, zero=replace(options.zero, offload_optimizer=OffloadOptions()))
    )
    _run_windows(offloaded, windows)
    _run_windows(on_device, windows)
    for (name, a), b in zip(on_device.module.named_parameters(), offloaded.module.parameters(), strict=True):
        torch.testing.assert_close(b, a, rtol=1e-6, atol=1e-7, msg=name)
    shard = _shard_numel(offloaded)
    assert counter.elements == (1 + 1 + 2) * shard
