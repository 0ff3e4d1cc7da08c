"""bench/engine_tax.py's built-in-GPT pair on the CPU: zl-gpt-z2-bf16 (zerolaunch.initialize) and
zl-train-z2-bf16 (`zerolaunch train` as a subprocess, read back from metrics.jsonl).

Covers: both rows run at a tiny shape, and they train the same thing: the same built-in GPT from the same
init, the same synthetic batches, optimizer, clip and pure-bf16 precision give the same final loss, bit for
bit (a --set flag that did not take would change it). Leaves out: the GPU, its timing, torch.compile.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import pytest
import torch.distributed as dist
from _helpers import load_bench_script

BENCH = Path(__file__).resolve().parents[2] / "bench" / "engine_tax.py"

pytestmark = pytest.mark.e2e


@pytest.fixture
def one_rank_group(tmp_path, monkeypatch):
    """The engine row runs in this process: its one-rank gloo group and torchrun variables stay in the test."""
    for k, v in {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29998", "RANK": "0", "LOCAL_RANK": "0"}.items():
        monkeypatch.setenv(k, v)
    monkeypatch.setenv("WORLD_SIZE", "1")
    dist.init_process_group("gloo", store=dist.FileStore(str(tmp_path / "store"), 1), rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def test_the_train_row_trains_what_the_engine_row_trains(one_rank_group):
    tax = load_bench_script("engine_tax")
    from _row_process import row_result

    args = argparse.Namespace(
        model="gpt",
        size="1.3b",
        tiny=True,
        eager=True,
        seq_len=16,
        micro_batch=2,
        steps=2,
        warmup=1,
        device="cpu",
        timeout=300,
    )
    # the engine row in its own process, as the bench runs it: numerics in this test process depend on what ran
    # before it (thread pools, float32 matmul precision), a fresh zerolaunch train process's do not
    flags = ["--tiny", "--eager", "--device", "cpu", "--seq-len", "16", "--micro-batch", "2"]
    flags += ["--steps", "2", "--warmup", "1"]
    engine_row = row_result([sys.executable, str(BENCH), "--one", "zl-gpt-z2-bf16", *flags], 300)
    train_row = tax.run_train_row("zl-train-z2-bf16", args)
    assert train_row["step_ms"] > 0 and engine_row["step_ms"] > 0
    assert "--cpu 1" in train_row["command"] and train_row["train_rc"] == 0
    assert train_row["final_loss"] == engine_row["final_loss"], (train_row, engine_row)
