"""Checks made in the launcher before any worker starts: what would otherwise fail in every worker at once.

`preflight(recipe, resume)` raises a UserError (one paragraph, exit 2) naming the recipe file, the key and the
fix for: a `--resume PATH` that is not a checkpoint, a model builder that does not return an nn.Module or
whose model has no trainable parameters (built on the meta device, so a 7B model costs nothing), a `peft:`
block naming modules the model does not have, an HF
`model.args.path` that is not a local model directory, a per-group scheduler list (warmup_min_lr /
warmup_max_lr) whose length is not the built-in loop's number of param groups, and a data builder that
raises, returns no iterable or yields nothing (rank 0's iterable is built and one batch drawn, on the CPU, in a thread given
DATA_PROBE_SECONDS: a builder that reads a large corpus or loads a tokenizer for longer is not judged, and
the run goes on with a note). It writes nothing. It does not own the recipe's own validation (config/, which
also imports both builders) nor the errors only a worker can meet (those come back through the worker's
error record).
"""

from __future__ import annotations

import threading
import traceback
from pathlib import Path

from zerolaunch.config.errors import UserError

HF_BUILDER = "zerolaunch.models.hf:build"
DATA_PROBE_SECONDS = 30.0
"""How long the launcher waits for the data builder's first batch before it leaves the check to the workers."""


def preflight(recipe, resume: str | None, world_size: int = 1) -> list[str]:
    """Raise a UserError for bad input every worker would meet; returns notes to print (checks not made)."""
    where = recipe.source or "the recipe"
    notes: list[str] = []
    if resume not in (None, "auto"):
        check_resume(resume)
    if recipe.model.builder == HF_BUILDER and "path" in recipe.model.args:
        # from_pretrained on meta reads the config only; the path check is what matters here
        check_hf_path(recipe.model.args["path"], where)
    else:
        check_model_on_meta(recipe, where)
    if recipe.peft is not None:
        check_peft_targets(recipe, where)
    if not recipe.entrypoint:  # an entrypoint script brings its own data; the built-in loop is not used
        check_scheduler_groups(recipe, where)
        note = check_data_yields(recipe, world_size, where)
        if note:
            notes.append(note)
    return notes


def check_resume(resume: str) -> None:
    from zerolaunch.checkpoint.save import resolve_checkpoint

    path = Path(resume)
    if not path.exists():
        raise UserError(
            f"--resume {resume}: no such file or folder. Pass a checkpoint folder (step_000123/), the "
            "checkpoint.dir of a run (its `latest` is used), or `--resume auto`."
        )
    resolve_checkpoint(path)  # a CheckpointError (exit 2) when it holds no checkpoint


def check_hf_path(value, where: str) -> None:
    path = Path(str(value))
    if not path.is_dir():
        raise UserError(
            f"{where}: model.args.path names {path}, which is not a local directory. Give a Hugging Face "
            "model folder (relative paths start at the recipe's folder), or a hub id that is in the local "
            "Hugging Face cache."
        )
    if not (path / "config.json").is_file():
        raise UserError(
            f"{where}: model.args.path names {path}, which has no config.json; point it at a Hugging Face "
            "model folder (the one save_pretrained wrote)."
        )


def check_model_on_meta(recipe, where: str) -> None:
    import torch
    from torch import nn

    from zerolaunch.config.builders import import_builder

    fn = import_builder(recipe.model.builder, recipe.base_dir, key="model.builder")
    try:
        with torch.device("meta"):
            model = fn(**recipe.model.args)
    except Exception:
        # Not every builder can run on meta (one may load weights or call .item()); its real errors are
        # met at build time in the worker and reported from there. Only a clear answer is judged here.
        return
    if not isinstance(model, nn.Module):
        raise UserError(
            f"{where}: model.builder {recipe.model.builder!r} returned a {type(model).__name__}, not a "
            "torch.nn.Module. Make the builder return the model itself."
        )
    if not any(p.requires_grad for p in model.parameters()):
        raise UserError(
            f"{where}: the model of model.builder {recipe.model.builder!r} has no trainable parameters "
            "(none with requires_grad=True), so there is nothing to train. Unfreeze at least one parameter "
            "in the builder."
        )


