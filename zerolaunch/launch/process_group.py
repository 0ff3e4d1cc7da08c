"""The default process group a user's script gets from torchrun's environment when it starts none itself
(`init_process_group`, which `zerolaunch.initialize` calls): nccl on CUDA, gloo on CPU, the collective timeout
of ZEROLAUNCH_TIMEOUT, this rank dying with its launcher (orphans.py) and the hung rank named when a
collective times out (hang_census.py). Here, in launch/, because it is the rank's side of being launched: the
engine wrapper (api.py) and the runner of a recipe's `entrypoint:` (train/entrypoint.py) both sit above it.
"""

from __future__ import annotations

import atexit
import sys
from datetime import timedelta

import torch
import torch.distributed as dist

from zerolaunch.launch import env, hang_census, orphans
from zerolaunch.zero import comm


def init_process_group(timeout_s: float | None = None) -> bool:
    """Start the default process group from torchrun's env (nccl on CUDA, gloo on CPU) unless one exists.

    timeout_s: the collective timeout; None takes ZEROLAUNCH_TIMEOUT (which `zerolaunch train --timeout`
    sets for an entrypoint script), else 1800 s. Under a launcher (torchrun's variables set) this rank is
    also made to die with it (launch/orphans.py), and a collective timeout that ends the script names the
    rank(s) that hung (hang_census.py), whoever started the group.
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
