"""Fixtures of the tests of bench/run.py (test_bench_hf.py, test_bench_gpt_rows.py)."""

from __future__ import annotations

import pytest
from _helpers import load_bench_script


@pytest.fixture(scope="module")
def bench():
    """bench/run.py as a module."""
    return load_bench_script("run")