def check_peft_targets(recipe, where: str) -> None:
    """The `peft:` block's target_modules / modules_to_save against the model's module names, on a model
    built on the meta device (an HF folder: its config only); a builder that cannot run on meta is left to
    the worker, which checks the same before get_peft_model."""
    import torch

    from zerolaunch.config.builders import import_builder
    from zerolaunch.models.peft import target_problem

    fn = import_builder(recipe.model.builder, recipe.base_dir, key="model.builder")
    args = dict(recipe.model.args)
    meta_arg = getattr(fn, "meta_arg", None)
    if meta_arg is not None:
        args.setdefault(meta_arg, True)
    try:
        with torch.device("meta"):
            model = fn(**args)
    except Exception:
        return
    problem = target_problem(model, recipe.peft)
    if problem is not None:
        raise UserError(f"{where}: {problem}")


def check_scheduler_groups(recipe, where: str) -> None:
    """The built-in loop's param groups are the default ones (2: decay and no-decay; 1 with
    train.weight_decay_1d: true), so a per-group warmup_min_lr / warmup_max_lr list of another length is
    refused here, before any worker starts (an entrypoint's groups are its own: its engine checks them)."""
    from zerolaunch.zero.plan import default_num_groups
    from zerolaunch.zero.sched import group_count_error, groups_description

    decay_1d = recipe.engine.optimizer.decay_1d
    message = group_count_error(
        recipe.engine.scheduler, default_num_groups(decay_1d), groups_description(None, decay_1d)
    )
    if message:
        raise UserError(f"{where}: {message}. The built-in training loop always builds the default groups.")


def check_data_yields(
    recipe, world_size: int, where: str, timeout_s: float = DATA_PROBE_SECONDS
) -> str | None:
    """Build rank 0's data iterable as a worker would and draw one batch; a UserError when that fails.

    Runs in a daemon thread so a slow builder costs at most `timeout_s` (then a note is returned and the
    thread is left to finish on its own). The builder gets the same arguments as in the worker; no device is
    involved (batches go to the GPU in the worker's loop, not in the builder)."""
    from zerolaunch.config.builders import import_builder

    spec = recipe.data.builder
    fn = import_builder(spec, recipe.base_dir, key="data.builder")
    outcome: dict = {}

    def probe() -> None:
        try:
            data = fn(
                rank=0,
                world_size=world_size,
                micro_batch_size=recipe.train.micro_batch_size,
                seed=recipe.train.seed,
                **recipe.data.args,
            )
            if not hasattr(data, "__iter__"):
                outcome["not_iterable"] = type(data).__name__
                return
            it = iter(data)
            try:
                next(it)
                outcome["ok"] = True
            except StopIteration:
                outcome["empty"] = True
            finally:
                close = getattr(it, "close", None)  # a generator's `finally` blocks run now, not at exit
                if callable(close):
                    close()
        except BaseException as err:  # reported below, in the launcher's thread
            outcome["error"] = err

    thread = threading.Thread(target=probe, name="zerolaunch-data-probe", daemon=True)
    thread.start()
    thread.join(timeout_s)
    if thread.is_alive():
        return (
            f"note: data.builder {spec!r} gave no batch within {timeout_s:.0f} s in the launcher's check; "
            "not checked here (the workers will meet any error)"
        )
    key = f"data.builder {spec!r}"
    if "not_iterable" in outcome:
        raise UserError(
            f"{where}: {key} returned a {outcome['not_iterable']}, not an iterable of batches. Make the builder "
            "return a list, a generator, a DataLoader or any object with __iter__."
        )
    if "empty" in outcome:
        raise UserError(
            f"{where}: {key} yields no batches for rank 0 of {world_size} (data.args "
            f"{_short(recipe.data.args)}, micro_batch_size {recipe.train.micro_batch_size}). Give it more "
            "data, or a smaller micro_batch_size / sequence length."
        )
    err = outcome.get("error")
    if err is not None:
        if isinstance(err, UserError):
            raise err
        raise UserError(
            f"{where}: {key} failed while building its data or drawing the first batch: "
            f"{type(err).__name__}: {err}{_raised_at(err)}. Fix the builder or data.args "
            f"({_short(recipe.data.args)}); every worker would fail the same way."
        )
    return None


def _raised_at(err: BaseException) -> str:
    frames = traceback.extract_tb(err.__traceback__)
    if not frames or frames[-1].filename == __file__:
        return ""  # raised by the call itself (e.g. an unexpected keyword argument): data.args names it
    last = frames[-1]
    return f" (raised at {last.filename}:{last.lineno}, in {last.name})"


def _short(value, limit: int = 200) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."
