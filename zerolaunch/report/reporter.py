"""`Reporter`: everything rank 0 reports about a run, behind one constructor and two methods.

It owns the wiring: each `log(StepMetrics)` derives the rates (metrics.py), appends a line to
`run_dir/metrics.jsonl` and updates the display (progress.py); `finish(...)` prints the memory and
throughput tables (tables.py, summary.py) and the loss curve (curve.py), and writes `run_dir/summary.json`.
It does not gather over ranks: the training loop calls it on rank 0 with values already reduced.
"""

from __future__ import annotations

import json
import numbers
from dataclasses import asdict, fields
from pathlib import Path

from rich.console import Console

from zerolaunch.report import mfu as mfu_math
from zerolaunch.report.curve import render_curve
from zerolaunch.report.metrics import MetricsFile, StepMetrics, StepRates, metrics_record, step_rates
from zerolaunch.report.progress import ProgressDisplay
from zerolaunch.report.summary import ThroughputSummary, summarize, theory_comm_bytes_per_step
from zerolaunch.report.tables import memory_rows, memory_table, throughput_table
from zerolaunch.util.disk_errors import disk_errors

_ELEMENT_BYTES = {"bf16": 2, "fp16": 2, "fp32": 4, "tf32": 4}


def _require_int(name: str, value, minimum: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"Reporter: {name} must be an int >= {minimum}, got {value!r}")


def _check_metrics(metrics) -> None:
    # The loop hands in Python numbers; a tensor here would fail later inside json.dumps with a message
    # that names neither the field nor the fix.
    if not isinstance(metrics, StepMetrics):
        raise TypeError(f"Reporter.log takes a StepMetrics, got {type(metrics).__name__}")
    for f in fields(StepMetrics):
        value = getattr(metrics, f.name)
        if value is None and f.name not in ("step", "loss"):
            continue
        if f.name == "skipped":
            if not isinstance(value, bool):
                raise TypeError(f"StepMetrics.skipped must be a bool, got {value!r}")
        elif isinstance(value, bool) or not isinstance(value, numbers.Real):
            raise TypeError(
                f"StepMetrics.{f.name} must be a Python number, got {type(value).__name__}; "
                "convert tensors with .item() before logging"
            )


