"""fp16 loss scaling with DeepSpeed's DynamicLossScaler semantics.

This module owns the loss-scale value and how it moves: static when `loss_scale > 0`, dynamic otherwise
(start at 2**initial_scale_power; an overflow consumes one unit of hysteresis, and when none is left halves
the scale, never below min_loss_scale; after `loss_scale_window` steps without overflow the scale doubles and
the hysteresis is refilled). fp32 and bf16 need no scaling: the scale is 1 and never moves, but an overflow still skips the step. The overflow
check itself (an all-reduced inf/nan flag) is the engine's; this module only hears its result.
"""

from __future__ import annotations

from .option_rules import precision_problems
from .options import PrecisionOptions


class LossScaler:
    def __init__(self, options: PrecisionOptions):
        self.enabled = options.dtype == "fp16"
        self.dynamic = self.enabled and options.loss_scale <= 0
        problems = precision_problems(options)  # the rules the recipe loader reports too
        if problems:
            raise ValueError(problems[0].message())
        if not self.enabled:
            self.scale = 1.0
        elif self.dynamic:
            self.scale = float(2**options.initial_scale_power)
        else:
            self.scale = float(options.loss_scale)
        self.scale_window = options.loss_scale_window
        self.min_scale = float(options.min_loss_scale)
        self.delayed_shift = options.hysteresis
        self.cur_hysteresis = options.hysteresis
        self.cur_iter = 0
        self.last_overflow_iter = -1

    def update(self, overflow: bool) -> bool:
        """Record one optimizer step's overflow result; returns True when that step must be skipped (every
        dtype: fp32 and bf16 skip a non-finite step too, with a scale that never moves)."""
        if not self.enabled:
            return overflow
        if not self.dynamic:
            return overflow
        if overflow:
            if self.delayed_shift == 1 or self.cur_hysteresis == 1:
                self.scale = max(self.scale / 2.0, self.min_scale)
            else:
                self.cur_hysteresis -= 1
            self.last_overflow_iter = self.cur_iter
        elif (self.cur_iter - self.last_overflow_iter) % self.scale_window == 0:
            # DeepSpeed's default (consecutive_hysteresis False): hysteresis refills only when the scale grows.
            self.cur_hysteresis = self.delayed_shift
            self.scale *= 2.0
        self.cur_iter += 1
        return overflow

    def state_dict(self) -> dict:
        return {
            "scale": self.scale,
            "cur_hysteresis": self.cur_hysteresis,
            "cur_iter": self.cur_iter,
            "last_overflow_iter": self.last_overflow_iter,
        }

    def load_state_dict(self, state: dict) -> None:
        self.scale = float(state["scale"]) if self.enabled else 1.0
        self.cur_hysteresis = int(state["cur_hysteresis"])
        self.cur_iter = int(state["cur_iter"])
        self.last_overflow_iter = int(state["last_overflow_iter"])
