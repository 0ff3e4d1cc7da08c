"""What a run shows: the progress display, run_dir/metrics.jsonl, and the end-of-run tables.

`Reporter` and `StepMetrics` are the surface the training loop uses (ARCHITECTURE.md "Reports");
`LiveProgress` is the launcher's bar (it follows metrics.jsonl); `peak_flops` and `gpt_flops_per_token`
are the MFU arithmetic. rich is imported only inside this package, and only by the modules that draw
(follow, progress, reporter, tables): the names below are loaded on first use, so `zerolaunch.report.metrics`
(the metrics.jsonl writer) imports without rich, for train/reporting.py's plain fallback.
"""

from __future__ import annotations

import importlib

_EXPORTS = {
    "LiveProgress": "zerolaunch.report.follow",
    "StepMetrics": "zerolaunch.report.metrics",
    "StepRates": "zerolaunch.report.metrics",
    "gpt_flops_per_token": "zerolaunch.report.mfu",
    "peak_flops": "zerolaunch.report.mfu",
    "Reporter": "zerolaunch.report.reporter",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)
