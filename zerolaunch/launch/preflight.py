"""Checks made in the launcher before any worker starts: what would otherwise fail in every worker at once.

`preflight(recipe, resume)` raises a UserError (one paragraph, exit 2) naming the recipe file, the key and the
fix for: a `--resume PATH` that is not a checkpoint, a model builder that does not return an nn.Module or
whose model has no trainable parameters (built on the meta device, so a 7B model costs nothing), a `peft:`
block naming modules the model does not have, an HF
`model.args.path` that is not a local model directory, a per-group scheduler list (warmup_min_lr /
warmup_max_lr) whose length is not the built-in loop's number of param groups, and a data builder that
raises, returns no iterable or yields nothing (rank 0's iterable is built and one batch drawn, on the CPU, in a thread given
DATA_PROBE_SECONDS: a builder that reads a large corpus or loads a tokenizer for longer is not judged, and
the run goes on with a note); also a resume on other data than the checkpoint was trained on
(data/identity.py; unless data.allow_change), and a prepared folder whose tokenizer is larger than the
model's vocabulary. It writes nothing. It does not own the recipe's own validation (config/, which
also imports both builders) nor the errors only a worker can meet (those come back through the worker's
error record).
"""

from __future__ import annotations

import threading
import traceback
from pathlib import Path

from zerolaunch.checkpoint.errors import CheckpointError
from zerolaunch.checkpoint.manifest import read_manifest as read_checkpoint_manifest
from zerolaunch.config.builders import import_builder
from zerolaunch.config.errors import UserError
from zerolaunch.data.identity import IDENTITY_KEY, data_identity, identity_changes, refusal
from zerolaunch.data.manifest import read_manifest as read_data_manifest
from zerolaunch.data.readers import DataError
from zerolaunch.models.peft import target_problem
from zerolaunch.zero.plan import default_num_groups
from zerolaunch.zero.sched import group_count_error, groups_description

HF_BUILDER = "zerolaunch.models.hf:build"
GPT_BUILDER = "zerolaunch.models.gpt:build"
TOKENS_BUILDER = "zerolaunch.data.tokens:build"
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
        check_data_unchanged(recipe, resume, where)
        check_vocab_fits(recipe, where)
        note = check_data_yields(recipe, world_size, where)
        if note:
            notes.append(note)
    return notes


def check_resume(resume: str) -> None:
    # lazy: it imports torch, which the launcher does not need until here
    from zerolaunch.checkpoint.save import resolve_checkpoint

    path = Path(resume)
    if not path.exists():
        raise UserError(
            f"--resume {resume}: no such file or folder. Pass a checkpoint folder (step_000123/), the "
            "checkpoint.dir of a run (its `latest` is used), or `--resume auto`."
        )
    resolve_checkpoint(path)  # a CheckpointError (exit 2) when it holds no checkpoint


def check_data_unchanged(recipe, resume: str | None, where: str) -> None:
    """The checkpoint a resume would load was trained on this recipe's data (its recorded identity), or
    data.allow_change is set. Reads the checkpoint's manifest only; a checkpoint that cannot be read, or was
    written before identities existed, is left to the worker's load."""
    if resume is None or recipe.data.allow_change:
        return
    # lazy: it imports torch, which the launcher does not need until here
    from zerolaunch.checkpoint.save import latest_checkpoint, resolve_checkpoint

    try:
        if resume == "auto":
            root = Path(recipe.checkpoint.dir or Path(recipe.train.run_dir) / "checkpoints")
            folder = latest_checkpoint(root) if root.is_dir() else None
        else:
            folder = resolve_checkpoint(Path(resume))
        if folder is None:
            return
        manifest = read_checkpoint_manifest(folder)
    except CheckpointError:
        return
    extra = manifest.ranks[0].extra if manifest.ranks else {}
    current = data_identity(recipe.data.builder, dict(recipe.data.args), recipe.train.seed)
    changes = identity_changes(extra.get(IDENTITY_KEY), current)
    if changes:
        shown = resume if resume != "auto" else f"auto ({folder})"
        raise UserError(refusal(changes, shown, where, int(extra.get("train_step", manifest.step))))


def model_vocab_size(recipe) -> tuple[int, str] | None:
    """(vocabulary size, where it was read) of the built-in GPT or a Hugging Face model; None for a model
    whose vocabulary is not known without building it (a user builder, an inline config without one)."""
    args = recipe.model.args
    if recipe.model.builder == GPT_BUILDER:
        if "vocab_size" in args:
            return int(args["vocab_size"]), "model.args.vocab_size"
        import inspect

        # lazy: it imports torch, which the launcher does not need until here
        from zerolaunch.models.gpt import build

        default = inspect.signature(build).parameters["vocab_size"].default
        return int(default), "the built-in GPT's default, model.args.vocab_size being unset"
    if recipe.model.builder != HF_BUILDER:
        return None
    if "path" in args:
        import json

        where = Path(str(args["path"])) / "config.json"
        try:
            config = json.loads(where.read_text())
        except (OSError, ValueError):
            return None
        where = f"vocab_size in {where}"
    elif isinstance(args.get("config"), dict):
        config, where = args["config"], "model.args.config.vocab_size"
    else:
        return None
    text_config = config.get("text_config") if isinstance(config, dict) else None
    vocab = config.get("vocab_size") if isinstance(config, dict) else None
    if vocab is None and isinstance(text_config, dict):  # a multimodal config keeps the text model's apart
        vocab = text_config.get("vocab_size")
    if isinstance(vocab, bool) or not isinstance(vocab, int):
        return None
    return vocab, where


def check_vocab_fits(recipe, where: str) -> None:
    """A prepared folder's token ids fit the model's embedding: its tokenizer (manifest.json) is not larger
    than the model's vocabulary, which would end in an IndexError in every worker's first forward."""
    if recipe.data.builder != TOKENS_BUILDER:
        return
    model = model_vocab_size(recipe)
    if model is None:
        return
    model_vocab, model_where = model

    folders = [
        ("data.args.path", recipe.data.args.get("path")),
        ("data.eval.path", recipe.data.eval.get("path")),
    ]
    for key, folder in folders:
        if folder is None:
            continue
        try:
            tokenizer = read_data_manifest(folder).get("tokenizer") or {}
        except (DataError, OSError, ValueError):
            continue  # not a readable prepared folder: the data check below reports it
        data_vocab = tokenizer.get("vocab_size")
        if isinstance(data_vocab, bool) or not isinstance(data_vocab, int) or data_vocab <= model_vocab:
            continue
        fix = (
            f"Set model.args.vocab_size: {data_vocab} (or more)"
            if recipe.model.builder == GPT_BUILDER
            else "Use the model's own tokenizer, or resize the model's embeddings to it "
            "(model.resize_token_embeddings, then save_pretrained)"
        )
        raise UserError(
            f"{where}: {key} {folder} was prepared with a tokenizer of {data_vocab:,} tokens (its "
            f"manifest.json, tokenizer.vocab_size), but the model's vocabulary has {model_vocab:,} "
            f"({model_where}): token ids from {model_vocab:,} up have no embedding row, and every worker "
            f"would fail with an IndexError. {fix}, or prepare the data again with a tokenizer of at most "
            f"{model_vocab:,} tokens."
        )


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
