"""A user's training script in place of the built-in loop: running a recipe's `entrypoint:` in a worker
(`run_entrypoint`), and the process group such a script gets from torchrun's environment when it starts none
itself (`init_process_group`, which `zerolaunch.initialize` calls).

The variables themselves are read in zerolaunch.launch.env; the engine wrapper is zerolaunch.api.
"""

from __future__ import annotations

import atexit
import runpy
import shlex
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist

from zerolaunch.launch import env, orphans
from zerolaunch.train import hang_census
from zerolaunch.zero import comm


def init_process_group(timeout_s: float | None = None) -> bool:
    """Start the default process group from torchrun's env (nccl on CUDA, gloo on CPU) unless one exists.

    timeout_s: the collective timeout; None takes ZEROLAUNCH_TIMEOUT (which `zerolaunch train --timeout`
    sets for an entrypoint script), else 1800 s. Under a launcher (torchrun's variables set) this rank is
    also made to die with it (launch/orphans.py), and a collective timeout that ends the script names the
    rank(s) that hung (train/hang_census.py), whoever started the group.
    Returns True when this call created it. Without torchrun's variables (a plain `python train.py`) nothing is
    started: the engine runs as a world of one.
    """
    if not env.launched_by_torchrun():
        return False
    orphans.die_with_parent()
    hang_census.install()
    if dist.is_initialized():
        return False
    if timeout_s is None:
        timeout_s = env.script_timeout_s() or env.DEFAULT_SCRIPT_TIMEOUT_SECONDS
    backend = env.entrypoint_backend() or ("nccl" if torch.cuda.is_available() else "gloo")
    if backend == "nccl":
        torch.cuda.set_device(env.local_rank())
    dist.init_process_group(backend, init_method="env://", timeout=timedelta(seconds=timeout_s))
    # the group we made is ours to tear down; torch warns at exit about a group never destroyed. An uncaught
    # exception reaches sys.excepthook before the atexit handlers run: then the peers are not waited for.
    failed = []
    previous_hook = sys.excepthook

    def note_failure(*exc_info):
        failed.append(True)
        previous_hook(*exc_info)

    sys.excepthook = note_failure
    atexit.register(lambda: comm.destroy_default_group(every_rank_finished=not failed))
    return True


def run_entrypoint(recipe, resolved_path, backend: str | None = None, timeout_s: float | None = None) -> None:
    """Run the recipe's `entrypoint:` script in this worker instead of the built-in loop.

    The script runs as `__main__` (runpy) with sys.argv = the entrypoint split shell-style, its folder first on
    sys.path (as `python script.py` would), and ZEROLAUNCH_RECIPE = resolved_path so that
    `zerolaunch.initialize(model)` with no config uses this run's recipe. No process group is started here:
    the script starts its own (plain torchrun style) or initialize() does; `backend` (the run's --device
    choice) and `timeout_s` (its --timeout, as ZEROLAUNCH_TIMEOUT) are the ones initialize() then uses.
    """
    entry = str(recipe.entrypoint or "").strip()
    # the resolved recipe holds an absolute script path (maybe with spaces); else "script.py --arg value".
    argv = [entry] if Path(entry).is_file() else shlex.split(entry)
    if not argv:
        raise ValueError("entrypoint is empty: give a script path, e.g. entrypoint: my_train.py")
    script = Path(argv[0]).expanduser()
    if not script.is_file():
        raise FileNotFoundError(
            f"entrypoint: {script} is not a file (relative paths are taken from {Path.cwd()}); "
            "give the path of your training script"
        )
    saved_argv, saved_path = sys.argv, list(sys.path)
    sys.argv = [str(script), *argv[1:]]
    sys.path.insert(0, str(script.resolve().parent))
    try:
        with env.entrypoint_env(str(Path(resolved_path).resolve()), backend, timeout_s):
            with _default_group_timeout(timeout_s):
                runpy.run_path(str(script), run_name="__main__")
    finally:
        sys.argv, sys.path[:] = saved_argv, saved_path


@contextmanager
def _default_group_timeout(timeout_s: float | None) -> Iterator[None]:
    """torch's default collective timeout set to `timeout_s` while the script runs in this worker.

    A plain torchrun script calls `dist.init_process_group(backend)` with no timeout: torch then takes
    `default_pg_timeout` (30 min; NCCL's 10), and `zerolaunch train --timeout` would not reach it. A
    timeout the script passes itself still wins. The worker process is ours and runs only this script."""
    if timeout_s is None:
        yield
        return
    from torch.distributed import distributed_c10d

    names = ("default_pg_timeout", "default_pg_nccl_timeout")
    saved = {name: getattr(distributed_c10d, name, None) for name in names}
    for name in names:
        if isinstance(saved[name], timedelta):
            setattr(distributed_c10d, name, timedelta(seconds=timeout_s))
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is not None:
                setattr(distributed_c10d, name, value)
