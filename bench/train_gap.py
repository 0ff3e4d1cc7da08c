"""Where the built-in loop's step goes beyond the bare engine's, on one GPU, in one process.

    PYTHONPATH=$PWD python bench/train_gap.py --size 350m [--steps 20] [--warmup 5]

Rows, each the same recipe (recipes/gpt-SIZE.yaml: ZeRO-2, bf16, seq 2048, micro batch 8) and a fresh model:
- engine: `engine(**b).loss; engine.backward(loss); engine.step()` on batches copied to the GPU beforehand
  (bench/run.py's zl-z2 row, with the recipe's engine options);
- loop, data.prefetch=thread / process: `Trainer.train_step` of `zerolaunch train` (batches made ahead on a
  thread or in a forked worker process, reporting, metrics.jsonl, the non-finite guard);
- loop, pre-made batches: the thread producer over batches made before the run (no data cost at all).
Each row's time is wall-clock per step over the timed steps with one synchronize at the end (what a user's
throughput is; the loop's deferred reads make per-step syncs wrong for it). A measurement, not a test.
"""

from __future__ import annotations

import argparse
import gc
import os
import sys
import tempfile
import time
from pathlib import Path

import torch
import torch.distributed as dist

REPO = Path(__file__).resolve().parent.parent


def premade(rank, world_size, micro_batch_size, seed, **args):
    """A data builder cycling 8 synthetic batches made now, before the run (the loop draws no new data)."""
    from zerolaunch.data.synthetic import build as build_data

    it = iter(
        build_data(rank=rank, world_size=world_size, micro_batch_size=micro_batch_size, seed=seed, **args)
    )
    return [next(it) for _ in range(8)]


def _recipe(size: str, run_dir: Path, steps: int, prefetch: str, builder: str | None = None):
    from zerolaunch.config import load_recipe

    recipe_file = REPO / "recipes" / f"gpt-{size}.yaml"
    sets = []
    if not recipe_file.exists():  # e.g. tiny, for a CPU check: the 350m recipe at a small size
        recipe_file = REPO / "recipes" / "gpt-350m.yaml"
        sets += [
            f"model.args.size={size}",
            "model.args.seq_len=64",
            "data.args.seq_len=64",
            "train.micro_batch_size=2",
        ]
        sets += ["train.precision=fp32"] if DEV.type == "cpu" else []
    sets += [
        f"train.steps={steps}",
        "train.log_every=1",
        f"train.run_dir={run_dir}",
        f"data.prefetch={prefetch}",
        f"checkpoint.dir={run_dir}/ckpt",
    ]
    if builder:
        sets.append(f"data.builder={builder}")
    return load_recipe(recipe_file, overrides=sets, world_size=1)


DEV = torch.device("cuda", 0) if torch.cuda.is_available() else torch.device("cpu")


def _sync() -> None:
    if DEV.type == "cuda":
        torch.cuda.synchronize()


def _timed(step_fn, steps: int, warmup: int) -> float:
    t0 = time.perf_counter()
    for i in range(steps):
        if i == warmup:
            _sync()
            t0 = time.perf_counter()
        step_fn(i)
    _sync()
    return 1e3 * (time.perf_counter() - t0) / (steps - warmup)


def run_engine(size: str, steps: int, warmup: int) -> float:
    from zerolaunch.data.synthetic import build as build_data
    from zerolaunch.models.gpt import build as build_gpt
    from zerolaunch.zero import Engine

    recipe = _recipe(size, Path(tempfile.mkdtemp()), steps, "thread")
    torch.manual_seed(0)
    it = iter(
        build_data(
            rank=0, world_size=1, micro_batch_size=recipe.train.micro_batch_size, seed=1, **recipe.data.args
        )
    )
    dev = DEV
    batches = [{k: v.to(dev) for k, v in next(it).items()} for _ in range(steps)]
    engine = Engine(build_gpt(**recipe.model.args), recipe.engine, device=dev)

    def step(i):
        loss = engine(**batches[i]).loss
        engine.backward(loss)
        engine.step()

    try:
        return _timed(step, steps, warmup)
    finally:
        engine.close()


def run_loop(
    size: str, steps: int, warmup: int, prefetch: str, builder: str | None = None
) -> tuple[float, float]:
    from zerolaunch.train.context import RunContext
    from zerolaunch.train.loop import Trainer

    run_dir = Path(tempfile.mkdtemp(prefix="zl-gap-"))
    recipe = _recipe(size, run_dir, steps + 1, prefetch, builder)
    ctx = RunContext(rank=0, local_rank=0, world_size=1, device=DEV)
    trainer = Trainer(recipe, ctx)
    try:
        ms = _timed(lambda i: trainer.train_step(i + 1), steps, warmup)
        wait = trainer.source.wait_seconds
    finally:
        trainer.close()
    return ms, wait


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--size", default="350m")
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--rows", default="engine,thread,process,premade")
    a = p.parse_args()
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", str(29600 + os.getpid() % 1000))
    if DEV.type == "cuda":
        torch.cuda.set_device(0)
        dist.init_process_group("nccl", rank=0, world_size=1, device_id=DEV)
    else:  # a CPU check of the script itself: python bench/train_gap.py --size tiny
        dist.init_process_group("gloo", rank=0, world_size=1)
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    rows = []
    for row in a.rows.split(","):
        gc.collect()
        torch.cuda.empty_cache()
        if row == "engine":
            rows.append(
                ("engine (batches on the GPU beforehand)", run_engine(a.size, a.steps, a.warmup), None)
            )
        elif row in ("thread", "process"):
            ms, wait = run_loop(a.size, a.steps, a.warmup, row)
            rows.append((f"loop, data.prefetch={row}", ms, wait))
        elif row == "premade":
            ms, wait = run_loop(a.size, a.steps, a.warmup, "thread", builder="train_gap:premade")
            rows.append(("loop, pre-made batches (thread)", ms, wait))
        print(f"ROW {rows[-1]}", flush=True)
    dist.destroy_process_group()
    base = rows[0][1] if rows and rows[0][0].startswith("engine") else None
    print(f"\nGPT {a.size}, {a.steps - a.warmup} timed steps, wall ms/step (one sync at the end)")
    print(f"{'path':<42} {'ms/step':>9} {'x engine':>9} {'data wait s':>12}")
    for name, ms, wait in rows:
        ratio = f"{ms / base:.3f}" if base else "-"
        print(f"{name:<42} {ms:>9.1f} {ratio:>9} {'' if wait is None else f'{wait:.3f}':>12}")


if __name__ == "__main__":
    main()
