"""`train.compile_optimizer` (engine.optimizer.fused_step, [Note: fused step]): when a recipe gets the fused
optimizer step, what `recipe show` says about it, the runs it refuses, and that the built-in loop really steps
through it with the losses of the unfused step.

Covers: the default (on with train.compile and inductor; off without compile, with another backend, with SGD,
with optimizer offload; each with its note), explicit true / false, exit-2 errors at the key's line, the
resolved-JSON round trip, a resume that switches it either way (continues the run exactly), and 3 optimizer
steps of the built-in loop at stages 0, 2 and 3 (fp32, world size 1, in process; on the CPU the kernel runs
eagerly). Leaves out: the compiled kernel (CUDA: test_zero12_cuda.py)
and its speed (bench/run.py's -fused rows).
"""

import pytest
import torch
from _helpers import tiny_gpt_recipe

from zerolaunch.config import RecipeError, load_recipe
from zerolaunch.config.schema import Recipe
from zerolaunch.train.context import RunContext
from zerolaunch.train.loop import run_training
from zerolaunch.zero.optim import shard_optimizer

pytestmark = pytest.mark.e2e


def _load(train=None, ds=None, run_dir="runs/x", steps=3, every=0):
    return load_recipe(
        tiny_gpt_recipe(
            seq_len=16,
            checkpoint={"every": every},
            train={
                "steps": steps,
                "micro_batch_size": 2,
                "gradient_accumulation_steps": 2,
                "lr": 1e-2,
                "lr_schedule": "constant",
                "log_every": 100,
                "run_dir": str(run_dir),
                **(train or {}),
            },
            deepspeed={"zero_optimization": {"stage": 2}, **(ds or {})},
        ),
        world_size=1,
    )


SGD = {"optimizer": {"type": "SGD", "params": {"lr": 1e-2}}}
OFFLOAD = {"zero_optimization": {"stage": 2, "offload_optimizer": {"device": "cpu"}}}


@pytest.mark.parametrize(
    "train,ds,on,note",
    [
        ({}, None, False, "on by default only with train.compile"),
        ({"compile": True}, None, True, "on with train.compile"),
        ({"compile": True, "compile_backend": "aot_eager"}, None, False, "on by default only with"),
        ({"compile": True}, SGD, False, "off: the fused step is Adam / AdamW's"),
        ({"compile": True}, OFFLOAD, False, "off: offload_optimizer"),
        ({"compile_optimizer": True}, None, True, None),
        ({"compile": True, "compile_optimizer": False}, None, False, None),
    ],
)
def test_the_default_follows_train_compile_and_is_shown_with_its_reason(train, ds, on, note):
    recipe = _load(train, ds)
    assert recipe.train.compile_optimizer is on
    assert recipe.engine.optimizer.fused_step is on
    given = "compile_optimizer" in train
    assert recipe.origins["train.compile_optimizer"] == ("file" if given else "default")
    assert recipe.origins["engine.optimizer.fused_step"] == recipe.origins["train.compile_optimizer"]
    if note is not None:
        assert note in recipe.notes["train.compile_optimizer"]
    # what a run writes and a resume reads back
    again = Recipe.from_json(recipe.to_json())
    assert again.train.compile_optimizer is on and again.engine.optimizer.fused_step is on


@pytest.mark.parametrize(
    "ds,match",
    [
        (
            SGD,
            "`train.compile_optimizer` is on, but the fused step is Adam / AdamW's and the optimizer is sgd",
        ),
        (OFFLOAD, "`train.compile_optimizer` is on, but offload_optimizer steps on the CPU"),
    ],
)
def test_asking_for_it_where_it_cannot_run_is_a_recipe_error(ds, match):
    with pytest.raises(RecipeError, match=match):
        _load({"compile_optimizer": True}, ds)


def test_the_cli_exits_2_at_the_line_of_the_key(tmp_path):
    import os
    import subprocess
    import sys

    path = tmp_path / "r.yaml"
    path.write_text(
        "train:\n  steps: 1\n  compile_optimizer: true\n"
        "deepspeed:\n  optimizer: {type: SGD, params: {lr: 0.1}}\n"
    )
    env = {**os.environ, "PYTHONPATH": os.getcwd()}
    done = subprocess.run(
        [sys.executable, "-m", "zerolaunch", "recipe", "show", str(path)],
        capture_output=True,
        text=True,
        env=env,
    )
    assert done.returncode == 2
    assert "line 3: `train.compile_optimizer` is on" in done.stderr and "Traceback" not in done.stderr


def _ctx(resume=None):
    return RunContext(rank=0, local_rank=0, world_size=1, device=torch.device("cpu"), resume=resume)


@pytest.mark.parametrize(
    "stage,zero_extra",
    [(0, {}), (2, {}), (3, {"stage3_param_persistence_threshold": 0})],
)
def test_the_loop_steps_through_the_fused_kernel_with_the_unfused_losses(
    group, tmp_path, monkeypatch, stage, zero_extra
):
    calls = []
    real = shard_optimizer.adam_chunk_for

    def counting(device):
        kernel = real(device)

        def run(*args, **kwargs):
            calls.append(device)
            return kernel(*args, **kwargs)

        return run

    monkeypatch.setattr(shard_optimizer, "adam_chunk_for", counting)
    ds = {"zero_optimization": {"stage": stage, **zero_extra}}
    unfused = run_training(_load({"compile_optimizer": False}, ds, tmp_path / "unfused"), _ctx())
    assert calls == []
    fused = run_training(_load({"compile_optimizer": True}, ds, tmp_path / "fused"), _ctx())
    assert len(calls) >= 3  # at least one chunk in each of the 3 optimizer steps
    assert len(fused) == len(unfused) == 3
    torch.testing.assert_close(torch.tensor(fused), torch.tensor(unfused), rtol=1e-6, atol=0)


@pytest.mark.parametrize("first,then", [(True, False), (False, True)])
def test_a_resume_may_switch_it_and_continues_the_same_run(group, tmp_path, first, then):
    # moments, master and the step count (bias corrections) are the same state either way, so a run resumed
    # with train.compile toggled (and with it this default) continues as if it had never switched
    ds = {"zero_optimization": {"stage": 2}}
    whole = run_training(_load({"compile_optimizer": then}, ds, tmp_path / "whole", steps=4), _ctx())
    run_training(_load({"compile_optimizer": first}, ds, tmp_path / "first", steps=4, every=2), _ctx())
    mid = tmp_path / "first" / "checkpoints" / "step_000002"
    resumed = run_training(_load({"compile_optimizer": then}, ds, tmp_path / "then", steps=4), _ctx(str(mid)))
    assert len(resumed) == 2
    torch.testing.assert_close(torch.tensor(resumed), torch.tensor(whole[2:]), rtol=1e-6, atol=0)


def test_the_first_step_line_says_the_optimizer_step_was_fused(group, tmp_path, capsys):
    train = {"compile": True, "compile_backend": "aot_eager", "compile_optimizer": True}
    run_training(_load(train, None, tmp_path / "run"), _ctx())
    out = capsys.readouterr().out
    assert (
        "train.compile: 2 blocks compiled (aot_eager), optimizer step fused (uncompiled on the CPU); first step"
        in out
    )
    # without train.compile on the CPU nothing is compiled, so there is no such line
    run_training(_load({"compile_optimizer": True}, None, tmp_path / "eager"), _ctx())
    assert "first step" not in capsys.readouterr().out
