"""Validation in the built-in loop: `data.eval`, `train.eval_every`, `train.eval_batches`, and the best checkpoint.

`Evaluator.run(step)` (COLLECTIVE) runs `train.eval_batches` micro-batches per rank of the eval stream -- the
data builder called with `data.args` updated by `data.eval`, from its first batch every time, so evaluations
compare like with like -- in eval mode without gradients, and returns the mean loss over the tokens that
carry loss on all ranks (the model's summed loss through `num_items_in_batch=1` where it takes one, else the
mean of the batches' losses) and its perplexity exp(loss). `BestTracker` remembers the lowest eval loss of
the run in `checkpoint_root/best.json` (so a resumed run still knows it) for `checkpoint.keep_best`.
This module owns the evaluation and the best-checkpoint bookkeeping; the loop calls it in a few lines.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import replace
from pathlib import Path

import torch
import torch.distributed as dist

from zerolaunch.train.batches import build_data, forward, loss_of, to_device
from zerolaunch.train.loss_norm import labelled_tokens

BEST_FILE = "best.json"


class Evaluator:
    def __init__(self, recipe, ctx, engine, loss_norm):
        self.ctx, self.engine, self.loss_norm = ctx, engine, loss_norm
        self.batches = recipe.train.eval_batches
        self.every = recipe.train.eval_every
        self.last_step = recipe.train.steps
        eval_recipe = replace(
            recipe, data=replace(recipe.data, args={**recipe.data.args, **recipe.data.eval})
        )
        self.data = build_data(eval_recipe, ctx.rank, ctx.world_size)

    def due(self, step: int) -> bool:
        return step % self.every == 0 or step == self.last_step

    def _restart(self):
        if hasattr(self.data, "load_state_dict") and hasattr(self.data, "position"):
            self.data.load_state_dict({"position": 0})
        return iter(self.data)

    def run(self) -> tuple[float, float]:
        """(eval loss, perplexity), the same on every rank. COLLECTIVE."""
        module = self.engine.module
        was_training = module.training
        module.eval()
        total = torch.zeros(2, dtype=torch.float64, device=self.ctx.device)  # (loss sum, weight)
        it = self._restart()
        try:
            with torch.no_grad():
                for _ in range(self.batches):
                    batch = to_device(next(it), self.ctx.device)
                    if self.loss_norm.applies([batch]):
                        ones = torch.ones((), dtype=torch.float32, device=self.ctx.device)
                        loss = loss_of(forward(self.engine, {**batch, "num_items_in_batch": ones}))
                        weight = labelled_tokens(batch, self.loss_norm.model_shifts)
                    else:
                        loss, weight = (
                            loss_of(forward(self.engine, batch)),
                            torch.ones((), device=self.ctx.device),
                        )
                    total += torch.stack([loss.double(), weight.double()])
        finally:
            module.train(was_training)
        if self.ctx.world_size > 1:
            dist.all_reduce(total, op=dist.ReduceOp.SUM, group=self.ctx.group)
        loss_sum, weight = total.tolist()
        loss = loss_sum / weight if weight else float("nan")
        return loss, math.exp(loss) if loss < 700 else float("inf")


class BestTracker:
    """The lowest eval loss seen and the step of its checkpoint, kept in `root/best.json`."""

    def __init__(self, root: Path):
        self.path = Path(root) / BEST_FILE
        self.step: int | None = None
        self.eval_loss = float("inf")
        if self.path.is_file():
            best = json.loads(self.path.read_text())
            self.step, self.eval_loss = int(best["step"]), float(best["eval_loss"])

    def is_better(self, eval_loss: float) -> bool:
        return math.isfinite(eval_loss) and eval_loss < self.eval_loss

    def record(self, step: int, eval_loss: float) -> None:
        """Rank 0: remember the new best (written whole, then renamed)."""
        self.step, self.eval_loss = step, eval_loss
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps({"step": step, "eval_loss": eval_loss}) + "\n")
        os.replace(tmp, self.path)
