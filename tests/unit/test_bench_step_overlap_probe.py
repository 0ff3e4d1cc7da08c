"""bench/step_overlap_probe.py: the side stream gets every step chunk exactly once, in order, spread over the
matmuls; the script runs end to end on the CPU and prints its table. Leaves out: the timing itself (CUDA
streams, on the GPU machine)."""

from __future__ import annotations

import pytest
from _helpers import load_bench_script


@pytest.fixture(scope="module")
def probe():
    return load_bench_script("step_overlap_probe")


@pytest.mark.parametrize("n_ops, n_chunks", [(96, 40), (8, 40), (40, 40), (5, 1), (3, 0)])
def test_every_chunk_once_in_order(probe, n_ops, n_chunks):
    plan = probe.interleave(n_ops, n_chunks)
    assert len(plan) == n_ops + 1
    assert [c for before in plan for c in before] == list(range(n_chunks))
    if n_chunks <= n_ops:  # fewer chunks than matmuls: none left for after them, at most one per matmul
        assert plan[-1] == [] and all(len(b) <= 1 for b in plan)


def test_runs_on_the_cpu(probe, capsys):
    r = probe.main(["--cpu", "--numel", "1e4", "--chunks", "3", "--layers", "1", "--tokens", "8"])
    assert r["matmuls"] > 0 and r["step"] > 0 and r["both"] > 0
    out = capsys.readouterr().out
    assert "step hidden" in out and "AdamW over 1e+04 fp32 elements in 3 chunks" in out
