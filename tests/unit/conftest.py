"""Fixtures of the tests of bench/run.py (test_bench_hf.py, test_bench_gpt_rows.py)."""

from __future__ import annotations

import pytest
import torch.distributed as dist
from _helpers import load_bench_script


@pytest.fixture(scope="module")
def bench():
    """bench/run.py as a module."""
    return load_bench_script("run")


@pytest.fixture
def group(tmp_path, monkeypatch):
    """A one-rank gloo group for bench.build_step; the bench's single-rank group setup reads (and set-defaults)
    the torchrun variables: kept local to the test."""
    for k, v in {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29999", "RANK": "0", "LOCAL_RANK": "0"}.items():
        monkeypatch.setenv(k, v)
    monkeypatch.setenv("WORLD_SIZE", "1")
    dist.init_process_group("gloo", store=dist.FileStore(str(tmp_path / "store"), 1), rank=0, world_size=1)
    yield
    dist.destroy_process_group()
