"""A progress bar in the launcher, drawn from the run's metrics.jsonl while the workers train.

Under torchelastic the workers' stdout is a pipe, never a terminal, so rank 0's Reporter prints plain
lines. The launcher process does own the terminal: `LiveProgress` follows `run_dir/metrics.jsonl` from a
thread and draws the rich bar there (step/total, loss, lr, tokens/s, ETA). It prints no step lines itself
(the workers' lines arrive through torchelastic's tee). This module owns the incremental reading of the
file (`MetricsFollower`) and that thread; the bar itself is progress.py's.
"""

from __future__ import annotations

import json
import threading
from dataclasses import fields
from pathlib import Path

from rich.console import Console

from zerolaunch.report.metrics import MetricsFile, StepMetrics, StepRates
from zerolaunch.report.progress import ProgressDisplay

_METRIC_FIELDS = tuple(f.name for f in fields(StepMetrics))
_RATE_FIELDS = tuple(f.name for f in fields(StepRates))


class MetricsFollower:
    """Returns the records appended to a metrics.jsonl since the previous `poll()`.

    A line is returned only once its newline is there (the writer flushes whole lines, but a poll may land
    between two writes). The file may not exist yet, or be rewritten by a fresh run: a file shorter than
    what was read starts the reading over.
    """

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self._offset = 0
        self._partial = b""

    def poll(self) -> list[dict]:
        try:
            size = self.path.stat().st_size
            if size < self._offset:
                self._offset, self._partial = 0, b""
            with open(self.path, "rb") as f:
                f.seek(self._offset)
                chunk = f.read()
        except FileNotFoundError:
            return []
        self._offset += len(chunk)
        *lines, self._partial = (self._partial + chunk).split(b"\n")
        records = []
        for line in lines:
            if not line.strip():
                continue
            try:
                records.append(json.loads(line))
            except json.JSONDecodeError:
                # Not ours (the file was edited or is from another tool): skip it rather than stop the bar.
                continue
        return records


def record_to_step(record: dict) -> tuple[StepMetrics, StepRates]:
    """The StepMetrics and StepRates a metrics.jsonl record was written from (nulls stay None)."""
    values = {name: record.get(name) for name in _METRIC_FIELDS}
    values["skipped"] = bool(values["skipped"])
    if values["loss"] is None:
        values["loss"] = float("nan")  # written as null because it was not finite
    return StepMetrics(**values), StepRates(**{name: record.get(name) for name in _RATE_FIELDS})


class LiveProgress:
    """The launcher-side bar: `with LiveProgress(run_dir, console, total_steps=...): elastic_launch(...)`.

    Does nothing when the console is not a terminal (CI, log files): the workers' plain lines say it all.
    """

    def __init__(
        self,
        run_dir: str | Path,
        console: Console,
        *,
        total_steps: int,
        start_step: int = 0,
        poll_seconds: float = 0.5,
        interactive: bool | None = None,
    ):
        if poll_seconds <= 0:
            raise ValueError(f"LiveProgress: poll_seconds must be > 0, got {poll_seconds!r}")
        self.active = console.is_terminal if interactive is None else interactive
        self._follower = MetricsFollower(Path(run_dir) / MetricsFile.FILENAME)
        self._poll_seconds = poll_seconds
        # log_every past the end: the bar only, never a line (the workers print those).
        self._display = ProgressDisplay(
            console,
            total_steps=total_steps,
            start_step=start_step,
            log_every=total_steps + 1,
            interactive=True,
            print_lines=False,
        )
        self._skipped_total = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def poll_once(self) -> int:
        """Draw every record appended since the last poll; returns how many there were."""
        records = self._follower.poll()
        for record in records:
            if "eval_loss" in record or "event" in record:  # not a step (the workers print its line)
                continue
            metrics, rates = record_to_step(record)
            self._skipped_total += metrics.skipped
            self._display.show(metrics, rates, skipped_total=self._skipped_total)
        return len(records)

    def _run(self) -> None:
        while not self._stop.wait(self._poll_seconds):
            self.poll_once()

    def start(self) -> LiveProgress:
        if self.active and self._thread is None:
            self._thread = threading.Thread(target=self._run, name="zerolaunch-progress", daemon=True)
            self._thread.start()
        return self

    def stop(self) -> None:
        """Stop following (after one last read, so the final step is drawn) and leave the bar on screen."""
        if self._thread is not None:
            self._stop.set()
            self._thread.join(timeout=10)
            self._thread = None
            self.poll_once()
        self._display.close()

    def __enter__(self) -> LiveProgress:
        return self.start()

    def __exit__(self, *exc_info) -> None:
        self.stop()
