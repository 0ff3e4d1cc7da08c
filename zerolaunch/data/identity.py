"""The identity of a run's training data, which a checkpoint records so a resume on other data is noticed.

A resume continues at the checkpoint's data position (a count of samples); on other data the same position
is another window order, and training would go on silently on something else. The identity is what decides
that order: the data builder, its args and train.seed; for a prepared token folder (data.tokens) the args
that pick the windows (path, seq_len, holdout, split), a sha256 of its manifest.json (which holds every
file's crc32, so a folder prepared again in place from other text differs) and of its tokenizer's files.
Nothing in it depends on the world size or the micro batch: a resume at another shape continues the same
order (tokens.py). The checkpoint's rank `extra` holds it under IDENTITY_KEY; the launcher's pre-flight reads
it from the manifest, the worker from what it loaded (checkpoint hook), and both refuse a change unless
`data.allow_change: true`. Torch-free; this module owns the identity and its comparison, not the refusal's
exit or the metrics record.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

IDENTITY_KEY = "data_identity"
"""Key of each rank's checkpoint `extra` that holds the data identity (the same on every rank)."""
TOKENS_BUILDER = "zerolaunch.data.tokens:build"
TOKENS_ORDER_ARGS = ("path", "seq_len", "holdout", "split")
"""data.tokens args that decide which windows come in which order; document_mask and label_shift change
what a batch carries of a window, not which windows a step reads, so they may change on resume."""
HASH_FIELDS = ("data.manifest_sha256", "data.tokenizer_sha256")
"""Fields shown shortened: a sha256 says only that the content differs."""


def _json_value(value):
    """A JSON value of a builder arg as the recipe gave it (the checkpoint stores JSON)."""
    try:
        json.dumps(value)
        return value
    except (TypeError, ValueError):
        return repr(value)


def data_identity(builder: str, args: dict, seed: int) -> dict:
    """{field: value} of the data a recipe trains on (see the module docstring)."""
    identity: dict = {"data.builder": builder, "train.seed": seed}
    if builder == TOKENS_BUILDER:
        for name in TOKENS_ORDER_ARGS:
            if name in args:
                identity[f"data.args.{name}"] = _json_value(args[name])
        manifest_file = Path(str(args.get("path", ""))) / "manifest.json"
        try:
            raw = manifest_file.read_bytes()
            tokenizer = json.loads(raw).get("tokenizer") or {}
        except (OSError, ValueError, AttributeError):
            return identity  # no readable folder: building the data reports it
        identity["data.manifest_sha256"] = hashlib.sha256(raw).hexdigest()
        identity["data.tokenizer_sha256"] = tokenizer.get("files_sha256")
        return identity
    for name in sorted(args):
        identity[f"data.args.{name}"] = _json_value(args[name])
    return identity


def identity_changes(saved: dict | None, current: dict) -> list[tuple[str, object, object]]:
    """(field, saved value, current value) of every field that differs; [] when the checkpoint recorded no
    identity (it was written before identities existed: nothing to compare)."""
    if not isinstance(saved, dict):
        return []
    missing = object()
    changes = []
    for name in [*saved, *(k for k in current if k not in saved)]:
        old, new = saved.get(name, missing), current.get(name, missing)
        if old != new:
            changes.append((name, None if old is missing else old, None if new is missing else new))
    return changes


def _shown(name: str, value) -> str:
    if value is None:
        return "(none)"
    if name in HASH_FIELDS and isinstance(value, str):
        return value[:12]
    return json.dumps(value) if not isinstance(value, str) else value


def describe_changes(changes: list[tuple[str, object, object]]) -> str:
    """ "data.args.seq_len 32 -> 16; train.seed 1 -> 2" (old -> new), hashes shortened."""
    parts = []
    for name, old, new in changes:
        what = name
        if name == "data.manifest_sha256":
            what = "data.manifest_sha256 (the folder's manifest.json: prepared again, or another folder)"
        elif name == "data.tokenizer_sha256":
            what = "data.tokenizer_sha256 (the tokenizer's files)"
        parts.append(f"{what} {_shown(name, old)} -> {_shown(name, new)}")
    return "; ".join(parts)


def changes_record(changes: list[tuple[str, object, object]]) -> dict:
    """{field: {"old": ..., "new": ...}}: the JSON form of the changes (metrics.jsonl)."""
    return {name: {"old": old, "new": new} for name, old, new in changes}


def refusal(changes: list[tuple[str, object, object]], checkpoint: str, recipe_file: str, step: int) -> str:
    """The one paragraph that refuses a resume on other data."""
    return (
        f"--resume {checkpoint}: the checkpoint (step {step}) was trained on other data than this recipe "
        f"gives: {describe_changes(changes)}. Resuming would continue at its data position on another "
        "order of the data, without saying so. Resume with the data it was saved with (the values on the "
        f"left), or set `data: {{allow_change: true}}` in {recipe_file} to continue on the new data "
        "(metrics.jsonl then records the change at that step)."
    )
