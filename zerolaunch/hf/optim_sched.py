"""The Trainer's optimizer and lr scheduler over zerolaunch's engine, decided in one place (`zero_optim_sched`),
as transformers' `deepspeed_optim_sched` (integrations/deepspeed.py) decides them for DeepSpeed.

The engine owns the real optimizer and steps it at the accumulation boundary; the Trainer gets a
`ZeroOptimizer` whose `param_groups` carry each engine group's lr (what callbacks and torch's schedulers read
and write) and whose step does nothing (DeepSpeed's DummyOptim / optimizer wrapper). The lr: a config with a
`scheduler` block runs the engine's schedule (DeepSpeed's formulas) and the Trainer's `lr_scheduler` is an
`EngineLRScheduler` that does nothing (DeepSpeed's DummyScheduler); without one, the Trainer's own
`lr_scheduler_type` + warmup runs over the ZeroOptimizer's groups and the engine reads each group's lr from
them at every step (`TrainerSchedule`, installed with Engine.set_schedule). Either way the same steps: the
Trainer steps its scheduler only after a step that was not skipped.
"""

from __future__ import annotations

from dataclasses import replace

import torch

from zerolaunch.zero.sched import LRSchedule


class ZeroOptimizer(torch.optim.Optimizer):
    """The Trainer's `optimizer`: one group per engine group over one dummy tensor each, whose lr a torch
    scheduler writes and the engine reads (TrainerSchedule); the step already ran in the engine at the
    accumulation boundary (the accelerator's backward), so `step()` moves nothing. Stepping it still tells
    torch's scheduler that the optimizer stepped before it (its order check)."""

    def __init__(self, group_lrs: list[float]):
        groups = [{"params": [torch.zeros(1, requires_grad=True)], "lr": lr} for lr in group_lrs]
        super().__init__(groups, {"lr": group_lrs[0]})

    @torch.no_grad()
    def step(self, closure=None):
        return None

    def zero_grad(self, set_to_none: bool = True) -> None:
        return None

    def state_dict(self) -> dict:
        return {}  # the engine's checkpoint holds the optimizer state

    def load_state_dict(self, state_dict) -> None:
        return None


class TrainerSchedule:
    """The engine's lr schedule (zero/sched.py Schedule) when the Trainer's scheduler runs: each group's lr
    as the scheduler set it in the ZeroOptimizer's groups."""

    def __init__(self, optimizer: ZeroOptimizer):
        self.optimizer = optimizer

    def lrs_at(self, step: int, group_lrs) -> list[float]:
        return [float(g["lr"]) for g in self.optimizer.param_groups]

    def state_dict(self) -> dict:
        # the Trainer's scheduler.pt holds the schedule; the engine's own record says it has none
        return {"name": "none", "last_step": -1}

    def load_state_dict(self, state: dict) -> None:
        return None


class EngineLRScheduler:
    """The Trainer's `lr_scheduler` when the config has a `scheduler` block: the engine's schedule runs, so
    `step()` does nothing (DeepSpeed's scheduler wrapper); get_last_lr is the lr of the next step."""

    def __init__(self, engine):
        self.engine = engine

    def step(self, *args, **kwargs) -> None:
        return None

    def get_last_lr(self) -> list[float]:
        return self.engine.lrs_at(self.engine.global_steps)

    def state_dict(self) -> dict:
        return {}

    def load_state_dict(self, state) -> None:
        return None


def zero_optim_sched(trainer, engine, config: dict, options, num_training_steps: int):
    """-> (optimizer, lr_scheduler) for the Trainer, with the engine's schedule installed to match.

    config: the filled DeepSpeed config (its `scheduler` block decides whose schedule runs); options: the
    engine options built from it. Replaces what an earlier call installed (evaluate() before train())."""
    if "scheduler" in config:
        engine.set_schedule(LRSchedule(options.scheduler, options.optimizer.lr))
        return ZeroOptimizer(engine.lrs_at(0)), EngineLRScheduler(engine)
    # the groups start at their own lrs (a schedule of none), then the Trainer's schedule runs them
    engine.set_schedule(LRSchedule(replace(options.scheduler, name="none"), options.optimizer.lr))
    optimizer = ZeroOptimizer(engine.lrs_at(0))
    trainer.lr_scheduler = None  # create_scheduler builds one only where none is set
    lr_scheduler = trainer.create_scheduler(num_training_steps, optimizer=optimizer)
    engine.set_schedule(TrainerSchedule(optimizer))
    return optimizer, lr_scheduler
