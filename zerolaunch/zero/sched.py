"""Learning-rate schedules, as a pure function of the optimizer step.

This module owns the lr at every step, with DeepSpeed's formulas for WarmupLR, WarmupDecayLR and
WarmupCosineLR (deepspeed/runtime/lr_schedules.py) and a nanoGPT-style "cosine". It does not touch an
optimizer: the engine asks `lrs_at(global_steps, each group's own lr)` before each step and writes each
group's lr into its optimizer.

`lr_at(k)` is the lr of the (k+1)-th optimizer step (k counts steps already taken), step for step what
DeepSpeed 0.19.8 uses: its scheduler sets the lr once at construction (`last_batch_iteration = -1`: WarmupLR and
WarmupDecayLR give `warmup_min_lr`, WarmupCosineLR gives 0) and its engine calls `lr_scheduler.step()` after
each applied optimizer step, so step k+1 runs at the formula's value for `last_batch_iteration == k - 1`.
The first two steps of a DeepSpeed warmup therefore both run at the warmup's start lr. The nanoGPT "cosine" is
not DeepSpeed's and applies its formula at `k` directly.

`Schedule` is what the engine asks of any schedule (`Engine.set_schedule` installs another one, e.g. the
Hugging Face Trainer's scheduler read through its optimizer's groups: hf/optim_sched.py).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Protocol

from .option_rules import scheduler_problems
from .options import SchedulerOptions


class Schedule(Protocol):
    """The engine's lr schedule: the lrs of a step, asked before it runs, and what a checkpoint keeps of it."""

    def lrs_at(self, step: int, group_lrs: Sequence[float | None]) -> list[float]:
        """Each param group's lr for the optimizer step that follows `step` steps already taken; group_lrs:
        each group's own lr (None: the optimizer's)."""
        ...

    def state_dict(self) -> dict:
        """JSON-able, saved in the engine's checkpoint meta."""
        ...

    def load_state_dict(self, state: dict) -> None:
        """Restore what state_dict returned (raise ValueError when it belongs to another schedule)."""
        ...