class Reporter:
    """Progress, metrics.jsonl and the end-of-run summary of one run (rank 0 only)."""

    def __init__(
        self,
        run_dir: str | Path,
        console: Console | None = None,
        *,
        total_steps: int,
        world_size: int,
        tokens_per_step: int,
        flops_per_token: float | None = None,
        device_name: str | None = "cpu",
        interactive: bool | None = None,
        log_every: int = 1,
        dtype: str = "fp32",
        start_step: int = 0,
    ):
        """`tokens_per_step` = global batch x seq len; `flops_per_token` from `mfu.gpt_flops_per_token` (None:
        no TFLOP/s, no MFU); `dtype` = the compute dtype, picks the peak; `interactive` None = a progress bar
        only when the console is a terminal; `start_step` = steps already done (resume: metrics.jsonl keeps
        its records up to that step and is appended to, instead of overwritten)."""
        _require_int("total_steps", total_steps, 1)
        _require_int("world_size", world_size, 1)
        _require_int("tokens_per_step", tokens_per_step, 1)
        _require_int("log_every", log_every, 1)
        _require_int("start_step", start_step, 0)
        if start_step > total_steps:
            raise ValueError(f"Reporter: start_step {start_step} is past total_steps {total_steps}")
        if flops_per_token is not None and not flops_per_token > 0:
            raise ValueError(f"Reporter: flops_per_token must be > 0 or None, got {flops_per_token!r}")
        self.run_dir = Path(run_dir)
        self.total_steps = total_steps
        self.world_size = world_size
        self.tokens_per_step = tokens_per_step
        self.flops_per_token = flops_per_token
        if device_name is not None and not isinstance(device_name, str):
            raise ValueError(
                f"Reporter: device_name must be a str (torch.cuda.get_device_name()), got {device_name!r}"
            )
        self.device_name = device_name or "cpu"
        self.dtype = mfu_math.dtype_column(dtype)
        self.peak_flops_per_device = mfu_math.peak_flops(device_name, self.dtype)
        console = console if console is not None else Console()
        self.interactive = console.is_terminal if interactive is None else interactive
        if not self.interactive and (console.is_terminal or console.color_system is not None):
            # Plain output promises no control characters even when the caller's console would emit them;
            # a console that already emits none is kept as is (it may be recording).
            console = Console(file=console.file, width=console.width, force_terminal=False, color_system=None)
        self.console = console
        self.history: list[StepMetrics] = []
        self.metrics_file = MetricsFile(self.run_dir, resume_step=start_step if start_step > 0 else None)
        self._display = ProgressDisplay(
            console,
            total_steps=total_steps,
            start_step=start_step,
            log_every=log_every,
            interactive=self.interactive,
            show_loss_scale=self.dtype == "fp16",
        )

    @property
    def tokens_seen(self) -> int:
        """Tokens this Reporter has seen logged: steps x global batch x seq len."""
        return len(self.history) * self.tokens_per_step

    def log(self, metrics: StepMetrics) -> StepRates:
        """Record one optimizer step: a metrics.jsonl line, the display; returns the derived rates."""
        _check_metrics(metrics)
        rates = step_rates(
            metrics.step_seconds,
            tokens_per_step=self.tokens_per_step,
            world_size=self.world_size,
            flops_per_token=self.flops_per_token,
            peak_flops_per_device=self.peak_flops_per_device,
        )
        self.history.append(metrics)
        self.metrics_file.write(metrics_record(metrics, rates, self.tokens_seen))
        self._display.show(metrics, rates, skipped_total=sum(1 for m in self.history if m.skipped))
        return rates

    def peak_text(self) -> str:
        peak = mfu_math.find_device(self.device_name)
        if self.peak_flops_per_device is None:
            if peak is None:
                return f"no peak FLOP/s known for device {self.device_name!r}"
            return f"no {self.dtype} peak known for {peak.name}"
        return (
            f"of {peak.name} {self.dtype} dense peak {self.peak_flops_per_device / mfu_math.TERA:g} TFLOP/s"
        )

    def finish(
        self,
        memory_by_rank: list[dict],
        zero_stage: int,
        params_numel: int | None = None,
        comm_bytes_per_step: float | None = None,
        *,
        gradient_accumulation_steps: int = 1,
        param_element_bytes: int | None = None,
        grad_element_bytes: int = 4,
    ) -> ThroughputSummary:
        """Stop the display, print the memory table, the throughput table and the loss curve.

        `memory_by_rank`: one dict per rank, `engine.memory_bytes()` plus (CUDA) peak_allocated_bytes,
        peak_reserved_bytes, device_bytes. `params_numel`: trainable params, for the ZeRO comm theory (None:
        no theory). `comm_bytes_per_step` None = the mean of the logged `comm_bytes`. Element bytes: params
        move in the compute dtype (default from `dtype`), grads in the engine's communication dtype (fp32
        unless precision.communication_dtype says otherwise).
        """
        self.close()
        memory_rows(memory_by_rank)  # validate before printing anything
        theory = None
        if params_numel is not None:
            theory = theory_comm_bytes_per_step(
                zero_stage,
                params_numel,
                world_size=self.world_size,
                param_element_bytes=param_element_bytes or _ELEMENT_BYTES[self.dtype],
                grad_element_bytes=grad_element_bytes,
                gradient_accumulation_steps=gradient_accumulation_steps,
            )
        summary = summarize(
            self.history,
            tokens_per_step=self.tokens_per_step,
            world_size=self.world_size,
            flops_per_token=self.flops_per_token,
            peak_flops_per_device=self.peak_flops_per_device,
            comm_bytes_per_step=comm_bytes_per_step,
            theory_bytes_per_step=theory,
        )
        self.console.print(memory_table(memory_by_rank, zero_stage))
        self.console.print(
            throughput_table(
                summary, zero_stage=zero_stage, world_size=self.world_size, peak_text=self.peak_text()
            )
        )
        if self.history:
            for line in render_curve([m.step for m in self.history], [m.loss for m in self.history]):
                self.console.print(line, markup=False, highlight=False, soft_wrap=True)

        with disk_errors(self.run_dir / "summary.json", fix="give the run another --run-dir"):
            (self.run_dir / "summary.json").write_text(
                json.dumps(
                    {"zero_stage": zero_stage, "world_size": self.world_size, **asdict(summary)}, indent=2
                )
                + "\n",
                encoding="utf-8",
            )
        return summary

    def close(self) -> None:
        """Stop the progress bar and close metrics.jsonl; finish() calls it, so does leaving a `with` block."""
        self._display.close()
        self.metrics_file.close()

    def __enter__(self) -> Reporter:
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()
