"""The built-in loop reads no device value while it queues a step ([Note: deferred step reads], loop.py).

Counts, per step of an in-process run (world size 1, gloo, CPU), the host reads of tensor values made by the
loop's own code (zerolaunch/train, zerolaunch/report) on the main thread: Tensor.item / tolist / __bool__ /
__float__ / __int__, torch.cuda.synchronize, Event.synchronize. On a GPU each is a wait for the device. A
steady-state step may make exactly one: PendingStep.read of the previous step's values (on CUDA a pinned host
copy that landed behind an event). The old loop made two on the CPU (loss_sum.item(), the all-reduce's
.tolist()) and four on CUDA. Also checks that the deferred reads still write every step's record, in
order, with the losses run_training returns. Leaves out: the engine's own reads (zero/), a GPU.
"""

import json
import os
import sys
import threading

import pytest
import torch
from _helpers import tiny_gpt_recipe

from zerolaunch.config import load_recipe
from zerolaunch.train.context import RunContext
from zerolaunch.train.loop import Trainer

pytestmark = pytest.mark.e2e

ALLOWED_PER_STEP = 1
"""PendingStep.read: the previous step's loss sums and peaks, one .tolist() of a host tensor."""


def _recipe(run_dir, steps, accum):
    return load_recipe(
        tiny_gpt_recipe(
            seq_len=16,
            train={
                "steps": steps,
                "micro_batch_size": 2,
                "gradient_accumulation_steps": accum,
                "lr": 1e-2,
                "lr_schedule": "constant",
                "seed": 1234,
                "log_every": 2,
                "run_dir": str(run_dir),
            },
            checkpoint={"every": 0},
            deepspeed={"zero_optimization": {"stage": 2}},
        ),
        world_size=1,
    )


def _loop_site():
    """'file:function' of the innermost loop frame (zerolaunch/train or zerolaunch/report), else None."""
    f = sys._getframe(2)
    while f is not None:
        path = f.f_code.co_filename.replace(os.sep, "/")
        for part in ("/zerolaunch/train/", "/zerolaunch/report/"):
            if part in path:
                return f"{path.split('/zerolaunch/')[-1]}:{f.f_code.co_name}"
        if "/zerolaunch/" in path:
            return None  # the engine's, the model's or the data's own read
        f = f.f_back
    return None


@pytest.mark.parametrize("accum", [1, 2])
def test_steady_state_step_reads_only_the_previous_steps_values(group, tmp_path, monkeypatch, accum):
    reads: list[str] = []
    counting = {"on": False}

    def counted(owner, name):
        original = getattr(owner, name)

        def wrapper(*args, **kwargs):
            if counting["on"] and threading.current_thread() is threading.main_thread():
                site = _loop_site()
                if site is not None:
                    reads.append(f"{name} @ {site}")
            return original(*args, **kwargs)

        monkeypatch.setattr(owner, name, wrapper)

    for name in ("item", "tolist", "__bool__", "__float__", "__int__"):
        counted(torch.Tensor, name)
    counted(torch.cuda, "synchronize")
    counted(torch.cuda.Event, "synchronize")

    steps = 6
    recipe = _recipe(tmp_path / "run", steps, accum)
    trainer = Trainer(recipe, RunContext(rank=0, local_rank=0, world_size=1, device=torch.device("cpu")))
    per_step = {}
    try:
        for step in range(1, steps + 1):
            counting["on"] = True
            trainer.train_step(step)
            counting["on"] = False
            per_step[step], reads[:] = list(reads), []
        trainer.finish()
    finally:
        trainer.close()
    # step 1 has nothing to read yet; the last step is read at once (finish and its checkpoint need it)
    assert per_step[1] == []
    for step in range(2, steps):
        assert len(per_step[step]) <= ALLOWED_PER_STEP, (step, per_step[step])
        assert all(r.endswith("train/step_stats.py:read") for r in per_step[step]), per_step[step]
    assert trainer.losses and len(trainer.losses) == steps

    # deferred, but every step's record is written, in order, with the same loss the loop returns
    with open(tmp_path / "run" / "metrics.jsonl") as f:
        rows = [json.loads(line) for line in f if line.strip()]
    assert [r["step"] for r in rows] == list(range(1, steps + 1))
    assert [r["loss"] for r in rows] == pytest.approx(trainer.losses, rel=0, abs=0)
    assert all(r["step_seconds"] > 0 for r in rows)
