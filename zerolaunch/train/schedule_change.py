"""A resume whose lr schedule spans another number of steps than the run it continues.

The lr is a pure function of the step and the schedule's total (zero/sched.py). Raising `train.steps` on a
resume stretches a decaying schedule (cosine, WarmupDecayLR, WarmupCosineLR) after the fact, so the lr jumps
at the resume step, up from near its floor towards the peak. That may be wanted (training longer) but must
not be silent: the checkpoint records the total it ran with, and the resume names both totals and the jump."""

from __future__ import annotations

from dataclasses import replace

from zerolaunch.zero.sched import LRSchedule


def record(engine) -> dict | None:
    """What a checkpoint keeps of the schedule: its total steps (None where the engine's schedule is not a
    step-count schedule of its own, e.g. one the HF Trainer drives)."""
    scheduler = getattr(engine, "scheduler", None)
    if not isinstance(scheduler, LRSchedule):
        return None
    return {"total_num_steps": scheduler.options.total_num_steps}


def change_line(saved: dict | None, engine, step: int) -> str | None:
    """One line naming the old and new total steps and the lr at the resume step under each, or None when
    the total did not change (or the checkpoint predates the record)."""
    scheduler = getattr(engine, "scheduler", None)
    if not saved or not isinstance(scheduler, LRSchedule):
        return None
    old_total, new_total = saved.get("total_num_steps"), scheduler.options.total_num_steps
    if old_total is None or new_total is None or old_total == new_total:
        return None
    try:
        before = LRSchedule(replace(scheduler.options, total_num_steps=old_total), scheduler.base_lr).lr_at(
            step
        )
    except ValueError:  # the old total is not valid with today's other settings: name the totals only
        before = None
    after = scheduler.lr_at(step)
    jump = f": the lr at step {step} goes from {before:.3g} to {after:.3g}" if before is not None else ""
    if before is not None and before == after:
        return None
    return (
        f"warning: the lr schedule now spans {new_total} steps, the checkpoint's run {old_total}{jump} (the "
        f"schedule is stretched after the fact). Resume with train.steps={old_total} to continue as before."
    )
