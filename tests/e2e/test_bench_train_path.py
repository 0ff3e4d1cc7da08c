"""bench/run.py's zl-train rows (run_train_path: `zerolaunch train` as a subprocess, read back from
metrics.jsonl) on the CPU, so a device call cannot end on a typo in the row's --set flags.

Covers: the compiled row with the fused step turned off (-unfused: train.compile, compile_scope model,
compile_optimizer false, as the resolved recipe records them), the metrics it reads back, and the compile line.
Leaves out: the GPU, its timing, inductor (aot_eager here: inductor needs a C++ toolchain and minutes on this CPU).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from _helpers import load_bench_script

pytestmark = pytest.mark.e2e


def test_the_unfused_compiled_row_runs_the_user_path_with_its_flags():
    bench = load_bench_script("run")
    row = bench.run_train_path(
        "zl-train-compile-model-unfused",
        "350m",  # the recipe it runs; shrunk to the tiny GPT below
        steps=2,
        warmup=1,
        seq_len=16,
        micro_batch=2,
        workers=("--cpu", "1"),
        extra_sets=("model.args.size=tiny", "train.precision=fp32", "train.compile_backend=aot_eager"),
    )
    assert row["train_rc"] == 0
    assert len(row["step_ms_all"]) == 2 and row["step_ms"] > 0
    assert row["compile_line"].startswith("train.compile: the whole forward compiled (aot_eager)")
    resolved = json.loads((Path(row["run_dir"]) / "recipe.resolved.json").read_text())
    shutil.rmtree(row["run_dir"])
    train = resolved["train"]
    assert (train["compile"], train["compile_scope"], train["compile_optimizer"]) == (True, "model", False)
