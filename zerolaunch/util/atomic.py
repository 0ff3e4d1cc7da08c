"""Crash-safe filesystem steps: fsync of files and folders, write-then-rename, rename-then-delete.

[Note: atomic save]
A checkpoint (or a conversion output) is built under a temporary name in the same folder as its final
name, every file is fsynced, then the folder itself, and only then is it renamed into place (rename is
atomic on POSIX filesystems) and the parent folder fsynced. A reader therefore sees either the previous
state or the complete new one; a process killed at any moment leaves at most a `.tmp-*` folder behind,
which the next save removes. Deletion goes the other way round: rename to a `.trash-*` name first, then
remove, so a half-deleted folder never carries a valid name.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import uuid
from pathlib import Path

TMP_PREFIX = ".tmp-"
TRASH_PREFIX = ".trash-"


def fsync_path(path: Path) -> None:
    """fsync a file or a folder (a folder's fsync makes the names inside it durable)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def writer_unique_name(name: str) -> str:
    """A temp name no other writer uses: host, pid and a random part.

    Two writers of one file (the launchers of a multi-node run share run_dir) must not share a temp name,
    or the first rename takes the second writer's temp file away and that writer's rename fails with
    FileNotFoundError -- the cause of the two-node test's hang under load (issue 16).
    """
    return f"{TMP_PREFIX}{name}.{socket.gethostname()}.{os.getpid()}.{uuid.uuid4().hex[:8]}"


def write_text_atomic(path: Path, text: str) -> None:
    """Replace `path` with `text` so that a reader sees the old or the new content, never a mix; safe with
    several writers at once (the last rename wins, each writer's content is whole)."""
    path = Path(path)
    tmp = path.with_name(writer_unique_name(path.name))
    with open(tmp, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    fsync_path(path.parent)


def write_json(path: Path, obj) -> None:
    """Write JSON and fsync it (not atomic on its own: used inside a temp folder)."""
    with open(path, "w") as f:
        json.dump(obj, f, indent=1)
        f.flush()
        os.fsync(f.fileno())


def remove_tree(path: Path) -> None:
    """Rename `path` to a trash name, then delete it: a half-deleted folder never keeps its valid name."""
    path = Path(path)
    if not path.exists():
        return
    trash = path.with_name(f"{TRASH_PREFIX}{path.name}")
    remove_path(trash)
    os.replace(path, trash)
    fsync_path(path.parent)
    remove_path(trash)


def remove_path(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    elif path.exists() or path.is_symlink():
        path.unlink()


def publish(tmp: Path, final: Path) -> None:
    """Move a finished temp file or folder to its final name (replacing an existing one) durably."""
    tmp, final = Path(tmp), Path(final)
    fsync_path(tmp)
    if final.exists():
        remove_tree(final)
    os.replace(tmp, final)
    fsync_path(final.parent)


def clean_stale(parent: Path) -> None:
    """Remove temp and trash entries a killed process left in `parent`."""
    for child in Path(parent).iterdir():
        if child.name.startswith((TMP_PREFIX, TRASH_PREFIX)):
            remove_path(child)
