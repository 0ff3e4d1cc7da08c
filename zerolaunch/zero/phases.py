"""The names the engine's phases carry in a profile, as FSDP2 labels its own ("FSDP::all_gather", ...).

Each phase runs under `torch.profiler.record_function("zerolaunch::<phase>")`, so a torch.profiler trace
(or the Chrome/Perfetto view of one) reads by name: where a step's time goes (gathers, reduce-scatters, the
norm, the optimizer step, the publish of updated params) without reading the kernels.

A record_function is not free outside a profiler: it enters and leaves a dispatcher op each time (about 25 us
a pair measured on a loaded 2-core CPU, against under 1 us for the profiler-enabled check), and the hottest
phase (`STAGE_GRAD`) runs once per param per backward, on the host thread that must stay ahead of the GPU.
So a phase is labelled only while a profiler records.
"""

from __future__ import annotations

import contextlib

import torch
from torch._C._autograd import _profiler_enabled

FORWARD = "forward"
"""Engine.__call__: the model's forward with the strategy's gathers (stage 3)."""
BACKWARD = "backward"
"""Engine.backward: autograd with every grad hook below."""
GATHER = "gather"
"""A stage-3 unit's all-gather is issued (its full buffer refilled from every rank's shard)."""
GATHER_WAIT = "gather_wait"
"""The compute stream waits for a unit's all-gather."""
STAGE_GRAD = "stage_grad"
"""A param's grad moves into its reduce unit's staging buffer (or, at world size 1, into the grad shard)."""
REDUCE_ISSUE = "reduce_issue"
"""A reduce unit's reduce-scatter is issued."""
REDUCE_WRITE = "reduce_write"
"""A completed reduce-scatter is written (overwritten or added) into the unit's fp32 grad shard."""
FINISH_WINDOW = "finish_window"
"""At the accumulation boundary: the window's grads into the fp32 shards (and the host synced)."""
NORM = "norm"
"""The global grad norm, the non-finite check, clipping and the loss-scale decision."""
STEP = "step"
"""The optimizer step over this rank's shards, with the publish below."""
PUBLISH = "publish"
"""Updated params back to where the forward reads them (all-gathers, shard writes, resident regathers)."""

ALL = (
    FORWARD,
    BACKWARD,
    GATHER,
    GATHER_WAIT,
    STAGE_GRAD,
    REDUCE_ISSUE,
    REDUCE_WRITE,
    FINISH_WINDOW,
    NORM,
    STEP,
    PUBLISH,
)


def label(phase: str) -> str:
    """The name a profile shows for `phase`."""
    return f"zerolaunch::{phase}"


_UNLABELLED = contextlib.nullcontext()


def phase(name: str) -> contextlib.AbstractContextManager:
    """Context manager: the enclosed work shows as `zerolaunch::<name>` in a profile (nothing when none runs)."""
    if _profiler_enabled():
        return torch.profiler.record_function(label(name))
    return _UNLABELLED
