"""The launcher-side bar (zerolaunch.report.follow): incremental reading of metrics.jsonl and the bar it drives.

Leaves out: the launcher wiring itself (launch/ decides when to start and stop it).
"""

import io
import json
import math

import pytest
from rich.console import Console

from zerolaunch.report import Reporter, StepMetrics
from zerolaunch.report.follow import LiveProgress, MetricsFollower, record_to_step


def _append(path, *records, newline=True):
    with open(path, "a", encoding="utf-8") as f:
        for r in records:
            f.write(json.dumps(r) + ("\n" if newline else ""))


def test_follower_returns_new_complete_lines_only(tmp_path):
    path = tmp_path / "metrics.jsonl"
    follower = MetricsFollower(path)
    assert follower.poll() == []  # no file yet
    _append(path, {"step": 1}, {"step": 2})
    assert [r["step"] for r in follower.poll()] == [1, 2]
    assert follower.poll() == []
    with open(path, "a", encoding="utf-8") as f:
        f.write('{"step": 3, "lo')  # a poll between two writes
    assert follower.poll() == []
    with open(path, "a", encoding="utf-8") as f:
        f.write('ss": 1.5}\nnot json\n')
    assert follower.poll() == [{"step": 3, "loss": 1.5}]


def test_follower_starts_over_when_the_file_is_rewritten(tmp_path):
    path = tmp_path / "metrics.jsonl"
    follower = MetricsFollower(path)
    _append(path, {"step": 1}, {"step": 2}, {"step": 3})
    assert len(follower.poll()) == 3
    path.write_text(json.dumps({"step": 1}) + "\n")  # a fresh run in the same dir
    assert follower.poll() == [{"step": 1}]


def test_records_round_trip_to_step_metrics(tmp_path):
    console = Console(file=io.StringIO(), width=100, force_terminal=False)
    reporter = Reporter(
        tmp_path, console, total_steps=2, world_size=1, tokens_per_step=64, flops_per_token=10.0
    )
    logged = StepMetrics(1, math.nan, 0.5, 1e-3, None, True, 0.25, 0.01, 100)
    reporter.log(logged)
    reporter.close()
    (record,) = MetricsFollower(tmp_path / "metrics.jsonl").poll()
    metrics, rates = record_to_step(record)
    assert math.isnan(metrics.loss) and metrics.skipped is True and metrics.comm_bytes == 100
    assert metrics.step_seconds == 0.25 and rates.tokens_per_second == pytest.approx(256.0)


def test_live_progress_draws_the_bar_and_prints_no_lines(tmp_path):
    buf = io.StringIO()
    console = Console(file=buf, width=100, force_terminal=True)
    path = tmp_path / "metrics.jsonl"
    with LiveProgress(tmp_path, console, total_steps=3, poll_seconds=0.02) as live:
        assert live.active
        _append(
            path, *({"step": i, "loss": 2.0 / i, "lr": 1e-3, "tokens_per_second": 100.0} for i in (1, 2, 3))
        )
    out = buf.getvalue()
    assert "3/3" in out and "loss 0.6667" in out
    assert "step 1/3 |" not in out  # the workers print the step lines, not the launcher


def test_live_progress_is_inert_off_a_terminal(tmp_path):
    buf = io.StringIO()
    console = Console(file=buf, width=100, force_terminal=False)
    _append(tmp_path / "metrics.jsonl", {"step": 1, "loss": 1.0})
    with LiveProgress(tmp_path, console, total_steps=3) as live:
        assert not live.active
    assert buf.getvalue() == ""


def test_bad_poll_interval_is_an_error(tmp_path):
    with pytest.raises(ValueError, match="poll_seconds must be > 0"):
        LiveProgress(tmp_path, Console(file=io.StringIO()), total_steps=3, poll_seconds=0)
