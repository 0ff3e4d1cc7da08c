"""Reporter (zerolaunch.report): metrics.jsonl contents, the per-step output in both modes, bad input.

Leaves out: the tables' layout (test_report_tables.py) and anything distributed (the loop reduces over
ranks before calling the Reporter).
"""

import io
import json
import math
import subprocess
import sys
from pathlib import Path

import pytest
from rich.console import Console

from zerolaunch.report import Reporter, StepMetrics
from zerolaunch.report.metrics import read_metrics, truncate_metrics

H100 = "NVIDIA H100 80GB HBM3"
GLOBAL_BATCH, SEQ_LEN = 8, 128
MEM = dict(params=1000, grads=1000, optimizer=4000, master=4000, buckets=500)


def plain_console() -> tuple[Console, io.StringIO]:
    buf = io.StringIO()
    return Console(file=buf, width=100, force_terminal=False), buf


def make_reporter(tmp_path, console, **overrides) -> Reporter:
    kwargs = dict(
        total_steps=10,
        world_size=2,
        tokens_per_step=GLOBAL_BATCH * SEQ_LEN,
        flops_per_token=1e9,
        device_name=H100,
        dtype="bf16",
        log_every=5,
    )
    kwargs.update(overrides)
    return Reporter(tmp_path, console, **kwargs)


def step(i: int, **overrides) -> StepMetrics:
    values = dict(
        step=i,
        loss=4.0 - 0.1 * i,
        grad_norm=1.0 + i,
        lr=1e-3,
        loss_scale=None,
        skipped=False,
        step_seconds=0.5,
        comm_seconds=0.05,
        comm_bytes=123_456,
        mem_allocated_bytes=None,
        mem_reserved_bytes=None,
    )
    values.update(overrides)
    return StepMetrics(**values)


def test_metrics_jsonl_lines_match_what_was_logged(tmp_path):
    console, _ = plain_console()
    reporter = make_reporter(tmp_path, console)
    logged = [step(i) for i in range(1, 11)]
    for m in logged:
        reporter.log(m)
        # flushed per line: readable before close
        assert len(read_metrics(tmp_path / "metrics.jsonl")) == m.step
    records = read_metrics(tmp_path / "metrics.jsonl")
    assert [r["step"] for r in records] == list(range(1, 11))
    for m, r in zip(logged, records, strict=True):
        assert r["loss"] == m.loss and r["grad_norm"] == m.grad_norm and r["comm_bytes"] == 123_456
        assert r["tokens_seen"] == m.step * GLOBAL_BATCH * SEQ_LEN
        # 1024 tokens in 0.5 s over 2 devices at 1e9 FLOPs/token -> 1.024e12 FLOP/s/device
        assert r["tokens_per_second"] == pytest.approx(2048.0)
        assert r["tokens_per_second_per_device"] == pytest.approx(1024.0)
        assert r["tflops_per_device"] == pytest.approx(1.024)
        assert r["mfu"] == pytest.approx(1.024e12 / 989e12)
    assert reporter.tokens_seen == 10 * GLOBAL_BATCH * SEQ_LEN


def test_nonfinite_values_are_written_as_null_and_parse_strictly(tmp_path):
    console, _ = plain_console()
    reporter = make_reporter(tmp_path, console, dtype="fp16")
    reporter.log(step(1, grad_norm=math.inf, loss_scale=32768.0, skipped=True))
    line = (tmp_path / "metrics.jsonl").read_text().strip()
    record = json.loads(line, parse_constant=lambda c: pytest.fail(f"non-JSON constant {c}"))
    assert record["grad_norm"] is None and record["skipped"] is True and record["loss_scale"] == 32768.0
    assert record["nonfinite"] == ["grad_norm"]
    reporter.log(step(2))
    assert "nonfinite" not in read_metrics(tmp_path / "metrics.jsonl")[1]


