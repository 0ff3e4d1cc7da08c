"""One run per run_dir and per checkpoint.dir: an exclusive `fcntl.flock` on FOLDER/.lock, held for the
launcher's life.

The file says who holds it (host, pid, start time) so a second run can name the holder. The kernel drops
a flock when its holder dies, however it dies, so a lock file left with content by a dead launcher is
simply taken over (with a note saying whose it was). The descriptor is not inherited by the workers
(Python opens files close-on-exec), so only the launcher itself holds the lock. On release the file is
emptied, not removed: removing it would let a waiting run lock a file nobody else can see. The flock and
its record are util/filelock.py's; this module owns the names and the messages of the run's locks.
"""

from __future__ import annotations

import os
import socket
from pathlib import Path

from zerolaunch.config.errors import UserError
from zerolaunch.util.filelock import FileLock, LockHeld, describe_holder

LOCK_NAME = ".lock"


class RunDirBusy(UserError):
    """Another live run holds this run_dir's lock."""


def lock_name(nnodes: int, node_rank: int | None) -> str:
    """`.lock` on one node; every node of a multi-node job shares run_dir, so each locks its own file."""
    if nnodes == 1:
        return LOCK_NAME
    return f"{LOCK_NAME}.node{node_rank}" if node_rank is not None else f"{LOCK_NAME}.{socket.gethostname()}"


class RunLock:
    def __init__(
        self,
        folder: str | os.PathLike[str],
        name: str = LOCK_NAME,
        *,
        what: str = "run_dir",
        run_dir: str | os.PathLike[str] | None = None,
    ):
        """`what`: "run_dir" or "checkpoint.dir", the folder's role in messages; `run_dir`: recorded in the
        lock file, so a run refused at a shared checkpoint.dir can name the run dir of the run holding it."""
        self.path = Path(folder) / name
        self.what = what
        self.run_dir = None if run_dir is None else str(Path(run_dir).resolve())
        self._lock: FileLock | None = None
        self.note: str | None = None
        """Set when a dead run's lock was taken over: what to tell the user."""

    def acquire(self) -> RunLock:
        lock = FileLock(self.path, {"run_dir": self.run_dir} if self.run_dir is not None else None)
        try:
            lock.acquire()
        except LockHeld as held:
            still = (
                " (that pid is gone, but a process it started still holds the lock)"
                if held.holder_gone
                else ""
            )
            if self.what == "run_dir":
                role, elsewhere = "run dir", "pick another folder with --run-dir"
            else:
                role, elsewhere = self.what, f"give this run its own folder with --set {self.what}=DIR"
            raise RunDirBusy(
                f"{role} {self.path.parent} is in use by another run ({describe_holder(held.holder)}){still}. "
                f"Wait for it to end, stop it, or {elsewhere}"
            ) from None
        if lock.previous:
            self.note = (
                f"note: took over the lock {self.path} of a run that ended without releasing it "
                f"({describe_holder(lock.previous)})"
            )
        self._lock = lock
        return self

    def release(self) -> None:
        if self._lock is not None:
            self._lock.release()
            self._lock = None

    def __enter__(self) -> RunLock:
        return self.acquire()

    def __exit__(self, *exc) -> None:
        self.release()
