"""bench/longseq.py on the CPU.

Covers: the search (throughput lengths, doubling, bisection, a failed probe ending its process and the next probe
starting a new one, lengths past a failure never tried) against a fake launcher that fails above a length; the
real driver at the tiny shapes (gpt-tiny with packed documents, llama-tiny; zl and fsdp2 rows, each its own
process) writing its JSON with finite losses. Leaves out: the ds row (DeepSpeed), CUDA memory and timing.
"""

from __future__ import annotations

import argparse
import json
import math
import subprocess
import sys
from pathlib import Path

import pytest
from _helpers import load_bench_script

pytest.importorskip("peft")
pytest.importorskip("transformers")

BENCH = Path(__file__).resolve().parents[2] / "bench" / "longseq.py"


@pytest.fixture(scope="module")
def longseq():
    return load_bench_script("longseq")


def _args(**kw):
    base = dict(seqs=[8, 16], max_seq=256, steps=2, bisect=3, granule=4, row_budget=60.0)
    return argparse.Namespace(**{**base, **kw})


@pytest.mark.parametrize(
    ("limit", "longest", "failed"), [(100, 96, 104), (12, 12, 16), (4, 4, 8), (1000, 256, None)]
)
def test_search_finds_the_longest_length(longseq, monkeypatch, limit, longest, failed):
    launches = []

    def fake_launch(model, row, probes, args, deadline):
        launches.append([s for s, _ in probes])
        out = []
        for seq, steps in probes:
            if seq > limit:
                out.append({"seq": seq, "error": "CUDA out of memory"})
                break  # the process exits at its first failure
            out.append({"seq": seq, "step_ms": 1.0, "tok_s": seq * 1e3, "steps": steps})
        return out

    monkeypatch.setattr(longseq, "_launch", fake_launch)
    result = longseq.search_row("gpt-tiny", "zl", _args())
    assert result["longest_ok"] == longest and result["first_failed"] == failed
    assert launches[0] == [8, 16, 32, 64, 128, 256]  # timed lengths, then doubling, in one process
    # 3 bisection probes between 64 and 128 at a limit of 100: 96 runs, 112 and 104 fail
    assert len(launches) == (1 if failed is None else 1 + (3 if limit == 100 else 1))
    # every launch after the first is one bisection length, between the last success and the failure
    doubling_failure = next((s for s in launches[0] if s > limit), None)
    for plan in launches[1:]:
        assert len(plan) == 1 and plan[0] < doubling_failure


def test_driver_runs_tiny_rows(tmp_path):
    out = tmp_path / "out"
    cmd = [sys.executable, str(BENCH), "--tiny", "--device", "cpu", "--rows", "zl,fsdp2", "--doc-len", "24"]
    cmd += ["--max-seq", "64", "--out", str(out), "--row-budget", "60"]
    root = str(BENCH.parents[1])
    p = subprocess.run(
        cmd,
        capture_output=True,
        text=True,
        timeout=600,
        env={"PYTHONPATH": root, "OMP_NUM_THREADS": "1", "PATH": "/usr/bin:/bin"},
        cwd=root,
    )
    assert p.returncode == 0, p.stderr[-3000:]
    for model in ("gpt-tiny", "llama-tiny"):
        rows = json.loads((out / f"longseq-{model}-doc.json").read_text())
        assert [r["row"] for r in rows] == ["zl", "fsdp2"]
        for r in rows:
            assert r["longest_ok"] == 64 and r["capped"], r
            assert [p["seq"] for p in r["probes"]] == [32, 64]
            assert all(math.isfinite(p["loss"]) and p["tok_s"] > 0 for p in r["probes"]), r
    assert "longest" in p.stdout.splitlines()[-1]
