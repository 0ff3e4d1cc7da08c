"""Every environment variable zerolaunch reads or sets, in one place (torch-free: worker.py reads some of them
before torch is imported).

Owns: torchelastic's / torchrun's worker variables (RANK, LOCAL_RANK, WORLD_SIZE, MASTER_ADDR/PORT,
TORCHELASTIC_RESTART_COUNT, TORCHELASTIC_USE_AGENT_STORE), zerolaunch's own (ZEROLAUNCH_RECIPE,
ZEROLAUNCH_BACKEND, ZEROLAUNCH_TIMEOUT, ZEROLAUNCH_LAUNCHER_PID). The Hugging Face offline default zerolaunch
sets before importing transformers is util/hf_env.py's (data/ and models/ set it too, and sit below launch/).
Does not own what torch or Hugging Face read for themselves
(NCCL_*, HF_HOME, ...), nor the variables the launcher hands to its workers through torch's elastic agent
(launcher.py).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from zerolaunch.util.errors import UserError

RECIPE_ENV = "ZEROLAUNCH_RECIPE"
"""Path of the resolved recipe JSON of the run that started this process; `initialize(model)` reads it."""
BACKEND_ENV = "ZEROLAUNCH_BACKEND"
"""The process-group backend `zerolaunch train --device` chose for an entrypoint script (gloo / nccl)."""
LAUNCHER_PID_ENV = "ZEROLAUNCH_LAUNCHER_PID"
"""The launcher's pid, so a worker can tell that its parent died before it armed PDEATHSIG."""
TIMEOUT_ENV = "ZEROLAUNCH_TIMEOUT"
"""Collective timeout, seconds, of a process group zerolaunch starts inside a script (`initialize()`, the HF
Trainer's through zero_args); `zerolaunch train --timeout` sets it for an entrypoint script, under plain
torchrun or accelerate launch the user may."""
DEFAULT_SCRIPT_TIMEOUT_SECONDS = 1800.0
"""Without ZEROLAUNCH_TIMEOUT: torch's own default for a process group (and transformers' ddp_timeout)."""
TORCHRUN_ENV = ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
"""What torchrun (and the elastic agent) set for every worker; all present = a `env://` group can start."""


def env_int(name: str, default: int | None = None) -> int:
    """An integer variable; unset without a default is a clear exit (a worker not started by the launcher)."""
    raw = os.environ.get(name)
    if raw is None:
        if default is None:
            raise SystemExit(
                f"zerolaunch.worker: {name} is not set; start workers with `zerolaunch train`, which sets it"
            )
        return default
    return int(raw)


@dataclass(frozen=True)
class WorkerEnv:
    """What torchelastic tells one worker about its place in the run."""

    rank: int
    local_rank: int
    world_size: int
    restart_count: int
    """TORCHELASTIC_RESTART_COUNT: restarts of the group so far (0 on the first attempt)."""
    agent_store: bool
    """TORCHELASTIC_USE_AGENT_STORE=True: the agent's store is shared with the workers (worker._attempt_store)."""

    @classmethod
    def read(cls) -> WorkerEnv:
        return cls(
            rank=env_int("RANK"),
            local_rank=env_int("LOCAL_RANK"),
            world_size=env_int("WORLD_SIZE"),
            restart_count=env_int("TORCHELASTIC_RESTART_COUNT", 0),
            agent_store=os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True",
        )


def master_addr_port() -> tuple[str, int]:
    """MASTER_ADDR and MASTER_PORT: where the rendezvous store listens."""
    return os.environ["MASTER_ADDR"], env_int("MASTER_PORT")


def launcher_pid() -> int | None:
    """The pid the launcher left in ZEROLAUNCH_LAUNCHER_PID, or None (not started by `zerolaunch train`)."""
    raw = os.environ.get(LAUNCHER_PID_ENV)
    return int(raw) if raw and raw.isdigit() else None


def set_launcher_pid(pid: int) -> None:
    """Left in the environment the workers inherit (orphans.die_with_parent compares it with getppid)."""
    os.environ[LAUNCHER_PID_ENV] = str(pid)


def script_timeout_s() -> float | None:
    """ZEROLAUNCH_TIMEOUT as seconds, None when unset; a value that is not a positive number is a UserError
    naming the variable."""
    raw = os.environ.get(TIMEOUT_ENV)
    if raw is None or not raw.strip():
        return None
    try:
        seconds = float(raw)
    except ValueError:
        seconds = float("nan")
    if not 0 < seconds < float("inf"):
        raise UserError(
            f"{TIMEOUT_ENV}={raw!r} is not a positive number of seconds: set it to the collective timeout you "
            f"want (e.g. {TIMEOUT_ENV}=600), or unset it for the default {DEFAULT_SCRIPT_TIMEOUT_SECONDS:g} s"
        )
    return seconds


def launched_by_torchrun() -> bool:
    """True when torchrun's variables are all set (a plain `python train.py` has none of them)."""
    return all(k in os.environ for k in TORCHRUN_ENV)


def local_rank() -> int:
    """LOCAL_RANK, 0 when unset (a world of one)."""
    return env_int("LOCAL_RANK", 0)


def resolved_recipe_path() -> str | None:
    """ZEROLAUNCH_RECIPE: the resolved recipe of the `zerolaunch train` run that started this script."""
    return os.environ.get(RECIPE_ENV) or None


def entrypoint_backend() -> str | None:
    """ZEROLAUNCH_BACKEND: the backend `zerolaunch train --device` chose for an entrypoint script."""
    return os.environ.get(BACKEND_ENV) or None


@contextmanager
def entrypoint_env(resolved_path: str, backend: str | None, timeout_s: float | None = None) -> Iterator[None]:
    """ZEROLAUNCH_RECIPE (and ZEROLAUNCH_BACKEND, ZEROLAUNCH_TIMEOUT) set while an entrypoint script runs,
    restored after."""
    saved = {k: os.environ.get(k) for k in (RECIPE_ENV, BACKEND_ENV, TIMEOUT_ENV)}
    os.environ[RECIPE_ENV] = resolved_path
    if backend:
        os.environ[BACKEND_ENV] = backend
    if timeout_s is not None:
        os.environ[TIMEOUT_ENV] = f"{timeout_s:g}"
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
