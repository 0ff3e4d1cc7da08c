"""What a run shows: the progress display, run_dir/metrics.jsonl, and the end-of-run tables.

`Reporter` and `StepMetrics` are the surface the training loop uses (ARCHITECTURE.md "Reports");
`LiveProgress` is the launcher's bar (it follows metrics.jsonl); `peak_flops` and `gpt_flops_per_token`
are the MFU arithmetic. rich is imported only inside this package.
"""

from zerolaunch.report.follow import LiveProgress
from zerolaunch.report.metrics import StepMetrics, StepRates
from zerolaunch.report.mfu import gpt_flops_per_token, peak_flops
from zerolaunch.report.reporter import Reporter

__all__ = ["LiveProgress", "Reporter", "StepMetrics", "StepRates", "gpt_flops_per_token", "peak_flops"]
