"""bench/offload.py on the CPU at its tiny GPT shape, world size 1 (gloo).

Covers: the zl-z2-off and zl-z3-off rows train one warm-up and one timed step of the global batch as micro
batch x accumulation (finite losses, the row's token count, TFLOP/s from 6 x params x tokens, a host peak);
the table prints a failed row's error beside the others. Leaves out: the peers' rows (FSDP2's and DeepSpeed's
offload, run on the device), CUDA timing and peaks, the driver's subprocesses and budget.
"""

from __future__ import annotations

import argparse
import math

import pytest
from _helpers import load_bench_script


@pytest.fixture(scope="module")
def offload():
    return load_bench_script("offload")


@pytest.fixture(scope="module")
def group(tmp_path_factory):
    import torch.distributed as dist

    store = tmp_path_factory.mktemp("store") / "store"
    dist.init_process_group("gloo", store=dist.FileStore(str(store), 1), rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def _args(**kw) -> argparse.Namespace:
    base = dict(
        size="tiny",
        seq_len=16,
        global_batch=4,
        micro_batch=2,
        ckpt=True,
        steps=1,
        warmup=1,
        matmul_tflops=795.0,
        device="cpu",
    )
    return argparse.Namespace(**{**base, **kw})


@pytest.mark.parametrize("row", ["zl-z2-off", "zl-z3-off"])
def test_row_trains_the_global_batch(offload, group, row):
    r = offload.run_row(row, _args())
    assert r["gradient_accumulation_steps"] == 2
    assert r["tokens_per_step"] == 4 * 16
    assert len(r["losses"]) == 2 and all(math.isfinite(x) for x in r["losses"])
    assert r["tflops"] == pytest.approx(6 * r["n_params"] * 64 / (r["step_ms"] / 1e3) / 1e12)
    assert r["pct_of_matmul"] == pytest.approx(100 * r["tflops"] / 795.0)
    assert r["peak_host_hwm_gib"] > 0


def test_table_records_a_failed_row(offload):
    ok = {
        "row": "zl-z2-off",
        "step_ms": 7000.0,
        "tflops": 380.0,
        "pct_of_matmul": 47.8,
        "peak_gpu_gib": 50.0,
        "peak_host_hwm_gib": 110.0,
        "losses": [10.9],
    }
    text = offload.table([ok, {"row": "ds-z2-off", "error": "killed by signal 9 (host memory?)"}])
    assert "7000.0" in text and "47.8" in text
    assert "ds-z2-off" in text and "killed by signal 9" in text


def test_micro_batch_must_divide_the_global_batch(offload):
    with pytest.raises(SystemExit, match="multiple"):
        offload.accumulation(_args(global_batch=5, micro_batch=2))
