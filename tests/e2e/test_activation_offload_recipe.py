"""train.activation_offload in a recipe: resolved from the file or --set, and on a CPU run a visible no-op.

Tests: the key loads (default off, true from --set) and a misspelling is refused with a did-you-mean; a CPU run
with it on says once that nothing is offloaded and trains to the same losses as without it. Leaves out: the
CUDA path (tests/unit/test_activation_offload.py runs the copies on CPU; bench/ on the device).
"""

from __future__ import annotations

import datetime

import pytest
import torch
import torch.distributed as dist

from zerolaunch.config import load_recipe
from zerolaunch.config.errors import RecipeError
from zerolaunch.train.context import RunContext
from zerolaunch.train.loop import run_training

pytestmark = pytest.mark.e2e


def _recipe(run_dir, overrides=()):
    return load_recipe(
        {
            "model": {
                "builder": "zerolaunch.models.gpt:build",
                "args": {"size": "tiny", "vocab_size": 64, "seq_len": 16},
            },
            "data": {"builder": "zerolaunch.data.synthetic:build", "args": {"vocab_size": 64, "seq_len": 16}},
            "train": {
                "steps": 3,
                "micro_batch_size": 2,
                "gradient_accumulation_steps": 2,
                "log_every": 100,
                "run_dir": str(run_dir),
            },
            "deepspeed": {"zero_optimization": {"stage": 2}},
        },
        overrides=list(overrides),
        world_size=1,
    )


def test_key_resolves_and_a_misspelling_is_refused(tmp_path):
    assert _recipe(tmp_path).train.activation_offload is False
    assert _recipe(tmp_path, ["train.activation_offload=true"]).train.activation_offload is True
    with pytest.raises(RecipeError, match="activation_offload"):
        _recipe(tmp_path, ["train.activation_ofload=true"])


@pytest.fixture
def group(tmp_path):
    store = dist.FileStore(str(tmp_path / "store"), 1)
    dist.init_process_group("gloo", store=store, rank=0, world_size=1, timeout=datetime.timedelta(seconds=60))
    yield None
    dist.destroy_process_group()


def test_cpu_run_says_nothing_is_offloaded_and_trains_the_same(group, tmp_path, capsys):
    ctx = RunContext(rank=0, local_rank=0, world_size=1, device=torch.device("cpu"))
    plain = run_training(_recipe(tmp_path / "a"), ctx)
    assert "activation_offload" not in capsys.readouterr().out
    offloaded = run_training(_recipe(tmp_path / "b", ["train.activation_offload=true"]), ctx)
    out = capsys.readouterr().out
    assert out.count("train.activation_offload") == 1 and "nothing is offloaded" in out
    assert offloaded == plain
