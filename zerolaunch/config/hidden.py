"""The model hidden size h that a bucket "auto" needs (reduce_bucket_size = h*h, and so on, as Hugging Face).

This module owns where h is read from: the model a caller already holds (`ModelHidden`, the Hugging Face
door's), else model.args, an inline Hugging Face config, a local model folder's config.json, or the built-in
GPT's size table (models/gpt_sizes.py, torch-free). It does not own the autos themselves
(config/engine_options.py) nor the train section's (auto.py).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path as FsPath

from zerolaunch.models.gpt_sizes import SIZES

from .schema import DEFAULT_MODEL_BUILDER
from .tree import MISSING, Path
from .values import Resolver

HIDDEN_KEYS = ("d_model", "hidden_size", "n_embd")


@dataclass(frozen=True)
class ModelHidden:
    """The hidden size of the model a caller trains, read from that model: it stands in for the recipe's
    model section, which a DeepSpeed config handed over with a model (the Hugging Face door) does not have."""

    size: int | None
    """None: the model has no hidden size, so a bucket "auto" cannot be resolved."""
    source: str
    """Where it was read, as the recipe table shows it: "the model's config.hidden_size"."""


def hidden_size(r: Resolver, for_path: Path, model: ModelHidden | None = None) -> tuple[int, str]:
    """The model hidden size h for a bucket "auto": the caller's model, else model.args, else the built-in GPT
    size table."""
    if model is not None:
        if model.size is None:
            raise r.fail(
                for_path,
                f'is "auto", which needs the model hidden size, and {model.source} has none',
                f"Give {for_path[-1]} a number",
            )
        return model.size, model.source
    args = r.raw(("model", "args"))
    args = args if isinstance(args, dict) else {}
    for key in HIDDEN_KEYS:
        if key in args:
            h = r.convert(("model", "args", key), args[key], "int", min=1)
            return h, f"model.args.{key}"
    # A Hugging Face model: an inline `config:` mapping, or a local model folder's config.json.
    inline = args.get("config")
    if isinstance(inline, dict):
        for key in HIDDEN_KEYS:
            if key in inline:
                h = r.convert(("model", "args", "config", key), inline[key], "int", min=1)
                return h, f"model.args.config.{key}"
    folder = args.get("path")
    if isinstance(folder, str):
        found = _hf_config_hidden(FsPath(folder))
        if found is not None:
            return found, f"{folder}/config.json"
    builder = r.raw(("model", "builder"))
    if builder in (MISSING, DEFAULT_MODEL_BUILDER):
        size = args.get("size", "tiny")
        table = gpt_hidden_sizes()
        if size in table:
            return table[size], f"built-in GPT size {size!r}"
        raise r.fail(
            ("model", "args", "size"),
            f"is {size!r}, not a built-in GPT size",
            f"Use one of {', '.join(table)}",
        )
    raise r.fail(
        for_path,
        'is "auto", which needs the model hidden size, and it is unknown for this model',
        f"Set model.args.d_model (or hidden_size / n_embd), or give {for_path[-1]} a number",
    )


def _hf_config_hidden(folder: FsPath) -> int | None:
    try:
        config = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    for key in HIDDEN_KEYS:
        value = config.get(key) if isinstance(config, dict) else None
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
    return None


def gpt_hidden_sizes() -> dict[str, int]:
    """d_model per size of the built-in GPT (models/gpt_sizes.py, the table gpt.py builds from)."""
    return {name: spec["d_model"] for name, spec in SIZES.items()}
