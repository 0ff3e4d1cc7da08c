"""estimate-memory --measure's offload cost: the per-row step seconds come from the measured bandwidths
(injected here), the table shows them, and the bandwidth probe returns positive numbers on this machine.
Leaves out: CUDA (the probe's pinned-copy branch runs only on the GPU host)."""

from __future__ import annotations

import io

import pytest
from _estimate_setup import bf16_setup
from rich.console import Console

from zerolaunch.cli.estimate import offload_costs, render_offload_cost
from zerolaunch.memory import estimate, synthetic_gpt
from zerolaunch.memory.offload_cost import Bandwidths, measure_bandwidths

NUMEL = 1_300_000_000
GB = 1e9


def _est():
    return estimate(
        synthetic_gpt(NUMEL), bf16_setup(gpus_per_node=8, gpu_memory_bytes=80 * 2**30, dtype="bf16")
    )


def _expected(row, numel, bw):
    """Written from the module's stated byte counts, bf16 (2 bytes), 8 ranks."""
    shard = numel / 8
    t = 4 * shard / bw.d2h + 2 * shard / bw.h2d
    if "params" in row.offload:
        t += 2 * 2 * shard / bw.h2d
    if row.offload.endswith("nvme"):
        param_swap = 2 * shard if "params" in row.offload else 0
        state = row.nvme_bytes - param_swap
        t += state / bw.disk_read + state / bw.disk_write + 2 * param_swap / bw.disk_read
    return t


def test_costs_are_bytes_over_the_injected_bandwidths():
    est = _est()
    bw = Bandwidths(h2d=20 * GB, d2h=10 * GB, disk_read=4 * GB, disk_write=2 * GB)
    costs = offload_costs(est, bw)
    assert {r.offload for r, _ in costs} == {
        "optimizer-cpu",
        "optimizer+params-cpu",
        "optimizer-nvme",
        "optimizer+params-nvme",
    }
    for row, cost in costs:
        assert cost == pytest.approx(_expected(row, est.numel, bw), rel=1e-12), row.label
    # halving every bandwidth doubles every cost: the numbers come from the measurement, nothing else
    slow = Bandwidths(h2d=10 * GB, d2h=5 * GB, disk_read=2 * GB, disk_write=1 * GB)
    for (row, fast), (_, slow_cost) in zip(costs, offload_costs(est, slow), strict=True):
        assert slow_cost == pytest.approx(2 * fast, rel=1e-12), row.label


def test_a_frozen_base_moves_only_with_offloaded_params():
    # LoRA: the frozen base has no grad or master to move; with offload_param its shard is copied to the
    # device for every gather (forward and backward), and read from the swap file under nvme.
    from zerolaunch.memory.lora import with_lora

    shape = with_lora(synthetic_gpt(NUMEL), 8)
    est = estimate(shape, bf16_setup(gpus_per_node=8, gpu_memory_bytes=80 * 2**30, dtype="bf16"))
    bw = Bandwidths(h2d=20 * GB, d2h=10 * GB, disk_read=4 * GB, disk_write=2 * GB)
    frozen_shard = shape.frozen_numel / 8
    for row, cost in offload_costs(est, bw):
        trainable_only = _expected(row, est.numel, bw)
        if "params" not in row.offload:
            assert cost == pytest.approx(trainable_only, rel=1e-12), row.label
            continue
        extra = 2 * 2 * frozen_shard / bw.h2d  # bf16, gathered twice per step
        if row.offload.endswith("nvme"):
            # the frozen shard is in the param swap file, read twice, not in the state files
            extra += 2 * 2 * frozen_shard / bw.disk_read
            extra += -2 * frozen_shard / bw.disk_read - 2 * frozen_shard / bw.disk_write
        assert cost == pytest.approx(trainable_only + extra, rel=1e-9), row.label


def test_table_shows_the_column_and_nvme_rows_without_a_disk_number():
    est = _est()
    bw = Bandwidths(h2d=20 * GB, d2h=10 * GB, notes=["injected"])
    buf = io.StringIO()
    Console(file=buf, width=200).print(render_offload_cost(est, bw))
    text = " ".join(buf.getvalue().split())  # the title wraps to the table width
    assert "offload s/step" in text and "h2d 20.0 GB/s" in text and "injected" in text
    cpu = next(c for r, c in offload_costs(est, bw) if r.offload == "optimizer-cpu")
    assert f"{cpu:.3f}" in text
    assert "no --nvme-path" in text  # nvme rows need a disk measurement


def test_a_setup_without_offload_rows_says_so():
    # a bf16 master is never offloaded ([Note: bf16 master]): the table has no row and says why
    est = estimate(synthetic_gpt(NUMEL), bf16_setup(gpus_per_node=1, dtype="bf16", master_dtype="bf16"))
    bw = Bandwidths(h2d=20 * GB, d2h=10 * GB)
    assert offload_costs(est, bw) == []
    buf = io.StringIO()
    Console(file=buf, width=200).print(render_offload_cost(est, bw))
    assert "no offload row for this setup" in buf.getvalue()


def test_probe_measures_memcpy_and_a_disk_path_here(tmp_path):
    bw = measure_bandwidths(str(tmp_path), nbytes=4 * 2**20)
    assert bw.h2d > 0 and bw.d2h > 0 and bw.disk_read > 0 and bw.disk_write > 0
    assert any("nvme" in n for n in bw.notes)
    assert not list(tmp_path.iterdir())  # the probe file is removed


def test_cli_measure_prints_the_offload_cost_from_the_probe(monkeypatch, tmp_path):
    import json

    from typer.testing import CliRunner

    from zerolaunch.cli.app import app
    from zerolaunch.memory import offload_cost
    from zerolaunch.train import measure_memory as measure

    monkeypatch.setattr(measure, "measure_recipe", lambda *a, **k: None)  # the real-steps part: not here
    seen = []

    def probe(path):
        seen.append(path)
        return Bandwidths(h2d=20 * GB, d2h=10 * GB, disk_read=4 * GB, disk_write=2 * GB, notes=["injected"])

    monkeypatch.setattr(offload_cost, "measure_bandwidths", probe)
    args = ["estimate-memory", "recipes/tiny-gpt.yaml", "--measure", "--nvme-path", str(tmp_path)]
    result = CliRunner().invoke(app, [*args, "--json"])
    assert result.exit_code == 0, result.output
    out = json.loads(result.output)
    assert seen == [str(tmp_path)] and out["bandwidths"]["h2d_bytes_per_s"] == 20 * GB
    assert out["offload_step_seconds"]["stage 2 + optimizer-cpu"] > 0
    text = " ".join(CliRunner().invoke(app, args).output.split())
    assert "offload s/step" in text and "injected" in text
