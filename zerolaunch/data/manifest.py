"""A prepared folder's name for itself: its format and version, and `read_manifest`, the checked read of its
manifest.json.

prepare.py writes the folder; tokens.py (training), checksums.py (--verify), hf_text.py (its cache key) and
launch/preflight.py read it back. They all meet here rather than in prepare.py, so reading a folder does not
import the writer.
"""

from __future__ import annotations

import json
from pathlib import Path

from zerolaunch.data.readers import DataError

FORMAT = "zerolaunch-tokens"
VERSION = 1


def read_manifest(path: str | Path) -> dict:
    """The manifest of a prepared folder, checked; errors name the folder and what to run."""
    folder = Path(path)
    f = folder / "manifest.json"
    if not f.is_file():
        hint = " (a .partial folder is an unfinished prepare-data run)" if ".partial" in folder.name else ""
        raise DataError(
            f"{folder}: no manifest.json, so not a prepared folder{hint}; make one with "
            "`zerolaunch prepare-data INPUT... --tokenizer DIR --out DIR`"
        )
    manifest = json.loads(f.read_text())
    if manifest.get("format") != FORMAT or manifest.get("version") != VERSION:
        raise DataError(
            f"{f}: format {manifest.get('format')!r} version {manifest.get('version')!r}; expected {FORMAT!r} "
            f"version {VERSION}: prepare the data again with this zerolaunch"
        )
    return manifest
