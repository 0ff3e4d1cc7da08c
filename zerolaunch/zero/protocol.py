"""What the engine checks and returns, apart from the engine itself: the compute dtypes, the `StepInfo` that
`step()` returns, and `validate_options`, run before any strategy is built (its rules are option_rules.py's).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .optim.torch_optim import STATE_KINDS
from .option_rules import option_problems
from .options import DTYPE_NAMES, OPTIMIZER_NAMES, EngineOptions

# strict: a name added to options.Dtype without its torch dtype fails at import, not at first use.
DTYPES = dict(zip(DTYPE_NAMES, (torch.float32, torch.bfloat16, torch.float16), strict=True))
# the same for an optimizer name option_rules.py accepts but the engine could not build.
if set(STATE_KINDS) != set(OPTIMIZER_NAMES):
    raise ImportError(f"optim STATE_KINDS {sorted(STATE_KINDS)} != options.OPTIMIZER_NAMES {OPTIMIZER_NAMES}")


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
    """Raise ValueError with the first broken rule of option_rules.py (key, problem, fix); the recipe loader
    reports the same rules against the recipe's keys, so a loaded recipe passes here."""
    problems = option_problems(options)
    if problems:
        raise ValueError(problems[0].message())
