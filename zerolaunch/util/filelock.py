"""An exclusive `fcntl.flock` on a lock file that says who holds it: the primitive under the run_dir lock
(launch/runlock.py) and prepare-data's lock on its OUT folder (data/prepare.py).

The file records the holder (host, pid, start time, and what the caller adds) so a refused process can name
it. The kernel drops a flock when its holder dies, however it dies, so a record left by a dead holder is
simply taken over (`FileLock.previous` says whose it was). Python opens files close-on-exec, so child
processes do not inherit the lock. On release the file is emptied, not removed: removing it would let a
waiting process lock a file nobody else can see. Callers turn `LockHeld` into their own one-paragraph error.
"""

from __future__ import annotations

import datetime
import errno
import fcntl
import json
import os
import socket
from pathlib import Path


class LockHeld(Exception):
    """Another live process holds the lock; `holder` is its record (may be partial or unreadable)."""

    def __init__(self, path: Path, holder: dict):
        super().__init__(f"{path} is held by {describe_holder(holder)}")
        self.path = path
        self.holder = holder

    @property
    def holder_gone(self) -> bool:
        """The recorded pid is dead on this host: a process it started still holds the flock."""
        pid = self.holder.get("pid")
        return self.holder.get("host") == socket.gethostname() and isinstance(pid, int) and not pid_alive(pid)


def describe_holder(holder: dict) -> str:
    run = f"run dir {holder['run_dir']}, " if isinstance(holder.get("run_dir"), str) else ""
    return (
        f"{run}host {holder.get('host', '?')}, pid {holder.get('pid', '?')}, since {holder.get('since', '?')}"
    )


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class FileLock:
    def __init__(self, path: str | os.PathLike[str], record: dict | None = None):
        """`record`: extra fields written beside host, pid and since, for the refused to read."""
        self.path = Path(path)
        self.record = dict(record or {})
        self._fd: int | None = None
        self.previous: dict = {}
        """The record a dead holder left behind (empty when the file was free and clean)."""

    def acquire(self) -> FileLock:
        """Take the lock at once or raise LockHeld; never waits."""
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as err:
            holder = read_holder(fd)
            os.close(fd)
            if err.errno not in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                raise
            raise LockHeld(self.path, holder) from None
        self.previous = read_holder(fd)
        record = {
            "host": socket.gethostname(),
            "pid": os.getpid(),
            "since": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
            **self.record,
        }
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

    def __enter__(self) -> FileLock:
        return self.acquire()

    def __exit__(self, *exc) -> None:
        self.release()


def read_holder(fd: int) -> dict:
    try:
        raw = os.pread(fd, 4096, 0).decode(errors="replace").strip()
        holder = json.loads(raw) if raw else {}
        return holder if isinstance(holder, dict) else {"since": "? (unreadable lock file)"}
    except (OSError, ValueError):
        return {"host": "?", "pid": "?", "since": "? (unreadable lock file)"}
