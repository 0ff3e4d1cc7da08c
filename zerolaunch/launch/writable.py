"""Fail before any worker starts when a folder the run writes to cannot be written.

Creating the folder and a probe file in it is the only honest test (permissions, read-only mounts, ACLs,
a full disk's inode table): `os.access` misses read-only mounts seen through some filesystems. The
message names the path and the OS's own error text.
"""

from __future__ import annotations

import os
from pathlib import Path

from zerolaunch.config.errors import UserError
from zerolaunch.util.atomic import writer_unique_name


class NotWritable(UserError):
    """A run_dir or checkpoint.dir that the run could not write."""


def check_writable(path: str | os.PathLike[str], what: str) -> None:
    folder = Path(path)
    # a per-writer name: the launchers of a multi-node run probe the same shared run_dir at once
    probe = folder / writer_unique_name("zerolaunch-write-test")
    try:
        folder.mkdir(parents=True, exist_ok=True)
        with open(probe, "wb") as f:
            f.write(b"x")
            f.flush()
            os.fsync(f.fileno())
        probe.unlink()
    except OSError as err:
        where = err.filename or folder
        raise NotWritable(
            f"{what} {folder} cannot be written: {err.strerror or err} ({where}). Nothing was started. "
            f"Fix the folder's permissions or free space, or point {what} elsewhere "
            f"({'--run-dir DIR' if what == 'run_dir' else '--set checkpoint.dir=DIR'})"
        ) from None
