"""bench/hf_trainer.py's smoke mode: `--tiny --cpu` runs the Trainer + zerolaunch row and the bare-engine row
(each in its own process, world size 1) and prints the table with the Trainer's overhead line.

Covers: the rows' processes start, train the same model on the same batches (their mean losses agree: the
same engine options under the Trainer and by hand) and report; the table's columns. Leaves out: the DeepSpeed
and FSDP2 rows and every timing (the GPU run), the 1B shape.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("transformers", minversion="5.17")  # the Trainer hooks zerolaunch.hf replaces

ROOT = Path(__file__).resolve().parents[2]


def test_tiny_cpu_table():
    cmd = [
        sys.executable,
        str(ROOT / "bench" / "hf_trainer.py"),
        "--tiny",
        "--cpu",
        "--rows",
        "trainer-zl,bare-zl",
        "--stages",
        "3",
        "--steps",
        "2",
        "--warmup",
        "1",
        "--batch",
        "2",
        "--seq",
        "16",
    ]
    proc = subprocess.run(
        cmd,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"},
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    rows = {}
    for line in proc.stdout.splitlines():
        m = re.match(r"\s*3\s+(trainer-zl|bare-zl)\s+([\d.]+)\s+-\s+([\d.]+)$", line)
        if m:
            rows[m.group(1)] = (float(m.group(2)), float(m.group(3)))
    assert set(rows) == {"trainer-zl", "bare-zl"}, proc.stdout
    assert rows["trainer-zl"][1] == pytest.approx(rows["bare-zl"][1], rel=1e-3)
    assert "Trainer overhead over the bare engine" in proc.stdout