def test_plain_output_every_log_every_steps_without_control_characters(tmp_path):
    console, buf = plain_console()
    reporter = make_reporter(tmp_path, console)
    for i in range(1, 11):
        reporter.log(step(i))
    reporter.finish([MEM, MEM], zero_stage=2, params_numel=1000)
    out = buf.getvalue()
    assert "\x1b" not in out and "\r" not in out
    lines = [ln for ln in out.splitlines() if ln.startswith("step ")]
    # first step (it started), every 5th, and the last
    assert [ln.split("  ")[0] for ln in lines] == ["step 1/10", "step 5/10", "step 10/10"]
    assert "loss 3.5000" in lines[1] and "tok/s 2,048" in lines[1] and "MFU 0.1%" in lines[1]
    assert all(len(line) <= 100 for line in lines), lines
    assert "eta 2s" in lines[1]  # 5 steps left x 0.5 s


def test_non_interactive_on_a_terminal_console_still_plain(tmp_path):
    buf = io.StringIO()
    console = Console(file=buf, width=100, force_terminal=True)
    reporter = make_reporter(tmp_path, console, interactive=False)
    reporter.log(step(1, loss=math.nan))
    reporter.finish([MEM], zero_stage=1)
    assert "\x1b" not in buf.getvalue()
    assert "loss nan" in buf.getvalue()


def test_interactive_draws_a_bar_and_prints_lines(tmp_path):
    buf = io.StringIO()
    console = Console(file=buf, width=120, force_terminal=True)
    reporter = make_reporter(tmp_path, console)
    assert reporter.interactive
    for i in range(1, 11):
        reporter.log(step(i))
    reporter.finish([MEM, MEM], zero_stage=3, params_numel=1000)
    out = buf.getvalue()
    assert "\x1b" in out  # live rendering
    assert "10/10" in out and "step 5/10  loss 3.5000" in out
    assert "Throughput" in out


def test_fp16_scale_and_skipped_count_shown(tmp_path):
    console, buf = plain_console()
    reporter = make_reporter(tmp_path, console, dtype="fp16", log_every=1)
    reporter.log(step(1, loss_scale=65536.0, skipped=True, grad_norm=math.inf))
    reporter.log(step(2, loss_scale=32768.0))
    lines = buf.getvalue().splitlines()
    assert "scale 65536" in lines[0] and "skipped 1 (this step)" in lines[0]
    assert "scale 32768" in lines[1] and "skipped 1" in lines[1] and "this step" not in lines[1]
    assert "gnorm inf" in lines[0]


def test_cuda_memory_in_line_with_percent_of_device(tmp_path):
    console, buf = plain_console()
    reporter = make_reporter(tmp_path, console, log_every=1)
    gib = 1024**3
    reporter.log(
        step(1, mem_allocated_bytes=20 * gib, mem_reserved_bytes=30 * gib, mem_device_bytes=80 * gib)
    )
    assert "mem 20.00 GiB (25%)" in buf.getvalue() and "reserved" not in buf.getvalue()


def test_cpu_shows_na_for_mfu_and_memory_absent(tmp_path):
    console, buf = plain_console()
    reporter = make_reporter(tmp_path, console, device_name="cpu", dtype="fp32", log_every=1)
    reporter.log(step(1))
    line = buf.getvalue()
    assert "MFU" not in line and "mem" not in line and "TFLOP/s/dev 1.02" in line


def test_loss_scale_hidden_unless_fp16(tmp_path):
    console, buf = plain_console()
    reporter = make_reporter(tmp_path, console, dtype="bf16", log_every=1)
    reporter.log(step(1, loss_scale=1.0))  # the engine reports a constant 1 outside fp16
    assert "scale" not in buf.getvalue()


def test_resume_appends_fresh_run_overwrites(tmp_path):
    console, _ = plain_console()
    first = make_reporter(tmp_path, console)
    for i in (1, 2, 3):
        first.log(step(i))
    first.close()
    resumed = make_reporter(tmp_path, console, start_step=3)
    resumed.log(step(4))
    resumed.close()
    assert [r["step"] for r in read_metrics(tmp_path / "metrics.jsonl")] == [1, 2, 3, 4]
    fresh = make_reporter(tmp_path, console)
    fresh.log(step(1))
    fresh.close()
    assert [r["step"] for r in read_metrics(tmp_path / "metrics.jsonl")] == [1]


