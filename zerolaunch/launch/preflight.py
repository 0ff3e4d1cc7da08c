"""Checks made in the launcher before any worker starts: what would otherwise fail in every worker at once.

`preflight(recipe, resume)` raises a UserError (one paragraph, exit 2) naming the recipe file, the key and the
fix for: a `--resume PATH` that is not a checkpoint, a model builder that does not return an nn.Module or
whose model has no trainable parameters (built on the meta device, so a 7B model costs nothing), and an HF
`model.args.path` that is not a local model directory. It writes nothing. It does not own the recipe's own
validation (config/) nor the errors only a worker can meet (those come back through the worker's error
record). The data builder is only imported (config/ does that): its first batch is not drawn here, because
a builder may read a corpus or a tokenizer (seconds to minutes) and start threads, once per launch.
"""

from __future__ import annotations

from pathlib import Path

from zerolaunch.config.errors import UserError

HF_BUILDER = "zerolaunch.models.hf:build"


def preflight(recipe, resume: str | None) -> None:
    where = recipe.source or "the recipe"
    if resume not in (None, "auto"):
        check_resume(resume)
    if recipe.model.builder == HF_BUILDER and "path" in recipe.model.args:
        check_hf_path(recipe.model.args["path"], where)
        return  # from_pretrained on meta reads the config only; the path check is what matters here
    check_model_on_meta(recipe, where)


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
