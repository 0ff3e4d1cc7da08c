"""bench/run.py --summary: one table over the --json-out files of one device call, each row's step time as a ratio
to the fastest peer of its size anywhere in the call (offload rows to the fastest offload peer).

Covers: rows from two files compared against one best peer, offload rows against offload peers, a size with no
peer, a failed row, MFU against the call's highest matmul rate, and the command line reading the files.
Leaves out: the measurements themselves (CUDA; bench/run.py on the device).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from _helpers import load_bench_script

RUN = Path(__file__).resolve().parents[2] / "bench" / "run.py"


def _row(engine: str, step_ms: float, size: str = "1.3b", peak: float = 10.0) -> dict:
    # 16384 tokens a step at 10 GFLOP a token: 163.84 TFLOP a step
    return {
        "engine": engine,
        "size": size,
        "step_ms": step_ms,
        "peak_gib": peak,
        "tokens_per_step": 16384,
        "flops_per_token": 10e9,
    }


CALL = [
    {
        "matmul_tflops": 700.0,
        "rows": [_row("torch-compile", 250.0), _row("zl-z2-compile-model-fused", 275.0)],
    },
    {
        "matmul_tflops": 800.0,
        "rows": [
            _row("torch", 300.0),
            _row("ds-z2-off", 1000.0),
            _row("zl-z2-off", 750.0),
            _row("zl-z3", 40.0, size="350m"),
            {"engine": "fsdp2", "size": "1.3b", "error": "timed out after 130 s"},
        ],
    },
]


@pytest.fixture(scope="module")
def table():
    lines = load_bench_script("run").summary_table(CALL).splitlines()
    return {ln.split()[1]: ln for ln in lines[2:]}, lines


def test_ratios_are_against_the_fastest_peer_of_the_call(table):
    rows, _ = table
    # the peer of the first file (250 ms) beats the second file's plain torch (300 ms)
    assert rows["zl-z2-compile-model-fused"].split()[-2:] == ["1.100x", "torch-compile"]
    assert rows["torch"].split()[-2:] == ["1.200x", "torch-compile"]


def test_offload_rows_compare_with_offload_peers(table):
    rows, _ = table
    assert rows["zl-z2-off"].split()[-2:] == ["0.750x", "ds-z2-off"]


def test_a_size_without_peers_and_a_failed_row(table):
    rows, _ = table
    assert rows["zl-z3"].split()[-2:] == ["-", "-"]
    assert "FAILED: timed out after 130 s" in rows["fsdp2"]


def test_mfu_is_against_the_highest_rate_of_the_call(table):
    rows, lines = table
    assert "800 TFLOP/s" in lines[0]
    # 163.84 TFLOP in 0.25 s = 655.4 TFLOP/s = 81.9% of 800
    assert rows["torch-compile"].split()[3] == "81.9"


def test_the_command_line_reads_the_files(tmp_path):
    paths = []
    for i, call in enumerate(CALL):
        paths.append(tmp_path / f"{i}.json")
        paths[-1].write_text(json.dumps(call))
    out = subprocess.run(
        [sys.executable, str(RUN), "--summary", *map(str, paths)], capture_output=True, text=True, check=True
    ).stdout
    assert "zl-z2-off" in out and "0.750x" in out and "torch-compile" in out
