"""What the engine checks and returns, apart from the engine itself: the compute dtypes, the `StepInfo` that
`step()` returns, and the option checks run before any strategy is built.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .optim.torch_optim import STATE_KINDS
from .options import DTYPE_NAMES, EngineOptions

# strict: a name added to options.Dtype without its torch dtype fails at import, not at first use.
DTYPES = dict(zip(DTYPE_NAMES, (torch.float32, torch.bfloat16, torch.float16), strict=True))


@dataclass(frozen=True)
class StepInfo:
    stepped: bool
    """True when the optimizer stepped (an accumulation boundary with finite grads)."""
    skipped: bool
    """True at a boundary whose step was skipped: an inf/nan grad on some rank (every dtype; under fp16 the
    loss scale also backs off). Every rank skips the same steps."""
    grad_norm: float | None
    """Global grad norm before clipping; None off the boundary, the non-finite norm (inf or nan) on a skip."""
    loss_scale: float
    lr: float


def validate_options(options: EngineOptions) -> None:
    """Raise ValueError naming the bad option and the fix (the config layer shows the message)."""
    z, p = options.zero, options.precision
    if z.stage not in (0, 1, 2, 3):
        raise ValueError(f"zero.stage must be 0, 1, 2 or 3, got {z.stage}")
    if z.reduce_bucket_size < 1:
        raise ValueError(f"zero.reduce_bucket_size must be >= 1 element, got {z.reduce_bucket_size}")
    if options.gradient_accumulation_steps < 1:
        raise ValueError(
            f"gradient_accumulation_steps must be >= 1, got {options.gradient_accumulation_steps}"
        )
    if options.gradient_clipping < 0:
        raise ValueError(f"gradient_clipping must be >= 0 (0 = off), got {options.gradient_clipping}")
    for key, value in (
        ("precision.dtype", p.dtype),
        ("precision.communication_dtype", p.communication_dtype),
    ):
        if value is not None and value not in DTYPES:
            raise ValueError(f"{key} must be one of {', '.join(DTYPE_NAMES)}, got {value!r}")
    if options.optimizer.name not in STATE_KINDS:
        raise ValueError(
            f"optimizer.name {options.optimizer.name!r} is not supported; use one of: {', '.join(STATE_KINDS)}"
        )
    if z.stage == 0 and z.offload_optimizer.device != "none":
        raise ValueError("zero.offload_optimizer needs zero.stage >= 1 (stage 0 keeps everything replicated)")
    if z.offload_optimizer.overlap_step and (z.stage not in (1, 2) or z.offload_optimizer.device == "none"):
        raise ValueError(
            "zero.offload_optimizer.overlap_step needs zero.stage 1 or 2 with offload_optimizer.device cpu "
            f"or nvme (got stage {z.stage}, device {z.offload_optimizer.device}); remove overlap_step"
        )
    # 0 is DeepSpeed's "no prefetch beyond the current unit": the unit needed now is always gathered.
    if z.stage == 3 and z.stage3_max_live_parameters < 0:
        raise ValueError(f"zero.stage3_max_live_parameters must be >= 0, got {z.stage3_max_live_parameters}")
    if z.stage < 3 and z.offload_param.device != "none":
        raise ValueError(
            "zero.offload_param needs zero.stage 3 (stages 0-2 keep the parameters on the device)"
        )
