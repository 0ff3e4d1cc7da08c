"""The per-step "data wait" reaches the step line and the metrics.jsonl record."""

from __future__ import annotations

from zerolaunch.report.metrics import StepMetrics, metrics_record, step_rates
from zerolaunch.report.progress import format_step_line


def _rates():
    return step_rates(
        0.5, tokens_per_step=100, world_size=1, flops_per_token=None, peak_flops_per_device=None
    )


def test_data_wait_in_line_and_record():
    m = StepMetrics(step=3, loss=1.5, step_seconds=0.5, data_wait_ms=12.34)
    assert "data wait 12.3 ms" in format_step_line(m, _rates(), total_steps=9, skipped_total=0, eta_seconds=1)
    assert metrics_record(m, _rates(), tokens_seen=300)["data_wait_ms"] == 12.34


def test_unmeasured_or_negligible_data_wait_is_left_out_of_the_line():
    for wait in (None, 0.4):
        m = StepMetrics(step=3, loss=1.5, step_seconds=0.5, data_wait_ms=wait)
        assert "data wait" not in format_step_line(m, _rates(), total_steps=9, skipped_total=0, eta_seconds=1)