class LRSchedule:
    def __init__(self, options: SchedulerOptions, base_lr: float):
        self.options = options
        self.base_lr = float(base_lr)
        self.last_step = -1
        """The last step `lr_at` was asked for (kept only for state_dict symmetry with DeepSpeed)."""
        self._validate()

    def _validate(self) -> None:
        problems = scheduler_problems(self.options)  # the rules the recipe loader reports too
        if problems:
            raise ValueError(problems[0].message())

    @property
    def peak_lr(self) -> float:
        """The nanoGPT "cosine"'s peak (its warmup_max_lr is a number or None)."""
        options = self.options
        if isinstance(options.warmup_max_lr, tuple):
            return float(options.warmup_max_lr[0])
        return self.base_lr if options.warmup_max_lr is None else float(options.warmup_max_lr)

    def check_groups(self, num_groups: int, groups: str) -> None:
        """Raise ValueError when a per-group list of warmup_min_lr / warmup_max_lr does not have one value per
        param group (DeepSpeed's `_format_param` raises then too). groups: what the groups are, for the
        message (e.g. "the 2 groups of model_parameters")."""
        message = group_count_error(self.options, num_groups, groups)
        if message:
            raise ValueError(message)

    def _warmup_gamma(self, step: int, warmup_steps: int) -> float:
        # DeepSpeed: log warmup reaches 1 at step warmup_steps - 1; linear at warmup_steps. Its operations, in
        # its order (inverse_log_warm_up * log), so the lrs are the same floats.
        if self.options.warmup_type == "log":
            return (1.0 / math.log(warmup_steps)) * math.log(step + 1)
        return step / warmup_steps

    def lr_at(self, step: int) -> float:
        """The learning rate of the optimizer step that follows `step` steps already taken (a group whose lr
        is the optimizer's)."""
        return self.lrs_at(step, (None,))[0]

    def lrs_at(self, step: int, group_lrs) -> list[float]:
        """The lr of each param group for the optimizer step that follows `step` steps already taken.

        group_lrs: each group's own lr (None: the optimizer's lr). As DeepSpeed 0.19.8's schedules
        (lr_schedules.py): WarmupLR / WarmupDecayLR run each group from its warmup_min_lr to its warmup_max_lr:
        a number is every group's (`_format_param` broadcasts a scalar), a tuple gives one per group (its length
        must be the number of groups: ValueError otherwise), and without warmup_max_lr the peak is each group's
        own lr (WarmupLR's `warmup_max_lr=None`); WarmupCosineLR scales each group's own lr by one ratio
        (`org_lrs`); no schedule leaves each group at its own lr. The nanoGPT "cosine" (ours) scales a group's lr by
        its own lr / the optimizer's.
        """
        if step < 0:
            raise ValueError(f"step must be >= 0, got {step}")
        self.last_step = step
        options = self.options
        own = [self.base_lr if lr is None else float(lr) for lr in group_lrs]
        if options.name == "none":
            return own
        if options.name == "cosine":  # not DeepSpeed's: a group's lr follows the schedule in proportion
            lr = self._cosine(step, self.peak_lr)
            return [
                lr if g is None else lr * (float(g) / self.base_lr if self.base_lr > 0 else 1.0)
                for g in group_lrs
            ]
        # DeepSpeed clamps warmup to >= 2 steps (log(1) would divide by zero).
        warmup = max(2, options.warmup_num_steps)
        if options.name == "WarmupCosineLR":
            if step == 0:  # the lr DeepSpeed's scheduler sets at construction (last_batch_iteration == -1)
                return [0.0 for _ in own]
            ratio = self._warmup_cosine_ratio(step - 1, warmup)
            return [lr * ratio for lr in own]
        # DeepSpeed's _format_param: a scalar is broadcast to every group, a list gives one value per group
        self.check_groups(len(own), f"the {len(own)} group lrs given to lrs_at")
        mins = _per_group(options.warmup_min_lr, len(own))
        peaks = own if options.warmup_max_lr is None else _per_group(options.warmup_max_lr, len(own))
        if step == 0:
            return list(mins)
        step -= 1  # DeepSpeed's last_batch_iteration when step k+1 runs
        if step < warmup:
            gamma = self._warmup_gamma(step, warmup)
        elif options.name == "WarmupLR":
            gamma = 1.0
        else:
            total = options.total_num_steps
            gamma = max(0.0, float(total - step) / float(max(1.0, total - warmup)))
        # DeepSpeed: min_lr + delta_lr * gamma, delta_lr = max_lr - min_lr computed once (the same floats)
        return [min_lr + (peak - min_lr) * gamma for min_lr, peak in zip(mins, peaks, strict=True)]

    def _warmup_cosine_ratio(self, step: int, warmup: int) -> float:
        options = self.options
        if step < warmup:
            return options.warmup_min_ratio + self._warmup_gamma(step, warmup) * (
                1.0 - options.warmup_min_ratio
            )
        real_step = step - warmup + 1
        real_total = max(1, options.total_num_steps - warmup)
        ratio = (1 + math.cos(math.pi * min(1.0, real_step / real_total))) / 2
        return max(0.0, options.cos_min_ratio + (1.0 - options.cos_min_ratio) * ratio)

    def _cosine(self, step: int, peak: float) -> float:
        # nanoGPT: linear warmup to the peak, cosine down to cos_min_ratio * peak, flat after total steps.
        options = self.options
        total, warmup = options.total_num_steps, options.warmup_num_steps
        min_lr = options.cos_min_ratio * peak
        if step < warmup:
            return peak * (step + 1) / (warmup + 1)
        if step >= total:
            return min_lr
        progress = (step - warmup) / max(1, total - warmup)
        return min_lr + 0.5 * (1.0 + math.cos(math.pi * progress)) * (peak - min_lr)

    def state_dict(self) -> dict:
        return {"name": self.options.name, "last_step": self.last_step}

    def load_state_dict(self, state: dict) -> None:
        if state.get("name") != self.options.name:
            raise ValueError(
                f"checkpoint scheduler is {state.get('name')!r} but this run uses {self.options.name!r}; "
                "the lr depends only on the step, so set scheduler.name to match or start a new run"
            )
        self.last_step = int(state["last_step"])


def _per_group(value, num_groups: int) -> list[float]:
    """One value per group: a list as given (its length is group_count_error's), a number broadcast."""
    if isinstance(value, (tuple, list)):
        return [float(v) for v in value]
    return [float(value)] * num_groups


def group_count_error(options: SchedulerOptions, num_groups: int, groups: str) -> str | None:
    """The message for a per-group list whose length is not `num_groups` (None when every list fits)."""
    if options.name not in ("WarmupLR", "WarmupDecayLR"):
        return None
    for key in ("warmup_min_lr", "warmup_max_lr"):
        value = getattr(options, key)
        if isinstance(value, (tuple, list)) and len(value) != num_groups:
            listed = ", ".join(repr(v) for v in value)
            return (
                f"scheduler.params.{key} is a list of {len(value)} value{'s' if len(value) != 1 else ''} "
                f"([{listed}]) but the optimizer has {num_groups} param group{'s' if num_groups != 1 else ''} "
                f"({groups}); give one value per param group, in the groups' order, or a single number for "
                "all of them (DeepSpeed's _format_param refuses a list of another length too)"
            )
    return None


def groups_description(client_groups, decay_1d: bool) -> str:
    """What the engine's param groups are, for group_count_error's message."""
    if client_groups is not None:
        return "the groups of model_parameters"
    if decay_1d:
        return "the default groups: 1, every param decayed, as train.weight_decay_1d is true"
    return "the default groups: 2, decay and no-decay; 1 with train.weight_decay_1d: true"
