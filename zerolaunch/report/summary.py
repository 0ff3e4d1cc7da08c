"""End-of-run arithmetic: throughput over the logged steps and the communication volume ZeRO theory predicts.

This module owns the numbers behind the throughput table (mean / median step time, tokens, TFLOP/s, MFU,
comm time, measured vs theoretical bytes per step). It is pure: it reads `StepMetrics` and constants and
returns a frozen summary; tables.py turns that into text.

[Note: comm accounting] Bytes are counted as zero/comm.py counts them: the full flat tensor of each
collective on one rank (the input of a reduce-scatter or all-reduce, the output of an all-gather). Per
optimizer step with P params (ZeRO paper, Rajbhandari et al. 2020, section 7):
  stage 0: one all-reduce of the grads                      -> P * grad_bytes
  stage 1: reduce-scatter grads at the accumulation boundary, all-gather params after the step
                                                             -> P * grad_bytes + P * param_bytes  (the "2x")
  stage 2: as stage 1, but the reduce-scatter runs in every micro-step (the full grad is freed each time)
                                                             -> A * P * grad_bytes + P * param_bytes
  stage 3: all-gather params in forward and again in backward, reduce-scatter grads, every micro-step
                                                             -> A * (2 * P * param_bytes + P * grad_bytes)  ("3x")
with A = gradient accumulation steps. A single rank runs no collective (theory 0). On a ring each rank puts
(N-1)/N of these bytes on the wire; the grad-norm and overflow all-reduces (a few bytes) are ignored.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

from zerolaunch.report.metrics import StepMetrics, step_rates

# The first step pays for allocator warm-up, kernel autotuning and lazy init; timing it would understate
# the steady-state speed, so the time statistics leave it out whenever more than one step was logged.
WARMUP_STEPS = 1


def theory_comm_bytes_per_step(
    zero_stage: int,
    params_numel: int,
    *,
    world_size: int,
    param_element_bytes: int,
    grad_element_bytes: int,
    gradient_accumulation_steps: int = 1,
) -> int:
    """Bytes one rank's collectives move per optimizer step under ZeRO `zero_stage` ([Note: comm accounting])."""
    if zero_stage not in (0, 1, 2, 3):
        raise ValueError(f"zero_stage must be 0, 1, 2 or 3, got {zero_stage!r}")
    if params_numel < 0 or gradient_accumulation_steps < 1 or world_size < 1:
        raise ValueError(
            "theory_comm_bytes_per_step needs params_numel >= 0, gradient_accumulation_steps >= 1 and "
            f"world_size >= 1; got {params_numel}, {gradient_accumulation_steps}, {world_size}"
        )
    if world_size == 1:
        return 0
    grads = params_numel * grad_element_bytes
    params = params_numel * param_element_bytes
    accum = gradient_accumulation_steps
    if zero_stage == 0:
        return grads
    if zero_stage == 1:
        return grads + params
    if zero_stage == 2:
        return accum * grads + params
    return accum * (2 * params + grads)


@dataclass(frozen=True)
class ThroughputSummary:
    steps_logged: int
    timed_steps: int
    """Steps the time statistics use (all but the first WARMUP_STEPS when more were logged)."""
    skipped_steps: int
    tokens_seen: int
    """Logged steps x tokens per step (global batch x sequence length), skipped fp16 steps included: their
    forward and backward ran."""
    mean_step_seconds: float | None
    median_step_seconds: float | None
    tokens_per_second: float | None
    tokens_per_second_per_device: float | None
    tflops_per_device: float | None
    mfu: float | None
    comm_seconds_per_step: float | None
    comm_share: float | None
    """Comm time as a fraction of the mean step time."""
    comm_bytes_per_step: float | None
    theory_comm_bytes_per_step: int | None
    comm_ratio: float | None
    """Measured / theoretical bytes; None when either is unknown or the theory is 0."""


def _mean(values: Sequence[float]) -> float | None:
    return statistics.fmean(values) if values else None


def summarize(
    history: Sequence[StepMetrics],
    *,
    tokens_per_step: int,
    world_size: int,
    flops_per_token: float | None,
    peak_flops_per_device: float | None,
    comm_bytes_per_step: float | None = None,
    theory_bytes_per_step: int | None = None,
) -> ThroughputSummary:
    """Throughput over the logged steps; `comm_bytes_per_step` None = the mean of the logged comm_bytes."""
    timed = list(history[WARMUP_STEPS:]) if len(history) > WARMUP_STEPS else list(history)
    step_seconds = [m.step_seconds for m in timed if m.step_seconds is not None and m.step_seconds > 0]
    mean_seconds = _mean(step_seconds)
    rates = step_rates(
        mean_seconds,
        tokens_per_step=tokens_per_step,
        world_size=world_size,
        flops_per_token=flops_per_token,
        peak_flops_per_device=peak_flops_per_device,
    )
    comm_seconds = _mean([m.comm_seconds for m in timed if m.comm_seconds is not None])
    if comm_bytes_per_step is None:
        comm_bytes_per_step = _mean([m.comm_bytes for m in timed if m.comm_bytes is not None])
    ratio = None
    if comm_bytes_per_step is not None and theory_bytes_per_step:
        ratio = comm_bytes_per_step / theory_bytes_per_step
    return ThroughputSummary(
        steps_logged=len(history),
        timed_steps=len(step_seconds),
        skipped_steps=sum(1 for m in history if m.skipped),
        tokens_seen=len(history) * tokens_per_step,
        mean_step_seconds=mean_seconds,
        median_step_seconds=statistics.median(step_seconds) if step_seconds else None,
        tokens_per_second=rates.tokens_per_second,
        tokens_per_second_per_device=rates.tokens_per_second_per_device,
        tflops_per_device=rates.tflops_per_device,
        mfu=rates.mfu,
        comm_seconds_per_step=comm_seconds,
        comm_share=comm_seconds / mean_seconds if comm_seconds is not None and mean_seconds else None,
        comm_bytes_per_step=comm_bytes_per_step,
        theory_comm_bytes_per_step=theory_bytes_per_step,
        comm_ratio=ratio if ratio is None or math.isfinite(ratio) else None,
    )
