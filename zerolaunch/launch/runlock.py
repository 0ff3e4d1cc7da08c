"""One run per run_dir and per checkpoint.dir: an exclusive `fcntl.flock` on FOLDER/.lock, held for the
launcher's life.

The file says who holds it (host, pid, start time) so a second run can name the holder. The kernel drops
a flock when its holder dies, however it dies, so a lock file left with content by a dead launcher is
simply taken over (with a note saying whose it was). The descriptor is not inherited by the workers
(Python opens files close-on-exec), so only the launcher itself holds the lock. On release the file is
emptied, not removed: removing it would let a waiting run lock a file nobody else can see.
"""

from __future__ import annotations

import datetime
import errno
import fcntl
import json
import os
import socket
from pathlib import Path

from zerolaunch.config.errors import UserError

LOCK_NAME = ".lock"


class RunDirBusy(UserError):
    """Another live run holds this run_dir's lock."""


def lock_name(nnodes: int, node_rank: int | None) -> str:
    """`.lock` on one node; every node of a multi-node job shares run_dir, so each locks its own file."""
    if nnodes == 1:
        return LOCK_NAME
    return f"{LOCK_NAME}.node{node_rank}" if node_rank is not None else f"{LOCK_NAME}.{socket.gethostname()}"


def _describe(holder: dict) -> str:
    run = f"run dir {holder['run_dir']}, " if isinstance(holder.get("run_dir"), str) else ""
    return (
        f"{run}host {holder.get('host', '?')}, pid {holder.get('pid', '?')}, since {holder.get('since', '?')}"
    )


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


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
        self._fd: int | None = None
        self.note: str | None = None
        """Set when a dead run's lock was taken over: what to tell the user."""

    def acquire(self) -> RunLock:
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as err:
            holder = _read(fd)
            os.close(fd)
            if err.errno not in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                raise
            still = ""
            if holder.get("host") == socket.gethostname() and isinstance(holder.get("pid"), int):
                if not _pid_alive(holder["pid"]):
                    still = " (that pid is gone, but a process it started still holds the lock)"
            if self.what == "run_dir":
                role, elsewhere = "run dir", "pick another folder with --run-dir"
            else:
                role, elsewhere = self.what, f"give this run its own folder with --set {self.what}=DIR"
            raise RunDirBusy(
                f"{role} {self.path.parent} is in use by another run ({_describe(holder)}){still}. "
                f"Wait for it to end, stop it, or {elsewhere}"
            ) from None
        previous = _read(fd)
        if previous:
            self.note = (
                f"note: took over the lock {self.path} of a run that ended without releasing it "
                f"({_describe(previous)})"
            )
        record = {
            "host": socket.gethostname(),
            "pid": os.getpid(),
            "since": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
        }
        if self.run_dir is not None:
            record["run_dir"] = self.run_dir
        os.ftruncate(fd, 0)
        os.pwrite(fd, (json.dumps(record) + "\n").encode(), 0)
        os.fsync(fd)
        self._fd = fd
        return self

    def release(self) -> None:
        if self._fd is None:
            return
        try:
            os.ftruncate(self._fd, 0)
        finally:
            os.close(self._fd)  # closing drops the flock
            self._fd = None

    def __enter__(self) -> RunLock:
        return self.acquire()

    def __exit__(self, *exc) -> None:
        self.release()


def _read(fd: int) -> dict:
    try:
        raw = os.pread(fd, 4096, 0).decode(errors="replace").strip()
        return json.loads(raw) if raw else {}
    except (OSError, ValueError):
        return {"host": "?", "pid": "?", "since": "? (unreadable lock file)"}
