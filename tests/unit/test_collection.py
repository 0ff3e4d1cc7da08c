"""pytest must collect every test folder: its default norecursedirs held "dist", and tests/dist (the ZeRO
parity tests) went unrun for a long time without anyone seeing it. This runs the collection as CI does and
fails when any folder under tests/ that holds test_*.py files contributes no collected test."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
TESTS = REPO / "tests"


def _folders_with_tests() -> set[str]:
    found = set()
    for path in TESTS.rglob("test_*.py"):
        if "__pycache__" not in path.parts:
            found.add(path.parent.relative_to(REPO).as_posix())
    return found


def test_every_test_folder_is_collected():
    env = dict(os.environ, PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider", "tests"],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    collected = {
        line.split("::", 1)[0].rsplit("/", 1)[0] for line in proc.stdout.splitlines() if "::" in line
    }
    expected = _folders_with_tests()
    # the walk itself must see the known folders, or the check below would pass on an empty set.
    assert {"tests/unit", "tests/dist", "tests/e2e", "tests/hf"} <= expected
    missing = sorted(expected - collected)
    assert not missing, f"pytest collected no test from {missing}: check norecursedirs in pyproject.toml"


def test_ci_has_the_peers_the_parity_tests_compare_against():
    # the DeepSpeed, transformers and Trainer (tests/hf: accelerate, datasets, trl, peft) side-by-side tests skip
    # where their peer is not installed; in CI a skip would hide that they never ran, so CI (CI=true, as
    # .ci/run's callers set it) must have them all
    import importlib.util

    import pytest

    if os.environ.get("CI", "").lower() not in ("1", "true", "yes"):
        pytest.skip("not CI: the parity peers are optional here (pip install -e '.[hf,parity]')")
    peers = ("deepspeed", "transformers", "accelerate", "datasets", "trl", "peft")
    missing = [name for name in peers if importlib.util.find_spec(name) is None]
    assert not missing, f"CI lacks {missing}: `make install` installs the hf and parity extras"
