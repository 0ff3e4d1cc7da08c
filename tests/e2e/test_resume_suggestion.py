"""A resume refused because the checkpoint does not match the model suggests only another checkpoint that
would load into this model, or says that none would and what to change.

The loop runs in-process (one gloo rank, FileStore): run A trains the tiny GPT at vocab 64 with checkpoints
at steps 2 and 4; a model at vocab 128 is then resumed from A's step 4. Leaves out: damaged checkpoints
(tests/e2e/test_run_dir_guard.py checks the suggestion's wording there, through the CLI).
"""

from __future__ import annotations

import shutil

import pytest
import torch
from _helpers import tiny_gpt_recipe

from zerolaunch.checkpoint import CheckpointError
from zerolaunch.config import load_recipe
from zerolaunch.train.context import RunContext
from zerolaunch.train.loop import run_training

pytestmark = pytest.mark.e2e


def _recipe(run_dir, vocab, steps):
    raw = tiny_gpt_recipe(
        seq_len=16,
        train={"steps": steps, "micro_batch_size": 2, "log_every": 100, "run_dir": str(run_dir)},
        checkpoint={"every": 2},
    )
    raw["model"]["args"]["vocab_size"] = vocab  # the data's ids stay below 64
    return load_recipe(raw, world_size=1)


def _ctx(resume=None):
    return RunContext(rank=0, local_rank=0, world_size=1, device=torch.device("cpu"), resume=resume)


def test_a_model_mismatch_suggests_only_a_checkpoint_that_would_load(group, tmp_path):
    run_training(_recipe(tmp_path / "a", vocab=64, steps=4), _ctx())
    a4 = tmp_path / "a/checkpoints/step_000004"
    with pytest.raises(CheckpointError) as err:
        run_training(_recipe(tmp_path / "b", vocab=128, steps=6), _ctx(resume=str(a4)))
    message = " ".join(str(err.value).split())
    assert "does not match the model" in message or "shape" in message
    assert "step_000002" not in message  # A's step 2 fails the same way
    assert "None of the 1 other complete checkpoint(s)" in message and "model.args" in message

    # a checkpoint folder that holds one that would load (B's step 2) beside A's step 4
    run_training(_recipe(tmp_path / "b", vocab=128, steps=2), _ctx())
    mixed = tmp_path / "b/checkpoints"
    shutil.copytree(a4, mixed / "step_000004")
    with pytest.raises(CheckpointError) as err:
        run_training(_recipe(tmp_path / "c", vocab=128, steps=6), _ctx(resume=str(mixed / "step_000004")))
    message = " ".join(str(err.value).split())
    assert f"resume from it with --resume {mixed / 'step_000002'}" in message
