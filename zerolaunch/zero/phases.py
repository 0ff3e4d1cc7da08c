"""The names the engine's phases carry in a profile, as FSDP2 labels its own ("FSDP::all_gather", ...).

Each phase runs under `torch.profiler.record_function("zerolaunch::<phase>")`, so a torch.profiler trace
(or the Chrome/Perfetto view of one) reads by name: where a step's time goes (gathers, reduce-scatters, the
norm, the optimizer step, the publish of updated params) without reading the kernels. Outside a profiler a
record_function costs a few microseconds, and the hottest one (`STAGE_GRAD`) runs once per param per
backward, so nothing is guarded.
"""

from __future__ import annotations

import torch

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


def phase(name: str) -> torch.profiler.record_function:
    """Context manager: the enclosed work shows as `zerolaunch::<name>` in a profile."""
    return torch.profiler.record_function(label(name))
