"""The loop's checkpoint hook: where `zerolaunch.checkpoint` plugs in, and nothing else.

`CheckpointHook.resume(...)` picks what to resume from (--resume auto|PATH, or `latest` after an elastic
restart) and loads it; `maybe_save(step)` saves every `checkpoint.every` steps and `save(step)` at the end.
Each rank saves its own shard and its `extra`: the loop step, RNG streams, data position and the data's
identity (data/identity.py). A resume on other data is refused unless data.allow_change; the launcher's
pre-flight makes the same check first, this one is the safety net (an elastic restart, a direct worker).
"""

from __future__ import annotations

from pathlib import Path

import torch

from zerolaunch.checkpoint import CheckpointError, latest_checkpoint, load_checkpoint, save_checkpoint
from zerolaunch.checkpoint.extra import HF_CONFIG_KEY, HF_PEFT_KEY, HF_TOKENIZER_KEY
from zerolaunch.checkpoint.hf_folder import recipe_tokenizer_dir
from zerolaunch.checkpoint.load import check_compatible
from zerolaunch.checkpoint.reader import CheckpointReader
from zerolaunch.checkpoint.save import complete_checkpoints, remove_tree, resolve_checkpoint
from zerolaunch.data.identity import IDENTITY_KEY, data_identity, identity_changes, refusal
from zerolaunch.models.hf import hf_config_dict
from zerolaunch.models.peft import adapter_record, is_peft_model
from zerolaunch.train import schedule_change, seeding
from zerolaunch.train.evaluate import BestTracker
from zerolaunch.util.errors import TrainError


def checkpoint_root(recipe) -> Path:
    return (
        Path(recipe.checkpoint.dir) if recipe.checkpoint.dir else Path(recipe.train.run_dir) / "checkpoints"
    )


def _would_load(folder: Path, specs) -> bool:
    """Whether `folder` passes what a load checks before it reads tensors: the manifest (and its crc32),
    every rank file's size and header, and the model's params (names, shapes, trainable)."""
    try:
        with CheckpointReader(folder) as reader:
            check_compatible(reader, specs)
    except CheckpointError:
        return False
    return True


def _other_checkpoint(path: Path, specs) -> str:
    """Where else to resume from when `path` cannot be loaded: the newest other complete checkpoint that
    would pass the same checks with this model (a suggestion that fails the same way helps nobody), or
    that none would."""
    try:
        folder = resolve_checkpoint(path)
    except Exception:  # the path itself is what is broken: the error already says so
        return ""
    others = [p for _, p in complete_checkpoints(folder.parent) if p != folder]
    for other in reversed(others):  # newest first: checking stops at the first that would load
        if _would_load(other, specs):
            return f" The newest other complete checkpoint is {other.name}: resume from it with --resume {other}."
    if not others:
        return ""
    return (
        f" None of the {len(others)} other complete checkpoint(s) in {folder.parent} would load either (each "
        "was checked against this model's params and its own files): resume with the model.args of the run "
        "that saved them, or train from the start without --resume (a fresh --run-dir, or --restart)."
    )


