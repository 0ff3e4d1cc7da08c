"""What the side-by-side scripts' ranks (tests/dist/_ds_*_run.py, tests/hf/_hf_*.py) share once _spawn.start_ranks
started them: a gloo group DeepSpeed accepts (the torchrun environment variables, a FileStore rendezvous),
DeepSpeed's own comm on it, one scratch folder for every rank, and the way out. Imported by name: the scripts run
as `python tests/<folder>/<script>.py` with tests/dist on sys.path, in the spawned ranks too."""

from __future__ import annotations

import os
import sys
from datetime import timedelta

import torch


def init_rank(rank: int, world_size: int, store_path: str) -> None:
    """The default gloo group, with the environment variables DeepSpeed reads (as torchrun sets them)."""
    os.environ.update(
        RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(world_size), LOCAL_WORLD_SIZE=str(world_size)
    )
    torch.set_num_threads(1)
    store = torch.distributed.FileStore(store_path, world_size)
    torch.distributed.init_process_group(
        "gloo", store=store, rank=rank, world_size=world_size, timeout=timedelta(seconds=300)
    )


def shared_tmp(rank: int, mine: str) -> str:
    """One folder for every rank (checkpoints are shared): rank 0's `mine`, broadcast."""
    obj = [mine if rank == 0 else None]
    torch.distributed.broadcast_object_list(obj, src=0)
    return obj[0]


def init_deepspeed():
    """DeepSpeed's comm on the existing gloo group; returns the deepspeed module."""
    import deepspeed
    import deepspeed.comm.torch  # noqa: F401 -- the attribute path is shadowed by `torch`, hence sys.modules

    # DeepSpeed would JIT-compile a shared-memory all-reduce for CPU; gloo is all these ranks need.
    sys.modules["deepspeed.comm.torch"].build_shm_op = lambda: None
    deepspeed.init_distributed(dist_backend="gloo")
    return deepspeed


def finish(rank: int, results, out_path) -> None:
    """Rank 0 saves `results` to `out_path`; every rank waits for that, then leaves the group the way the
    product's workers do (zero/comm.py destroy_default_group: the engines' reference cycles collected first,
    a barrier, then destroy). Without the collection a DeepSpeed rank of _ds_parity_run.py aborted once at
    exit ("terminate called without an active exception", 2026-12-05): engines still holding gloo work were
    destroyed at interpreter finalization, after the group."""
    from zerolaunch.zero.comm import destroy_default_group

    if rank == 0:
        torch.save(results, out_path)
    destroy_default_group(every_rank_finished=True)
