"""A user's training script in place of the built-in loop: running a recipe's `entrypoint:` in a worker
(`run_entrypoint`). The process group such a script gets from torchrun's environment when it starts none
itself is launch/process_group.py's (`init_process_group`, which `zerolaunch.initialize` calls).

The variables themselves are read in zerolaunch.launch.env; the engine wrapper is zerolaunch.api.
"""

from __future__ import annotations

import runpy
import shlex
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import timedelta
from pathlib import Path

from zerolaunch.launch import env


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
