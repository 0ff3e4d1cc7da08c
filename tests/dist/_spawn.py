"""The one place tests/dist, tests/hf (and the unit and e2e tests that need ranks) start processes from: CPU
ranks on gloo, rendezvous through a FileStore (no ports), a timeout everywhere.

    results = run_ranks(fn, world_size, *args)   # fn(rank, world_size, *args) -> picklable value

`fn` must be defined at module level (it is pickled by reference into spawned processes). The default
process group is initialized before `fn` runs, so `group=None` means all ranks. A failure on any rank
raises RuntimeError with that rank's traceback; a hang raises TimeoutError after `timeout_s`.

    start_ranks(worker, world_size, *args)       # worker(rank, world_size, store_path, *args)

for the side-by-side scripts whose ranks make their own group (DeepSpeed's comm, _ds_ranks.init_rank), and

    results = run_engines(script, engines, out_dir, *args)   # {engine: what rank 0 saved}

which runs `python SCRIPT ENGINE OUT.pt *ARGS` once per engine, at the same time, from the test.
"""

from __future__ import annotations

import datetime
import io
import os
import queue
import subprocess
import sys
import tempfile
import traceback
from collections.abc import Sequence

import torch
import torch.multiprocessing as mp


def _worker(fn, rank, world_size, store_path, timeout_s, backend, results, args):
    os.environ["OMP_NUM_THREADS"] = "1"
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    try:
        store = dist.FileStore(store_path, world_size)
        dist.init_process_group(
            "gloo",
            store=store,
            rank=rank,
            world_size=world_size,
            timeout=datetime.timedelta(seconds=timeout_s),
        )
        try:
            value = fn(rank, world_size, *args)
            # tensors through a torch multiprocessing queue travel as shared-memory handles, which die with
            # the rank that exits; plain bytes outlive it.
            buf = io.BytesIO()
            torch.save(value, buf)
            results.put((rank, True, buf.getvalue()))
        finally:
            dist.destroy_process_group()
    except BaseException:
        results.put((rank, False, traceback.format_exc()))


def run_ranks(fn, world_size: int, *args, timeout_s: float = 600.0, backend: str = "gloo") -> list:
    """fn(rank, world_size, *args) on `world_size` ranks; returns the per-rank results, in rank order.

    backend="nccl" (GPU machines only) pins rank r to cuda:r before the group is created.
    """
    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    with tempfile.TemporaryDirectory(prefix="zl_spawn_") as tmp:
        store_path = os.path.join(tmp, "store")
        procs = [
            ctx.Process(
                target=_worker,
                args=(fn, r, world_size, store_path, timeout_s, backend, results, args),
                daemon=True,
            )
            for r in range(world_size)
        ]
        for p in procs:
            p.start()
        out: dict[int, object] = {}
        errors: list[str] = []
        deadline = datetime.datetime.now() + datetime.timedelta(seconds=timeout_s)
        try:
            while len(out) + len(errors) < world_size:
                left = (deadline - datetime.datetime.now()).total_seconds()
                if left <= 0:
                    raise TimeoutError(f"ranks did not finish within {timeout_s:.0f} s")
                try:
                    rank, ok, value = results.get(timeout=min(left, 1.0))
                except queue.Empty:
                    dead = [p for p in procs if p.exitcode not in (None, 0)]
                    if dead and results.empty():
                        raise RuntimeError(
                            f"a rank exited with code {dead[0].exitcode} without a result"
                        ) from None
                    continue
                if ok:
                    out[rank] = torch.load(io.BytesIO(value), weights_only=False)
                else:
                    errors.append(f"rank {rank}:\n{value}")
            if errors:
                raise RuntimeError("distributed test failed on some rank(s):\n" + "\n".join(errors))
        finally:
            for p in procs:
                p.join(timeout=10)
                if p.is_alive():
                    p.kill()
                    p.join(timeout=5)
    return [out[r] for r in range(world_size)]


def start_ranks(worker, world_size: int, *args) -> None:
    """worker(rank, world_size, store_path, *args) on `world_size` spawned ranks, each making its own group on
    the FileStore at store_path. DeepSpeed is set to its CPU accelerator: these are CPU ranks, and a worker
    that imports DeepSpeed must not look for a GPU."""
    os.environ["DS_ACCELERATOR"] = "cpu"
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    with tempfile.TemporaryDirectory(prefix="zl_spawn_") as tmp:
        mp.start_processes(
            worker,
            args=(world_size, os.path.join(tmp, "store"), *args),
            nprocs=world_size,
            start_method="spawn",
        )


def run_engines(script, engines: Sequence[str], out_dir, *args, timeout: float = 900) -> dict:
    """{engine: what rank 0 saved} after `python SCRIPT ENGINE OUT.pt *ARGS` ran under each engine at once
    (OUT.pt is out_dir/ENGINE.pt), each on the CPU with one thread and the repository first on the path. A run
    that fails fails the caller with the end of its output; past `timeout` seconds every run is killed."""
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env = {**os.environ, "PYTHONPATH": root, "OMP_NUM_THREADS": "1", "DS_ACCELERATOR": "cpu"}
    outs = {engine: os.path.join(str(out_dir), f"{engine}.pt") for engine in engines}
    what = " ".join([os.path.basename(str(script)), *map(str, args)])
    procs = {
        engine: subprocess.Popen(
            [sys.executable, str(script), engine, out, *map(str, args)],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for engine, out in outs.items()
    }
    try:
        for engine, proc in procs.items():
            output, _ = proc.communicate(timeout=timeout)
            assert proc.returncode == 0, f"{what} under {engine} failed:\n{output[-4000:]}"
    finally:
        for proc in procs.values():
            if proc.poll() is None:
                proc.kill()
                proc.communicate()
    return {engine: torch.load(out, weights_only=False) for engine, out in outs.items()}
