"""The loop's non-finite rule: how many optimizer steps in a row had a non-finite loss or grad norm.

The engine already skips such a step (its grads are never applied, on every rank: zero/engine.py
StepInfo.skipped). This module only counts them: a finite step ends the streak; `train.max_nonfinite_steps`
bad steps in a row stop the run with `NonFiniteStop` (the worker exits with util/exit_codes.py's
NONFINITE_EXIT_CODE). While a streak is open no checkpoint is written, so the newest checkpoint is the last
good one. Every rank sees the same per-rank losses and the same global grad norm, so every rank takes the same
decision with no extra collective.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field


class NonFiniteStop(RuntimeError):
    """train.max_nonfinite_steps steps in a row had a non-finite loss or grad norm."""


@dataclass(frozen=True)
class BadStep:
    step: int
    rank_losses: dict[int, float]
    """Ranks whose mean micro-batch loss was non-finite, and that value."""
    grad_norm: float | None

    def describe(self) -> str:
        parts = []
        if self.rank_losses:
            ranks = ", ".join(f"rank {r} loss {v}" for r, v in sorted(self.rank_losses.items()))
            parts.append(ranks)
        if self.grad_norm is not None and not math.isfinite(self.grad_norm):
            parts.append(f"grad norm {self.grad_norm}")
        return f"step {self.step}: " + "; ".join(parts)


@dataclass
class NonFiniteGuard:
    max_steps: int
    """0 = never stop."""
    streak: list[BadStep] = field(default_factory=list)

    @property
    def open(self) -> bool:
        """True while the latest steps were non-finite: no checkpoint may be written."""
        return bool(self.streak)

    def record(self, step: int, rank_losses: list[float], grad_norm: float | None) -> BadStep | None:
        """One optimizer step's per-rank losses and global grad norm; returns the BadStep when it was one.
        Raises NonFiniteStop when it completes max_steps bad steps in a row."""
        bad_ranks = {r: v for r, v in enumerate(rank_losses) if not math.isfinite(v)}
        norm_bad = grad_norm is not None and not math.isfinite(grad_norm)
        if not bad_ranks and not norm_bad:
            self.streak.clear()
            return None
        bad = BadStep(step, bad_ranks, grad_norm)
        self.streak.append(bad)
        if self.max_steps and len(self.streak) >= self.max_steps:
            raise NonFiniteStop(self.message())
        return bad

    def message(self) -> str:
        first = self.streak[0].step
        steps = "; ".join(b.describe() for b in self.streak)
        return (
            f"training stopped: {len(self.streak)} optimizer steps in a row had a non-finite loss or grad norm "
            f"(train.max_nonfinite_steps = {self.max_steps}): {steps} (the grad norm is the global one, the same on every "
            f"rank). None of these steps was applied to the "
            f"weights and no checkpoint was written from step {first} on; the newest checkpoint is the last "
            f"good one. Resume from it with `--resume auto` after fixing the cause (lower train.lr, "
            f"gradient clipping, the data at step {first}), or raise train.max_nonfinite_steps (0 = never stop)"
        )
