"""`make test` is the README's and CI's test command, run in a fresh environment that holds none of CI's
variables: what the suite needs must be in the Makefile itself. Read with `make -n` (prints the commands, runs
none)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def _pytest_command() -> str:
    if shutil.which("make") is None:
        pytest.skip("make is not installed")
    proc = subprocess.run(
        ["make", "-n", "test", f"PY={sys.executable}"], cwd=REPO, capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 0, proc.stderr
    lines = [line for line in proc.stdout.splitlines() if "-m pytest" in line]
    assert len(lines) == 1, proc.stdout
    return lines[0]


def test_make_test_runs_every_test_single_threaded():
    words = _pytest_command().split()
    # bit-for-bit logits compares in tests/e2e need one thread per process, as the spawned ranks use
    assert "OMP_NUM_THREADS=1" in words
    # one failure must not hide the rest of the suite
    assert "-x" not in words and "--exitfirst" not in words
    assert words[-1] == "tests"


def test_ci_runs_make_test_in_a_fresh_venv():
    script = (REPO / ".ci" / "run").read_text()
    commands = [
        line.strip() for line in script.splitlines() if line.strip() and not line.lstrip().startswith("#")
    ]
    assert any(c.startswith("python3 -m venv ") for c in commands), script
    assert any(c.startswith("make test PY=") and "/bin/python" in c for c in commands), script
    # the Makefile, not CI, sets what the tests need; CI=true is only for the peers check
    exported = [c for c in commands if c.startswith("export ")]
    assert exported == ["export CI=true"], exported
