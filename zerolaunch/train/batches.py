"""Calling the recipe's builders, and the forward convention of DESIGN.md "User contract".

Owns: building the model and the data iterable from `recipe.model` / `recipe.data`, moving a batch to the
device, calling the model on a batch (dict -> **batch, tuple/list -> *batch, tensor -> batch) and finding
the loss in what it returns (a scalar tensor, or an object / dict with `loss`). Knows no model internals.
"""

from __future__ import annotations

from collections.abc import Iterator

import torch

from zerolaunch.config import import_builder
from zerolaunch.config.errors import UserError


class TrainError(UserError):
    """A recipe's builders or data that the loop cannot train with; the message names the fix."""


def build_model(recipe, *, meta_if_supported: bool = False) -> torch.nn.Module:
    """`model.builder(**model.args)`; on the meta device when asked and the builder sets `fn.meta_init`.

    `fn.meta_init = True` is a builder's promise that every parameter is initialised by a module's
    `reset_parameters()` (the built-in GPT's is), so a stage 3 engine can materialise it one unit at a time
    and no rank ever holds the whole model. Other builders run normally and the engine shards their weights.
    """
    fn = import_builder(recipe.model.builder, recipe.base_dir)
    if meta_if_supported and getattr(fn, "meta_init", False):
        with torch.device("meta"):
            model = fn(**recipe.model.args)
    else:
        model = fn(**recipe.model.args)
    if not isinstance(model, torch.nn.Module):
        raise TrainError(
            f"model.builder {recipe.model.builder!r} returned a {type(model).__name__}, not a torch.nn.Module"
        )
    return model


def build_data(recipe, rank: int, world_size: int):
    fn = import_builder(recipe.data.builder, recipe.base_dir)
    data = fn(
        rank=rank,
        world_size=world_size,
        micro_batch_size=recipe.train.micro_batch_size,
        seed=recipe.train.seed,
        **recipe.data.args,
    )
    if not hasattr(data, "__iter__"):
        raise TrainError(
            f"data.builder {recipe.data.builder!r} returned a {type(data).__name__}, not an iterable"
        )
    return data


class BatchSource:
    """An endless supply of batches from the data iterable, re-iterating it when an epoch ends."""

    def __init__(self, data, builder: str):
        self.data = data
        self.builder = builder
        self.consumed = 0
        """Micro-batches handed out so far on this rank (the data position a checkpoint records)."""
        self._it: Iterator | None = None

    def next(self):
        if self._it is None:
            self._it = iter(self.data)
        try:
            batch = next(self._it)
        except StopIteration:
            self._it = iter(self.data)
            try:
                batch = next(self._it)
            except StopIteration:
                raise TrainError(f"data.builder {self.builder!r} yields no batches on this rank") from None
        self.consumed += 1
        return batch

    def state(self) -> dict:
        state = {"consumed": self.consumed}
        if hasattr(self.data, "state_dict"):
            state["data"] = self.data.state_dict()
        return state

    def restore(self, state: dict) -> None:
        """Continue after `state["consumed"]` batches: load_state_dict, else skip(n), else read and drop."""
        consumed = int(state.get("consumed", 0))
        if "data" in state and hasattr(self.data, "load_state_dict"):
            self.data.load_state_dict(state["data"])
        elif hasattr(self.data, "skip"):
            self.data.skip(consumed)
        else:
            for _ in range(consumed):
                self.next()
        self.consumed = consumed
        self._it = None


def to_device(batch, device: torch.device):
    if isinstance(batch, torch.Tensor):
        return batch.to(device, non_blocking=True)
    if isinstance(batch, dict):
        return {k: to_device(v, device) for k, v in batch.items()}
    if isinstance(batch, (list, tuple)):
        return type(batch)(to_device(v, device) for v in batch)
    return batch


def forward(engine, batch):
    if isinstance(batch, dict):
        return engine(**batch)
    if isinstance(batch, (list, tuple)):
        return engine(*batch)
    return engine(batch)


def loss_of(out) -> torch.Tensor:
    loss = out
    if isinstance(out, dict):
        loss = out.get("loss")
    elif not isinstance(out, torch.Tensor):
        loss = getattr(out, "loss", None)
    if not isinstance(loss, torch.Tensor) or loss.dim() != 0:
        raise TrainError(
            f"the model returned {type(out).__name__} without a scalar loss; return a scalar tensor, or an "
            "object / dict with `loss` (give the data `labels` if the model computes the loss from them)"
        )
    return loss


def tokens_in(batch) -> int | None:
    """Tokens of a batch with `input_ids` (for tokens/s and MFU); None when the batch has no such notion."""
    if isinstance(batch, dict) and isinstance(batch.get("input_ids"), torch.Tensor):
        return int(batch["input_ids"].numel())
    return None
