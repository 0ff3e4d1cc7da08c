"""bench/_row_process.py's row_result: each benchmarked configuration runs in its own process, and the driver
(run.py, step_profile.py, engine_tax.py, lora.py) takes its `RESULT {json}` line, or records why there is none and
goes on with the next row.

Covers: a result, a process that fails (the error carries its last lines), one that prints no RESULT line, one
that outlives its timeout (the driver must not die with it: a device call cut short keeps the rows before), one
killed by a signal (SIGKILL is how the OOM killer ends a row: the error says so); run.py's --one arguments.
Leaves out: the configurations themselves (CUDA; test_bench_hf.py builds the HF ones on the CPU).
"""

from __future__ import annotations

import sys

import pytest
from _helpers import load_bench_script


@pytest.fixture(scope="module")
def run():
    return load_bench_script("run")


@pytest.fixture(scope="module")
def rows():
    return load_bench_script("_row_process")


def _python(code: str) -> list[str]:
    return [sys.executable, "-c", code]


def test_the_result_line_is_the_row(rows):
    row = rows.row_result(_python('print("warming up"); print(\'RESULT {"step_ms": 12.5}\')'), timeout=60)
    assert row == {"step_ms": 12.5}


def test_a_failed_process_is_an_error_with_its_last_lines(rows):
    with pytest.raises(RuntimeError, match="ValueError: no GPU here"):
        rows.row_result(_python('raise ValueError("no GPU here")'), timeout=60)


def test_no_result_line_is_an_error(rows):
    with pytest.raises(RuntimeError, match="all done"):
        rows.row_result(_python('print("all done")'), timeout=60)


def test_a_process_past_its_timeout_is_an_error_not_the_end_of_the_driver(rows):
    with pytest.raises(RuntimeError, match="timed out after 1 s"):
        rows.row_result(_python("import time; time.sleep(30)"), timeout=1)


def test_a_process_killed_by_a_signal_says_which(rows):
    with pytest.raises(RuntimeError, match="killed by signal 9"):
        rows.row_result(
            _python("import os, signal; print('loading'); os.kill(os.getpid(), signal.SIGKILL)"), 60
        )


def test_one_args_carry_the_shared_settings(run):
    class Args:
        steps, warmup, seq_len, micro_batch = 10, 3, 2048, 8

    assert run.one_args("zl-z2", "1.3b", Args) == [
        "--one", "zl-z2", "--size", "1.3b", "--steps", "10", "--warmup", "3",
        "--seq-len", "2048", "--micro-batch", "8",
    ]  # fmt: skip
