"""A write the disk refused (full, read-only, no permission) as one paragraph the user can act on.

`disk_error(err, path=, needed_bytes=, what=, fix=)` turns an OSError whose errno is in DISK_ERRNOS into a
`DiskError` (a UserError: the CLI prints it and exits 2): the path, the OS's own words, the bytes free on
that filesystem and the bytes needed when the caller knows them, and what to do. `disk_errors(...)` is
the same as a context manager; `is_disk_error(err)` says whether an exception is one. Every writer (the
launcher's run dir files, a worker's checkpoint save, convert-checkpoint, prepare-data) shares it so a
full disk reads the same everywhere. Torch-free, in util/ below every layer: imports nothing of ours but
util/errors.py and util/sizes.py's byte formatting.
"""

from __future__ import annotations

import errno
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from zerolaunch.util.errors import UserError
from zerolaunch.util.sizes import fmt_bytes

DISK_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EACCES, errno.EPERM})
"""Refusals the user fixes on the disk side: no space, quota, read-only filesystem, no permission."""


class DiskError(UserError):
    """A write refused by the filesystem; the message names the path, the error and what to do."""

    def __init__(self, message: str, *, code: int, strerror: str = "", needed_bytes: int | None = None):
        super().__init__(message)
        self.code = code
        """The errno (ENOSPC, EROFS, ...)."""
        self.strerror = strerror
        self.needed_bytes = needed_bytes


def is_disk_error(err: BaseException) -> bool:
    return isinstance(err, DiskError) or (isinstance(err, OSError) and err.errno in DISK_ERRNOS)


def free_bytes(path: str | os.PathLike[str]) -> int | None:
    """Bytes an unprivileged writer can still use on the filesystem holding `path` (its nearest existing
    parent), or None when that cannot be asked."""
    here = Path(path)
    while not here.exists() and here != here.parent:
        here = here.parent
    try:
        stat = os.statvfs(here)
    except OSError:
        return None
    return stat.f_bavail * stat.f_frsize


def disk_error(
    err: OSError | DiskError,
    *,
    path: str | os.PathLike[str] | None = None,
    needed_bytes: int | None = None,
    what: str = "",
    fix: str = "",
    after: str = "",
) -> DiskError:
    """The paragraph for `err` (an OSError with an errno of DISK_ERRNOS, or a DiskError to say again with
    more context). `path`: what was being written (default: the error's own filename); `what`: what it
    is ("the checkpoint of step 20 in"); `needed_bytes`: its size when known; `fix`: how to write
    elsewhere ("pass --run-dir DIR"); `after`: a sentence to end with (what is still intact)."""
    if isinstance(err, DiskError):
        code, strerror, filename = err.code, err.strerror, None
        needed_bytes = err.needed_bytes if needed_bytes is None else needed_bytes
    else:
        code, strerror, filename = err.errno, err.strerror or str(err), err.filename
    where, verb = _where(path, filename)
    target = (
        " ".join(part for part in (what if verb == "write" else "", str(where or "")) if part) or "a file"
    )
    elsewhere = f", or {fix}" if fix else ""
    if code in (errno.ENOSPC, errno.EDQUOT):
        free = free_bytes(where) if where is not None else None
        sizes = []
        if needed_bytes is not None:
            sizes.append(f"it needs about {fmt_bytes(needed_bytes)}")
        if free is not None:
            sizes.append(f"{fmt_bytes(free)} is free there")
        detail = f" ({'; '.join(sizes)})" if sizes else ""
        cause = "no space left on the device" if code == errno.ENOSPC else "the disk quota is exceeded"
        message = f"cannot {verb} {target}: {cause}{detail}. Free space on that disk{elsewhere}."
    elif code == errno.EROFS:
        message = (
            f"cannot {verb} {target}: the filesystem is read-only. Write to a writable folder{elsewhere}."
        )
    else:
        message = f"cannot {verb} {target}: permission denied ({strerror}). Fix the folder's permissions{elsewhere}."
    if after:
        message += f" {after}"
    return DiskError(message, code=code, strerror=strerror, needed_bytes=needed_bytes)


def _where(path, filename) -> tuple[Path | None, str]:
    """What to name: `path` (the thing being written, e.g. a checkpoint folder rather than the temp file
    inside its temp sibling) when the failing file is in its folder, else the failing file itself (a
    source being read, say), with a verb that fits."""
    if path is None:
        return (Path(filename) if filename else None), "write"
    if not filename:
        return Path(path), "write"
    folder = Path(path).parent.resolve()
    failing = Path(os.fsdecode(filename)).resolve()
    if failing == folder or folder in failing.parents:
        return Path(path), "write"
    return failing, "use"


@contextmanager
def disk_errors(
    path: str | os.PathLike[str] | None = None,
    *,
    needed_bytes: int | None = None,
    what: str = "",
    fix: str = "",
    after: str = "",
) -> Iterator[None]:
    """Raise a DiskError (from None: the paragraph is the whole story) for a refused write in the block."""
    try:
        yield
    except OSError as err:
        if not is_disk_error(err):
            raise
        raise disk_error(err, path=path, needed_bytes=needed_bytes, what=what, fix=fix, after=after) from None
