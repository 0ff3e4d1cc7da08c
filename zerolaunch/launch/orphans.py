"""A training process never outlives the process that launched it (`die_with_parent`).

A `kill -9` of the launcher (`zerolaunch train`, torchrun, accelerate launch) gives its workers no chance to
stop them: they keep training with parent pid 1, writing checkpoints a re-launch would share. Two guards,
armed once per process: a watchdog thread that notices the parent pid changed (the process was re-parented)
and ends it, always; and, for `zerolaunch train`'s own workers, Linux's PR_SET_PDEATHSIG, which SIGKILLs the
process at once. PDEATHSIG fires when the *thread* that started the process exits, so it is armed only
where the launcher is known to start its workers from a thread that lives as long as it does (our elastic
agent's); a script under someone else's launcher (torchrun, accelerate launch, a launcher that spawns ranks
from a short-lived thread) gets the watchdog alone. Torch-free: the worker arms it before torch is imported.

Owns: the arming. Not: which pid the launcher leaves for its workers (env.py), nor the agent's own stop of
its workers on a failure or Ctrl-C (torch's elastic agent).
"""

from __future__ import annotations

import os
import signal
import sys
import threading

PR_SET_PDEATHSIG = 1
"""prctl(2) option: the signal this process gets when the thread that started it exits."""
WATCH_INTERVAL_SECONDS = 1.0
"""How often the watchdog looks at the parent pid: an orphan ends within this (well under 10 s)."""
WATCH_THREAD_NAME = "zerolaunch-parent-watch"


def die_with_parent(expected_parent: int | None = None) -> None:
    """End this process when its parent dies; a no-op when already armed in this process.

    expected_parent: the launcher's pid when it is zerolaunch's (`zerolaunch train` leaves it in
    ZEROLAUNCH_LAUNCHER_PID): PDEATHSIG is armed too, and a parent that is already another process means the
    launcher died before this call: exit at once. Otherwise the parent at this call (torchrun's or
    accelerate's agent) is the one watched.
    """
    if any(t.name == WATCH_THREAD_NAME for t in threading.enumerate()):
        return  # armed already (the worker did, and then the script's initialize() asks again)
    parent = os.getppid()
    if expected_parent is not None:
        _arm_pdeathsig()
        if parent != expected_parent:
            os._exit(1)  # the launcher died before the guards were armed
    watch = threading.Thread(target=_watch, args=(parent,), name=WATCH_THREAD_NAME, daemon=True)
    watch.start()


def _arm_pdeathsig() -> None:
    if not sys.platform.startswith("linux"):
        return
    import ctypes

    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)
    except (OSError, AttributeError):
        pass  # cannot arm it (no prctl, seccomp): the watchdog still ends an orphan


def _watch(parent: int) -> None:
    """Poll the parent pid; once it changed, the launcher is gone: end this process as its death signal would."""
    stop = threading.Event()
    while not stop.wait(WATCH_INTERVAL_SECONDS):
        if os.getppid() != parent:
            try:
                print(
                    f"zerolaunch: the launcher (pid {parent}) is gone; stopping this orphaned rank "
                    f"(pid {os.getpid()})",
                    file=sys.stderr,
                    flush=True,
                )
            except (OSError, ValueError):
                pass  # stderr was a pipe of the dead launcher: stop all the same
            os.kill(os.getpid(), signal.SIGKILL)
