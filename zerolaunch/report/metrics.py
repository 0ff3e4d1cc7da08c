"""One training step's numbers: what the loop measures (`StepMetrics`), what follows from it (`StepRates`),
and the `metrics.jsonl` file both are written to.

This module owns the per-step arithmetic (tokens/s, TFLOP/s per device, MFU) and the JSON form of a step.
It does not aggregate over ranks (the training loop hands in values already reduced: loss = mean over the
global batch, memory = max over ranks) and prints nothing.
"""

from __future__ import annotations

import json
import math
import os
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from zerolaunch.report import mfu as mfu_math
from zerolaunch.util.disk_errors import disk_error, disk_errors, is_disk_error


@dataclass(frozen=True)
class StepMetrics:
    """What the training loop measured for one optimizer step (rank 0 holds the reduced values)."""

    step: int
    """1-based optimizer step number (counting skipped fp16 steps, so it matches the loop's counter)."""
    loss: float
    """Mean loss over the global batch of this step."""
    grad_norm: float | None = None
    """Global gradient norm before clipping; None when not computed."""
    lr: float | None = None
    """Learning rate the step used."""
    loss_scale: float | None = None
    """fp16 dynamic loss scale after the step; None for bf16 / fp32."""
    skipped: bool = False
    """True when the overflow check (inf/nan grads, any dtype) skipped this step's update."""
    step_seconds: float | None = None
    """Wall time of the whole step (all micro-batches, backward and optimizer)."""
    comm_seconds: float | None = None
    """Time this step spent issuing and waiting on collectives (zero.comm.CommStats delta)."""
    comm_bytes: int | None = None
    """Bytes this rank's collectives moved during this step (zero.comm.CommStats delta)."""
    mem_allocated_bytes: int | None = None
    """Peak allocated device memory during the step, max over ranks (CUDA only)."""
    mem_reserved_bytes: int | None = None
    """Peak reserved (cached) device memory during the step, max over ranks (CUDA only)."""
    mem_device_bytes: int | None = None
    """Total memory of one device, for the percentages (CUDA only)."""
    data_wait_ms: float | None = None
    """Milliseconds the step's micro-batches waited for input (rank 0); near 0 when input keeps up."""


@dataclass(frozen=True)
class StepRates:
    """What follows from one step's time and the run's constants; None where it cannot be known."""

    tokens_per_second: float | None
    tokens_per_second_per_device: float | None
    tflops_per_device: float | None
    mfu: float | None
    """Fraction of the device's peak dense FLOP/s (0.42 = 42%)."""


def step_rates(
    step_seconds: float | None,
    *,
    tokens_per_step: int,
    world_size: int,
    flops_per_token: float | None,
    peak_flops_per_device: float | None,
) -> StepRates:
    """Throughput of a step of `tokens_per_step` global tokens on `world_size` devices in `step_seconds`."""
    if step_seconds is None or not step_seconds > 0 or not math.isfinite(step_seconds):
        return StepRates(None, None, None, None)
    tokens_per_second = tokens_per_step / step_seconds
    per_device = tokens_per_second / world_size
    if flops_per_token is None:
        return StepRates(tokens_per_second, per_device, None, None)
    flops_per_device = flops_per_token * per_device
    return StepRates(
        tokens_per_second,
        per_device,
        flops_per_device / mfu_math.TERA,
        mfu_math.mfu(flops_per_device, peak_flops_per_device),
    )


def _is_nonfinite(value) -> bool:
    return isinstance(value, float) and not math.isfinite(value)


def metrics_record(metrics: StepMetrics, rates: StepRates, tokens_seen: int) -> dict:
    """The JSON object written for one step: the measured fields, the derived rates, and a timestamp.

    Strict JSON has no NaN / Infinity (json.dumps would write them, and jq or JavaScript then fail on the
    line), so a non-finite value becomes null and its field is named in "nonfinite": a diverged loss stays
    distinguishable from one that was not measured.
    """
    record = asdict(metrics)
    record.update(asdict(rates))
    record["tokens_seen"] = tokens_seen
    record["time_unix"] = time.time()
    nonfinite = [key for key, value in record.items() if _is_nonfinite(value)]
    record = {key: None if key in nonfinite else value for key, value in record.items()}
    if nonfinite:
        record["nonfinite"] = nonfinite
    return record


class MetricsFile:
    """`run_dir/metrics.jsonl`: one JSON object per line, flushed after every line so a crash loses nothing
    and `tail -f` follows a live run.

    A resume (`resume_step`) keeps the history up to the checkpoint it resumed from and drops the rest: the
    crashed attempt's steps after that checkpoint are run again, so keeping them would log those steps twice.
    A line a crash cut short (no newline, or not JSON) is dropped too, so every line of the file parses.
    """

    FILENAME = "metrics.jsonl"

    def __init__(self, run_dir: str | Path, *, resume_step: int | None = None):
        """`resume_step` None: a fresh run, the file starts anew; an int: continue after that step."""
        self.path = Path(run_dir) / self.FILENAME
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            if resume_step is not None:
                truncate_metrics(self.path, resume_step)
            self._file = open(self.path, "a" if resume_step is not None else "w", encoding="utf-8")  # noqa: SIM115
        except OSError as exc:
            if is_disk_error(exc):
                raise disk_error(exc, path=self.path, fix="give the run another --run-dir") from None
            raise ValueError(
                f"cannot write metrics to {self.path}: {exc.strerror}; pick a writable run dir (--run-dir)"
            ) from exc

    def write(self, record: dict) -> None:
        # one write call per line: a line is written whole or (killed mid-write) cut, never interleaved
        with disk_errors(self.path, fix="give the run another --run-dir"):
            self._file.write(json.dumps(record, allow_nan=False) + "\n")
            self._file.flush()

    def close(self) -> None:
        if not self._file.closed:
            self._file.close()


def _parse_lines(data: bytes) -> list[tuple[bytes, dict]]:
    """The complete, valid step records of a metrics file's bytes, each with its line."""
    kept = []
    for line in data.split(b"\n")[: -1 if not data.endswith(b"\n") else None]:
        # the last piece without its newline is a line a crash cut short: dropped even if it parses
        try:
            record = json.loads(line)
        except (json.JSONDecodeError, UnicodeDecodeError):
            continue
        if isinstance(record, dict) and isinstance(record.get("step"), int):
            kept.append((line, record))
    return kept


def truncate_metrics(path: str | Path, last_step: int) -> int:
    """Rewrite `path` to hold only its valid records with step <= `last_step`; returns how many lines went.

    Atomic (a temp file, fsync, rename): a crash during the rewrite leaves the old file or the new one.
    """
    path = Path(path)
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return 0
    kept = [line for line, record in _parse_lines(data) if record["step"] <= last_step]
    lines = [piece for piece in data.split(b"\n") if piece.strip()]
    if len(kept) == len(lines) and data.endswith(b"\n"):
        return 0  # already clean: leave the file (and a follower's offset into it) alone
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as f:
        f.write(b"".join(line + b"\n" for line in kept))
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    return len(lines) - len(kept)


def read_metrics(path: str | Path) -> list[dict]:
    """Every step record of a metrics.jsonl file, in file order (used by tests and by later tooling).

    A last line without its newline (the writer was killed mid-line) is left out; any other line that is
    not JSON is an error, since the writer never leaves one.
    """
    data = Path(path).read_bytes()
    lines = data.split(b"\n")
    if not data.endswith(b"\n"):
        lines = lines[:-1]
    return [json.loads(line) for line in lines if line.strip()]
