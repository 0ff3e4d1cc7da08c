"""What the DeepSpeed side-by-side scripts (_ds_parity_run.py, _ds_init_from_run.py, _ds_api_run.py,
_ds_bf16_master_run.py) share: spawning CPU gloo ranks that DeepSpeed accepts (the torchrun environment
variables, a FileStore rendezvous) and starting DeepSpeed's own comm on them; and, for their tests,
`run_both`, which runs a script under both engines. Imported by name: the scripts run as `python tests/dist/<script>.py`, so this
folder is first on sys.path, in the spawned ranks too."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from datetime import timedelta

import torch
import torch.multiprocessing as mp


def run_both(script, out_dir, *args: str, timeout: float = 900) -> dict:
    """{engine: what rank 0 saved} after `python script {deepspeed|zerolaunch} OUT.pt *args` under both
    engines at once (OUT.pt in `out_dir`), each on the CPU with one thread; a failed run fails the caller
    with the end of its output."""
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env = {**os.environ, "PYTHONPATH": root, "OMP_NUM_THREADS": "1", "DS_ACCELERATOR": "cpu"}
    outs = {w: os.path.join(str(out_dir), f"{w}.pt") for w in ("deepspeed", "zerolaunch")}
    procs = {
        w: subprocess.Popen(
            [sys.executable, str(script), w, out, *args],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for w, out in outs.items()
    }
    for which, proc in procs.items():
        output, _ = proc.communicate(timeout=timeout)
        assert proc.returncode == 0, f"{which} run failed:\n{output[-4000:]}"
    return {w: torch.load(out) for w, out in outs.items()}


def spawn(worker, world_size: int, *args) -> None:
    """worker(rank, world_size, store_path, *args) on `world_size` spawned ranks, DeepSpeed set to CPU."""
    os.environ["DS_ACCELERATOR"] = "cpu"
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    with tempfile.TemporaryDirectory() as tmp:
        mp.start_processes(
            worker,
            args=(world_size, os.path.join(tmp, "store"), *args),
            nprocs=world_size,
            start_method="spawn",
        )


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