def test_resume_drops_steps_after_the_checkpoint_and_a_torn_line(tmp_path):
    # a crashed attempt logged steps 1-5 and died mid-line in step 6; the restart resumes from step 3
    console, _ = plain_console()
    first = make_reporter(tmp_path, console)
    for i in (1, 2, 3, 4, 5):
        first.log(step(i))
    first.close()
    path = tmp_path / "metrics.jsonl"
    with open(path, "a") as f:
        f.write('{"step": 6, "loss": 1.2')  # torn: no closing brace, no newline
    resumed = make_reporter(tmp_path, console, start_step=3)
    for i in (4, 5, 6):
        resumed.log(step(i))
    resumed.close()
    lines = path.read_text().splitlines()
    records = [json.loads(line) for line in lines]  # every line is valid JSON
    assert [r["step"] for r in records] == [1, 2, 3, 4, 5, 6]  # each step once
    assert path.read_text().endswith("\n")


def test_truncate_metrics_is_a_no_op_on_a_clean_file(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text('{"step": 1}\n{"step": 2}\n')
    inode = path.stat().st_ino
    assert truncate_metrics(path, 2) == 0
    assert path.stat().st_ino == inode
    assert truncate_metrics(path, 1) == 1
    assert path.read_text() == '{"step": 1}\n'
    path.write_text('{"step": 1}\nnot json\n{"step": 2}\n{"step": 3, "lo')
    assert truncate_metrics(path, 10) == 2
    assert [r["step"] for r in read_metrics(path)] == [1, 2]
    assert truncate_metrics(tmp_path / "missing.jsonl", 3) == 0


def test_read_metrics_skips_only_a_torn_last_line(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text('{"step": 1}\n{"step": 2, "lo')
    assert [r["step"] for r in read_metrics(path)] == [1]


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (dict(total_steps=0), "total_steps must be an int >= 1"),
        (dict(world_size=0), "world_size must be an int >= 1"),
        (dict(tokens_per_step=2.5), "tokens_per_step must be an int"),
        (dict(log_every=0), "log_every must be an int >= 1"),
        (dict(start_step=11), "start_step 11 is past total_steps 10"),
        (dict(flops_per_token=-1.0), "flops_per_token must be > 0"),
        (dict(dtype="int4"), "unknown dtype 'int4'"),
    ],
)
def test_bad_constructor_arguments_are_clear_errors(tmp_path, overrides, message):
    console, _ = plain_console()
    with pytest.raises(ValueError, match=message):
        make_reporter(tmp_path, console, **overrides)


def test_unwritable_run_dir_is_a_clear_error(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    console, _ = plain_console()
    with pytest.raises(ValueError, match="cannot write metrics to .*pick a writable run dir"):
        make_reporter(blocker / "run", console)


def test_logging_a_tensor_like_value_names_the_field(tmp_path):
    console, _ = plain_console()
    reporter = make_reporter(tmp_path, console)

    class FakeTensor:
        pass

    with pytest.raises(TypeError, match=r"StepMetrics.loss must be a Python number.*\.item\(\)"):
        reporter.log(step(1, loss=FakeTensor()))
    with pytest.raises(TypeError, match="takes a StepMetrics"):
        reporter.log({"step": 1})


def test_with_block_closes_the_metrics_file(tmp_path):
    console, _ = plain_console()
    with make_reporter(tmp_path, console) as reporter:
        reporter.log(step(1))
    assert reporter.metrics_file._file.closed
    assert len(read_metrics(tmp_path / "metrics.jsonl")) == 1


def test_importing_report_does_not_import_torch():
    # The CLI imports report/ for its tables; torch at import time would cost seconds on every command.
    code = "import sys, zerolaunch.report; print('torch' in sys.modules)"
    repo_root = Path(__file__).resolve().parents[2]
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True, cwd=repo_root
    )
    assert result.stdout.strip() == "False"


def test_a_plain_recording_console_is_used_as_given(tmp_path):
    console = Console(file=io.StringIO(), width=100, force_terminal=False, record=True)
    reporter = make_reporter(tmp_path, console, log_every=1)
    assert reporter.console is console
    reporter.log(step(1))
    assert "step 1/10" in console.export_text()
