"""Host overhead of the built-in loop's step against the bare engine step, on the CPU (no GPU needed).

    OMP_NUM_THREADS=1 PYTHONPATH=$PWD python bench/loop_overhead.py [--steps 30] [--size tiny]

Runs the same tiny GPT two ways in one process (world size 1, gloo): `Trainer.train_step` (the loop of
`zerolaunch train`, with its data prefetch, reporting, metrics.jsonl and non-finite guard) and the bare
`engine(**b).loss; engine.backward(loss); engine.step()` of bench/run.py's zl-z2 row on batches made ahead.
For each it counts, per step, the host reads of tensor values (Tensor.item / tolist / __bool__ / __float__ /
__int__, torch.cuda.synchronize, Event.synchronize) made on the main thread: on a GPU each is a point where the host waits for the
device, so nothing of the next step is queued meanwhile. Reads are attributed to the first zerolaunch frame
on the stack: the loop (zerolaunch/train, zerolaunch/report) or the engine (zerolaunch/zero, the model).
On the CPU a read costs nothing extra (every op is synchronous), so the counts, not the times, are what
carry over to the GPU; the times show the loop's own Python cost per step at a size where the model's
work is small. A measurement script, not a test (tests/unit/test_loop_host_reads.py is the guard).
"""

from __future__ import annotations

import argparse
import collections
import datetime
import os
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

import torch
import torch.distributed as dist

_READS = ("item", "tolist", "__bool__", "__float__", "__int__")


class ReadCounter:
    """Counts host reads of tensor values by call site while active (patches torch.Tensor methods)."""

    def __init__(self):
        self.by_site: collections.Counter = collections.Counter()
        self.active = False
        self._saved = {}

    def _site(self) -> str:
        if threading.current_thread() is not threading.main_thread():
            # the data prefetch thread reads host tensors it built; it holds up no step
            return "data thread"
        f = sys._getframe(2)
        while f is not None:
            path = f.f_code.co_filename.replace(os.sep, "/")
            if "/zerolaunch/" in path and "/bench/" not in path:
                tail = path.split("/zerolaunch/")[-1]
                return f"{tail}:{f.f_code.co_name}"
            f = f.f_back
        return "other"

    def _wrap(self, owner, name):
        original = getattr(owner, name)
        self._saved[(owner, name)] = original
        counter = self

        def wrapper(*args, **kwargs):
            if counter.active:
                counter.by_site[f"{name} @ {counter._site()}"] += 1
            return original(*args, **kwargs)

        setattr(owner, name, wrapper)

    def __enter__(self):
        for name in _READS:
            self._wrap(torch.Tensor, name)
        self._wrap(torch.cuda, "synchronize")
        self._wrap(torch.cuda.Event, "synchronize")
        return self

    def __exit__(self, *exc):
        for (owner, name), original in self._saved.items():
            setattr(owner, name, original)

    def split(self) -> tuple[int, int]:
        """(loop reads, engine reads) so far."""
        loop = sum(n for k, n in self.by_site.items() if "@ train/" in k or "@ report/" in k)
        engine = sum(n for k, n in self.by_site.items() if "@ zero/" in k or "@ models/" in k)
        return loop, engine


def _recipe(run_dir: Path, size: str, steps: int, seq: int, micro: int):
    from zerolaunch.config import load_recipe

    return load_recipe(
        {
            "model": {
                "builder": "zerolaunch.models.gpt:build",
                "args": {"size": size, "vocab_size": 256, "seq_len": seq},
            },
            "data": {
                "builder": "zerolaunch.data.synthetic:build",
                "args": {"vocab_size": 256, "seq_len": seq},
            },
            "train": {
                "steps": steps,
                "micro_batch_size": micro,
                "lr": 1e-3,
                "lr_schedule": "constant",
                "seed": 1234,
                "log_every": 10,
                "run_dir": str(run_dir),
            },
            "checkpoint": {"every": 0, "dir": str(run_dir / "ckpt")},
            "deepspeed": {"zero_optimization": {"stage": 2, "overlap_comm": True}},
        },
        world_size=1,
    )


