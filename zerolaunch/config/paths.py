"""Path-valued builder args (`model.args`, `data.args`): one rule, the recipe's folder first.

An arg is path-valued by its name: `path`, `paths`, `tokenizer`, or a name ending in `_path`, `_paths`,
`_dir`, `_file` or `_files`; its value a string or a list of strings (top-level args only). For each string:

1. `~` is expanded; an absolute path stays as it is.
2. A relative path that exists under the recipe's folder becomes that absolute path (as `entrypoint:`,
   `deepspeed:` and file builders do), whatever the current directory is. A value given with `--set` starts
   at the current directory instead, as `--set deepspeed=ds.json` does: a path typed on the command line
   means what the shell it was typed in means.
3. A value that is no path there but looks like a Hugging Face hub id (`gpt2`, `org/name`: no leading
   `.`/`/`/`~`, at most one `/`) in a model path or a tokenizer is taken from the local Hugging Face cache
   (its snapshot folder); nothing is downloaded.
4. Otherwise zerolaunch's own builders (which read every such path) refuse it, naming the key, exit 2; a
   user builder gets the value as written (it may name a folder the builder creates, or a hub id or dataset
   name the builder fetches itself).

Owns only the rule; the builders themselves still check what they read (a file vs a folder).
"""

from __future__ import annotations

import os
from pathlib import Path as FsPath
from typing import Any

from .tree import Path
from .values import Resolver

HF_MODEL_BUILDER = "zerolaunch.models.hf:build"
OWN_BUILDERS = frozenset(
    {
        HF_MODEL_BUILDER,
        "zerolaunch.data.text:build",
        "zerolaunch.data.hf_text:build",
        "zerolaunch.data.tokens:build",
    }
)
"""zerolaunch's builders that take path args: each one must exist now (nothing is created or downloaded)."""
PATH_NAMES = frozenset({"path", "paths", "tokenizer"})
PATH_SUFFIXES = ("_path", "_paths", "_dir", "_file", "_files")
FIX = "Fix the path (relative paths start at the recipe's folder; with --set, at the current directory)"


def is_path_arg(name: str) -> bool:
    return name in PATH_NAMES or name.endswith(PATH_SUFFIXES)


def resolve_path_args(
    r: Resolver, section: str, builder: str, args: dict, base_dir: FsPath, args_key: str = "args"
) -> dict:
    """`args` (at `section.args_key`) with every path-valued arg resolved by the rule above (a new dict;
    other args as given)."""
    out = dict(args)
    for name, value in args.items():
        if not isinstance(name, str) or not is_path_arg(name):
            continue
        key: Path = (section, args_key, name)
        base = FsPath.cwd() if r.tree.origin(key) == "--set" else base_dir
        hub_file = _hub_file(section, builder, name)
        if isinstance(value, str):
            out[name] = _resolve(r, key, value, base, builder, hub_file)
        elif isinstance(value, list) and value and all(isinstance(v, str) for v in value):
            out[name] = [_resolve(r, key, v, base, builder, hub_file) for v in value]
    return out


def _hub_file(section: str, builder: str, name: str) -> str | None:
    """The file whose cached copy marks a hub id as usable offline, for args that may be one."""
    if name == "tokenizer":
        return "tokenizer_config.json"
    if section == "model" and name == "path" and builder == HF_MODEL_BUILDER:
        return "config.json"
    return None


def looks_like_hub_id(value: str) -> bool:
    return not value.startswith((".", "/", "~")) and value.count("/") <= 1


def _resolve(r: Resolver, key: Path, value: str, base_dir: FsPath, builder: str, hub_file: str | None) -> str:
    full = (base_dir / os.path.expanduser(value)).resolve()
    if full.exists():
        return str(full)
    own = builder in OWN_BUILDERS
    if hub_file is not None and looks_like_hub_id(value):
        cached = _cached_snapshot(value, hub_file)
        if cached is not None:
            return cached
        if own:
            raise r.fail(
                key,
                f"names {value!r}: no folder {full}, and hub model {value!r} is not cached (not in the local "
                "Hugging Face cache)",
                "Give a local folder (relative paths start at the recipe's folder), or download it first "
                f"(e.g. `huggingface-cli download {value}`); zerolaunch never downloads",
            )
    if own:
        raise r.fail(key, f"names {full}, which does not exist", FIX)
    return value  # a user builder's business: a folder it creates, a name it fetches


def _cached_snapshot(repo_id: str, filename: str) -> str | None:
    try:
        from huggingface_hub import try_to_load_from_cache
    except ImportError:
        return None
    try:
        found: Any = try_to_load_from_cache(repo_id, filename)
    except Exception:  # an id huggingface_hub rejects (bad characters) is simply not cached
        return None
    return str(FsPath(found).parent) if isinstance(found, str) else None
