"""The one call site of the run's reporting, on rank 0: `StepReporter` wraps `zerolaunch.report.Reporter`
(progress, metrics.jsonl, end-of-run tables) and falls back to plain per-step lines when its display (rich)
cannot be imported, so the loop never depends on how a step is shown. Both ways metrics.jsonl is written by
the one writer, report/metrics.py's MetricsFile (rich-free): on a resume the records after the checkpoint's
step and a line a crash cut short are dropped, and a non-finite value is written as null, never as NaN.
"""

from __future__ import annotations

import math
from pathlib import Path

from zerolaunch.report.metrics import metrics_record


class StepReporter:
    def __init__(
        self,
        run_dir: Path,
        *,
        total_steps: int,
        world_size: int,
        tokens_per_step: int,
        flops_per_token: float | None,
        device_name: str,
        log_every: int,
        dtype: str,
        start_step: int,
    ):
        self.total_steps = total_steps
        self.log_every = log_every
        try:  # lazy: rich is optional here (the display); without it, plain lines
            from rich.console import Console

            from zerolaunch.report import Reporter, StepMetrics
        except ImportError:
            from zerolaunch.report.metrics import MetricsFile, StepMetrics, StepRates

            self._reporter = None
            self._metrics_cls = StepMetrics
            self._no_rates = StepRates(None, None, None, None)
            self._tokens_per_step = tokens_per_step
            self._plain_file = MetricsFile(run_dir, resume_step=start_step if start_step > 0 else None)
            return
        self._metrics_cls = StepMetrics
        # Workers write through torchelastic's pipes, never a terminal: plain lines, a fixed width, the
        # narrowest terminal's, so the end-of-run tables fit it (step lines are never cut: soft-wrapped)
        console = Console(width=80, force_terminal=False, color_system=None)
        self._reporter = Reporter(
            run_dir,
            console,
            total_steps=total_steps,
            world_size=world_size,
            tokens_per_step=tokens_per_step,
            flops_per_token=flops_per_token,
            device_name=device_name,
            interactive=False,
            log_every=log_every,
            dtype=dtype,
            start_step=start_step,
        )

    def log(self, **fields) -> None:
        """One optimizer step; `fields` are StepMetrics' (step, loss, grad_norm, lr, ...), Python numbers."""
        if self._reporter is not None:
            self._reporter.log(self._metrics_cls(**fields))
            return

        step = fields["step"]
        record = metrics_record(self._metrics_cls(**fields), self._no_rates, step * self._tokens_per_step)
        self._plain_file.write(record)
        if step % self.log_every == 0 or step == self.total_steps:
            lr = fields.get("lr")
            norm = fields.get("grad_norm")
            print(
                f"step {step}/{self.total_steps} loss {fields['loss']:.4f}"
                + (f" lr {lr:.3g}" if lr is not None else "")
                + (f" grad_norm {norm:.3f}" if norm is not None and math.isfinite(norm) else "")
                + (f" {fields['step_seconds'] * 1e3:.0f} ms" if fields.get("step_seconds") else ""),
                flush=True,
            )

    def log_eval(self, step: int, loss: float, perplexity: float) -> None:
        """One evaluation: a line beside the step lines and a metrics.jsonl record {step, eval_loss, ...}."""
        record = {"step": step, "eval_loss": loss, "eval_perplexity": perplexity}
        file = self._reporter.metrics_file if self._reporter is not None else self._plain_file
        file.write({k: (v if math.isfinite(v) else None) for k, v in record.items()})
        print(f"step {step}/{self.total_steps} eval_loss {loss:.4f} eval_ppl {perplexity:.2f}", flush=True)

    def log_data_change(self, step: int, changes: dict, described: str) -> None:
        """A resume on other data that data.allow_change let through: a line, and a metrics.jsonl record
        {step, event: "data_changed", changes: {field: {old, new}}} at the step it resumed from."""
        record = {"step": step, "event": "data_changed", "changes": changes}
        file = self._reporter.metrics_file if self._reporter is not None else self._plain_file
        file.write(record)
        print(f"step {step}: resumed on other data (data.allow_change: true): {described}", flush=True)

    def finish(self, memory_by_rank: list[dict], zero_stage: int, **kwargs) -> None:
        if self._reporter is not None:
            self._reporter.finish(memory_by_rank, zero_stage, **kwargs)
            return
        self._plain_file.close()
        for rank, mem in enumerate(memory_by_rank):
            total = sum(v for k, v in mem.items() if not k.startswith(("peak_", "device_")))
            print(f"rank {rank} engine memory {total / 2**20:.1f} MiB {mem}", flush=True)

    def close(self) -> None:
        if self._reporter is not None:
            self._reporter.close()
        else:
            self._plain_file.close()