def measure_loop(recipe, counter: ReadCounter, warmup: int) -> tuple[float, float, float]:
    from zerolaunch.train.context import RunContext
    from zerolaunch.train.loop import Trainer

    ctx = RunContext(rank=0, local_rank=0, world_size=1, device=torch.device("cpu"))
    trainer = Trainer(recipe, ctx)
    times = []
    try:
        for step in range(1, recipe.train.steps + 1):
            # the last step is read at once by design (finish needs it): count the steady state only
            timed = warmup < step < recipe.train.steps
            counter.active = timed
            t0 = time.perf_counter()
            trainer.train_step(step)
            if timed:
                times.append(time.perf_counter() - t0)
        counter.active = False
        trainer.finish()
    finally:
        trainer.close()
    n = len(times)
    loop, engine = counter.split()
    return 1e3 * statistics.median(times), loop / n, engine / n


def measure_engine(recipe, counter: ReadCounter, warmup: int) -> tuple[float, float, float]:
    from zerolaunch.data.synthetic import build as build_data
    from zerolaunch.models.gpt import build as build_gpt
    from zerolaunch.zero import Engine

    torch.manual_seed(0)
    args = recipe.data.args
    it = iter(
        build_data(rank=0, world_size=1, micro_batch_size=recipe.train.micro_batch_size, seed=1, **args)
    )
    batches = [next(it) for _ in range(recipe.train.steps)]
    engine = Engine(build_gpt(**recipe.model.args), recipe.engine, device=torch.device("cpu"))
    times = []
    try:
        for i, b in enumerate(batches):
            timed = warmup < i + 1 < recipe.train.steps
            counter.active = timed
            t0 = time.perf_counter()
            loss = engine(**b).loss
            engine.backward(loss)
            engine.step()
            if timed:
                times.append(time.perf_counter() - t0)
        counter.active = False
    finally:
        engine.close()
    n = len(times)
    loop, eng = counter.split()
    return 1e3 * statistics.median(times), loop / n, eng / n


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--size", default="tiny")
    p.add_argument("--seq", type=int, default=32)
    p.add_argument("--micro", type=int, default=2)
    p.add_argument("--sites", action="store_true", help="also list the reads by call site")
    a = p.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="zl-loop-overhead-"))
    store = dist.FileStore(str(tmp / "store"), 1)
    dist.init_process_group("gloo", store=store, rank=0, world_size=1, timeout=datetime.timedelta(seconds=60))
    rows = []
    try:
        for name, fn in (
            ("bare engine (bench/run.py zl-z2)", measure_engine),
            ("Trainer.train_step", measure_loop),
        ):
            recipe = _recipe(tmp / name.split()[0], a.size, a.steps, a.seq, a.micro)
            with ReadCounter() as counter:
                ms, loop_reads, engine_reads = fn(recipe, counter, a.warmup)
            rows.append((name, ms, loop_reads, engine_reads, counter.by_site))
    finally:
        dist.destroy_process_group()
    print(
        f"GPT {a.size}, seq {a.seq}, micro batch {a.micro}, CPU, {a.steps} steps ({a.warmup} warm-up and the last left out)"
    )
    print(f"{'path':<34} {'host ms/step':>12} {'loop reads/step':>16} {'engine reads/step':>18}")
    for name, ms, loop_reads, engine_reads, _ in rows:
        print(f"{name:<34} {ms:>12.2f} {loop_reads:>16.2f} {engine_reads:>18.2f}")
    if a.sites:
        for name, *_, sites in rows:
            print(f"\n{name}: reads by call site (whole timed window)")
            for site, n in sorted(sites.items()):
                print(f"  {n:>5}  {site}")


if __name__ == "__main__":
    main()
