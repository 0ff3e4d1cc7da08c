"""What rank 0 shows while training runs: a rich progress bar on a terminal, plain lines otherwise.

This module owns the per-step line (`format_step_line`), the ETA estimate and the choice between the live
bar and plain output. On a terminal the bar is redrawn every step and the full line is printed above it
every `log_every` steps; elsewhere (CI, `> log.txt`) only the plain lines are printed, with no control
characters. It computes no metrics (see metrics.py) and draws no tables (see tables.py).
"""

from __future__ import annotations

import statistics
from collections import deque

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn

from zerolaunch.report.format import (
    fmt_count,
    fmt_eta,
    fmt_float,
    fmt_gib,
    fmt_pct,
    fmt_sci,
    fmt_seconds,
    fmt_tflops,
)
from zerolaunch.report.metrics import StepMetrics, StepRates

# Steps the ETA is estimated from: recent enough to follow a change of speed, long enough to smooth noise.
ETA_WINDOW_STEPS = 20


DATA_WAIT_SHOWN_MS = 1.0
"""A step's input wait is on its line from this many milliseconds: below, input keeps up (near 0)."""


def _mem_text(used_bytes: int | None, device_bytes: int | None) -> str:
    share = None if used_bytes is None or not device_bytes else used_bytes / device_bytes
    return fmt_gib(used_bytes) if share is None else f"{fmt_gib(used_bytes)} ({fmt_pct(share, 0)})"


def format_step_line(
    metrics: StepMetrics,
    rates: StepRates,
    *,
    total_steps: int,
    skipped_total: int,
    eta_seconds: float | None,
    show_loss_scale: bool = True,
) -> str:
    """One plain line for one step, torchtitan's fields in that order; fields never measured are left out.

    Kept near 100 characters, so an 80-column terminal wraps it once at most: the per-device rates,
    TFLOP/s (when the MFU is known), reserved memory and a data wait under DATA_WAIT_SHOWN_MS are in
    metrics.jsonl and the end-of-run tables.
    `show_loss_scale` False hides the scale (bf16 / fp32 runs, where the engine reports a constant 1).
    """
    parts = [
        f"step {metrics.step}/{total_steps}",
        f"loss {fmt_float(metrics.loss)}",
        f"gnorm {fmt_float(metrics.grad_norm, 3)}",
        f"lr {fmt_sci(metrics.lr)}",
        f"tok/s {fmt_count(rates.tokens_per_second)}",
        f"MFU {fmt_pct(rates.mfu)}"
        if rates.mfu is not None
        else f"TFLOP/s/dev {fmt_tflops(rates.tflops_per_device)}",
    ]
    if metrics.mem_allocated_bytes is not None:
        parts.append(f"mem {_mem_text(metrics.mem_allocated_bytes, metrics.mem_device_bytes)}")
    if metrics.comm_seconds is not None:
        parts.append(f"comm {fmt_seconds(metrics.comm_seconds)}")
    if metrics.data_wait_ms is not None and metrics.data_wait_ms >= DATA_WAIT_SHOWN_MS:
        parts.append(f"data wait {metrics.data_wait_ms:.1f} ms")
    if show_loss_scale and metrics.loss_scale is not None:
        parts.append(f"scale {metrics.loss_scale:g}")
    if skipped_total or metrics.skipped:
        parts.append(f"skipped {skipped_total}" + (" (this step)" if metrics.skipped else ""))
    parts.append(f"eta {fmt_eta(eta_seconds)}")
    return "  ".join(parts)


class EtaEstimate:
    """Remaining time = remaining steps x median of the last `ETA_WINDOW_STEPS` step times."""

    def __init__(self, total_steps: int):
        self._total_steps = total_steps
        self._recent_seconds: deque[float] = deque(maxlen=ETA_WINDOW_STEPS)

    def add(self, step_seconds: float | None) -> None:
        if step_seconds is not None and step_seconds > 0:
            self._recent_seconds.append(step_seconds)

    def seconds_left(self, step: int) -> float | None:
        if not self._recent_seconds:
            return None
        return max(0, self._total_steps - step) * statistics.median(self._recent_seconds)


class ProgressDisplay:
    """The live output of one run on rank 0 (see the module docstring for the two modes)."""

    def __init__(
        self,
        console: Console,
        *,
        total_steps: int,
        start_step: int,
        log_every: int,
        interactive: bool,
        show_loss_scale: bool = True,
        print_lines: bool = True,
    ):
        self._console = console
        self._total_steps = total_steps
        self._start_step = start_step
        self._log_every = log_every
        self._interactive = interactive
        self._show_loss_scale = show_loss_scale
        self._print_lines = print_lines
        self._eta = EtaEstimate(total_steps)
        self._progress: Progress | None = None
        self._task = None

    def _start_bar(self) -> None:
        self._progress = Progress(
            TextColumn("step"),
            MofNCompleteColumn(),
            BarColumn(bar_width=24),
            TextColumn("{task.fields[stats]}"),
            console=self._console,
            transient=False,
        )
        self._task = self._progress.add_task(
            "train", total=self._total_steps, completed=self._start_step, stats="starting"
        )
        self._progress.start()

    def _is_log_step(self, step: int) -> bool:
        return step == self._start_step + 1 or step % self._log_every == 0 or step >= self._total_steps

    def show(self, metrics: StepMetrics, rates: StepRates, skipped_total: int) -> str | None:
        """Update the display for one step; returns the plain line when one was printed."""
        self._eta.add(metrics.step_seconds)
        eta_seconds = self._eta.seconds_left(metrics.step)
        line = None
        if self._print_lines and self._is_log_step(metrics.step):
            line = format_step_line(
                metrics,
                rates,
                total_steps=self._total_steps,
                skipped_total=skipped_total,
                eta_seconds=eta_seconds,
                show_loss_scale=self._show_loss_scale,
            )
        if not self._interactive:
            if line is not None:
                # markup/highlight off: a loss printed as "[nan]" or a path must not be read as rich markup.
                self._console.print(line, markup=False, highlight=False, soft_wrap=True)
            return line
        if self._progress is None:
            self._start_bar()
        stats = (
            f"loss {fmt_float(metrics.loss)}  lr {fmt_sci(metrics.lr)}  "
            f"tok/s {fmt_count(rates.tokens_per_second)}  eta {fmt_eta(eta_seconds)}"
        )
        # refresh now rather than at the next 10 Hz tick: the line printed below re-draws the bar from its
        # last rendered frame, which would otherwise show the previous step.
        self._progress.update(self._task, completed=metrics.step, stats=stats, refresh=line is not None)
        if line is not None:
            self._progress.console.print(line, markup=False, highlight=False, soft_wrap=True)
        return line

    def close(self) -> None:
        """Stop the live bar (leaving its last frame on screen); safe to call twice."""
        if self._progress is not None:
            self._progress.stop()
            self._progress = None
