"""The loss normalized over the whole global batch: every micro-step, every rank, over the tokens that carry loss.

[Note: global loss normalization] A step's gradient should be the gradient of ONE mean: the sum of the token
losses of all `gradient_accumulation_steps` micro-batches on all ranks, divided by the number N of tokens
that carry loss in all of them. Averaging per-micro-batch means instead weighs a token of a micro-batch with
few labelled tokens (an SFT row that is mostly prompt) more than one of a full micro-batch (the
`num_items_in_batch` fix of Hugging Face's Trainer). The engine divides each backward by
`gradient_accumulation_steps` (G) and averages gradients over `world_size` (W) ranks, so the loop draws the
step's G micro-batches first, counts their labelled tokens, all-reduces the sum N (one int64 all-reduce, kept
on the device: nothing is read by the host), and passes each forward `num_items_in_batch = N / (G * W)`; the
model returns sum(token losses) / num_items_in_batch, and (1/W) sum_ranks (1/G) sum_micro of that is
sum(all token losses) / N. Applies when every batch is a dict with `labels` and the model's forward takes
`num_items_in_batch` (the built-in GPT; Hugging Face causal LMs, through their **kwargs loss arguments).
Other models keep the per-micro-batch mean. The loss the loop reports is then the global token mean too.

A `zerolaunch.initialize` user does the same by hand (docs/data.md): count labelled tokens of the step's
micro-batches, all-reduce the sum, and call `model(**batch, num_items_in_batch=N / (G * W))` or scale a
summed loss by G * W / N before `engine.backward`.

This module owns that rule and the labels convention check; the loop calls it in a few lines.
"""

from __future__ import annotations

import inspect

import torch
import torch.distributed as dist

from zerolaunch.util.errors import TrainError

IGNORE = -100


def model_shifts_labels(model) -> bool:
    """Hugging Face causal LMs shift labels themselves (labels == input_ids); the built-in GPT does not."""
    return hasattr(model, "loss_function") and hasattr(model, "config")


def accepts_num_items(model) -> bool:
    if getattr(model, "accepts_loss_kwargs", True) is False:  # HF models whose loss ignores the kwarg
        return False
    try:
        params = inspect.signature(model.forward).parameters.values()
    except (TypeError, ValueError):
        return False
    return any(p.name == "num_items_in_batch" or p.kind is p.VAR_KEYWORD for p in params)


def check_label_shift(data, model, builder: str) -> None:
    """A data stream that says how its labels align (`label_shift`) must match the model's convention."""
    shift = getattr(data, "label_shift", None)
    if shift is None:
        return
    model_shifts = model_shifts_labels(model)
    if shift == "data" and model_shifts:
        raise TrainError(
            f"data.builder {builder!r} gives labels already shifted (data.args.label_shift: data) but the model "
            "shifts labels itself (a Hugging Face model); set data.args.label_shift: model"
        )
    if shift == "model" and not model_shifts:
        raise TrainError(
            f"data.builder {builder!r} gives labels aligned with input_ids (data.args.label_shift: model) but "
            "the model expects them shifted (the built-in GPT); set data.args.label_shift: data"
        )


def labelled_tokens(batch: dict, model_shifts: bool) -> torch.Tensor:
    """Tokens of `batch` whose target carries loss (a 0-dim int64 tensor on the batch's device)."""
    labels = batch.get("shift_labels")
    if labels is None:
        labels = batch["labels"]
        if model_shifts:
            labels = labels[..., 1:]  # the model predicts labels[t] at t-1: labels[..., 0] is nobody's target
    return (labels != IGNORE).sum()


class GlobalLossNorm:
    """`num_items_in_batch` for a step's micro-batches ([Note: global loss normalization])."""

    def __init__(self, model, *, world_size: int, gradient_accumulation_steps: int, group=None):
        self.model_shifts = model_shifts_labels(model)
        self.enabled = accepts_num_items(model)
        self.world_size, self.gas, self.group = world_size, gradient_accumulation_steps, group

    def applies(self, batches: list) -> bool:
        return self.enabled and all(
            isinstance(b, dict)
            and isinstance(b.get("labels"), torch.Tensor)
            and "num_items_in_batch" not in b
            for b in batches
        )

    def num_items(self, batches: list) -> torch.Tensor:
        """N / (G * W) as a float32 tensor on the batches' device; COLLECTIVE (one all-reduce)."""
        total = torch.stack([labelled_tokens(b, self.model_shifts) for b in batches]).sum()
        if self.world_size > 1:
            dist.all_reduce(total, op=dist.ReduceOp.SUM, group=self.group)
        # a global batch without any labelled token gives loss 0 and zero gradients, not 0/0
        return total.clamp(min=1).to(torch.float32) / (self.gas * self.world_size)

    def with_items(self, batches: list) -> list:
        """The batches, each with num_items_in_batch, when the rule applies; else as they are."""
        if not self.applies(batches):
            return batches
        items = self.num_items(batches)
        return [{**b, "num_items_in_batch": items} for b in batches]