class CheckpointHook:
    def __init__(self, recipe, engine, ctx, source):
        self.root = checkpoint_root(recipe)
        self.every = recipe.checkpoint.every
        self.keep = recipe.checkpoint.keep or None  # 0 = keep all
        self.best = None
        if recipe.checkpoint.keep_best:
            self.best = BestTracker(self.root)
        self.engine = engine
        self.ctx = ctx
        self.source = source
        self.last_saved_step: int | None = None
        self.data_identity = data_identity(recipe.data.builder, dict(recipe.data.args), recipe.train.seed)
        self.allow_data_change = recipe.data.allow_change
        self.recipe_file = recipe.source or "the recipe"
        self.data_changes: list = []
        """(field, saved, current) of a resume on other data that data.allow_change let through."""
        # the tokenizer the recipe names travels (as a path) with the weights: convert copies its files
        self.tokenizer_dir = recipe_tokenizer_dir(dict(recipe.model.args), dict(recipe.data.args))

    def resume_path(self) -> Path | None:
        """The checkpoint to start from, or None for a fresh start."""
        wanted = self.ctx.resume
        if wanted is None and self.ctx.restart_count > 0:
            wanted = "auto"  # an elastic restart continues from where the crashed attempt last saved
        if wanted is None:
            return None
        if wanted == "auto":
            return latest_checkpoint(self.root) if self.root.exists() else None
        path = Path(wanted)
        if not path.exists():
            raise TrainError(
                f"--resume {wanted}: no such checkpoint; pass a checkpoint folder, its root, or auto"
            )
        return path

    def resume(self) -> int:
        """Load the checkpoint to resume from, if any; returns the loop step it was saved at (0 = fresh)."""
        path = self.resume_path()
        if path is None:
            return 0

        try:
            extra = load_checkpoint(
                self.engine, path, group=self.ctx.group, verify=self.ctx.verify_checkpoints
            )
        except CheckpointError as err:
            other = _other_checkpoint(path, self.engine.param_specs())
            if not other:
                raise
            raise CheckpointError(err.message.rstrip(". ") + "." + other) from None
        step = int(extra.get("train_step", self.engine.global_steps))
        changes = identity_changes(extra.get(IDENTITY_KEY), self.data_identity)
        if changes and not self.allow_data_change:
            raise TrainError(refusal(changes, str(path), self.recipe_file, step))
        self.data_changes = changes
        if "data" in extra:
            self.source.restore(extra["data"])
        else:
            self.source.restore({"consumed": step * self.engine.options.gradient_accumulation_steps})
        if "rng" in extra and extra.get("rank") == self.ctx.rank:
            # another world size hands ranks beyond the saved ones rank 0's extra: keep the fresh RNG then
            seeding.set_rng_state(extra["rng"], self.ctx.device)
        if self.ctx.is_rank0:
            print(f"resumed from {path} at step {step}", flush=True)
            changed = schedule_change.change_line(extra.get("schedule"), self.engine, step)
            if changed:
                print(changed, flush=True)
        return step

    def maybe_save(self, step: int, eval_loss: float | None = None) -> None:
        """Save every `checkpoint.every` steps, and (checkpoint.keep_best) at a new best eval loss."""
        new_best = self.best is not None and eval_loss is not None and self.best.is_better(eval_loss)
        if new_best and self.ctx.is_rank0:
            self.best.record(step, eval_loss)
        elif new_best:
            self.best.step, self.best.eval_loss = step, eval_loss
        if (self.every and step % self.every == 0) or new_best:
            self.save(step)

    def save(self, step: int) -> None:
        if self.last_saved_step == step:
            return

        extra = {
            "train_step": step,
            "rank": self.ctx.rank,
            "data": self.source.state(),
            "rng": seeding.rng_state(self.ctx.device),
            IDENTITY_KEY: self.data_identity,
            "schedule": schedule_change.record(self.engine),
        }
        if self.ctx.is_rank0:
            # a Hugging Face model's config travels with the weights, so convert-checkpoint can write a folder
            # that from_pretrained loads (config.json + model.safetensors).

            model = self.engine.module
            peft = is_peft_model(model)
            hf_config = hf_config_dict(model.get_base_model() if peft else model)
            if hf_config is not None:
                extra[HF_CONFIG_KEY] = hf_config
            if peft:  # convert-checkpoint writes its adapter folder, or the merged model
                extra[HF_PEFT_KEY] = adapter_record(model)
            if self.tokenizer_dir is not None:
                extra[HF_TOKENIZER_KEY] = str(self.tokenizer_dir)
        if self.ctx.device.type == "cuda":
            torch.cuda.synchronize(self.ctx.device)
        keep = self.keep if self.best is None else None  # keep_best prunes below, sparing the best
        save_checkpoint(self.engine, self.root, step=step, extra=extra, keep=keep, group=self.ctx.group)
        self.last_saved_step = step
        if self.best is not None and self.keep and self.ctx.is_rank0:
            self._prune_sparing_best(step)

    def _prune_sparing_best(self, step: int) -> None:
        """The newest `keep` checkpoints stay, and the best one beside them."""
        spared = {step, self.best.step}
        older = [p for s, p in complete_checkpoints(self.root) if s not in spared]
        for path in older[: max(0, len(older) - (self.keep - 1))]:
            remove_tree(path)
