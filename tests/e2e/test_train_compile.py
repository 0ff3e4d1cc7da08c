"""`train.compile`: the built-in loop with each GPT block torch.compile'd, or its whole forward
(`train.compile_scope: model`, stages 0-2, and stage 3 at world size 1 where every unit aliases what it
holds: no forward hooks), gives the eager losses.

Covers: stages 0, 2 and 3 (stage 3 builds on meta and gathers units around the compiled forwards), and
stage 2 with activation checkpointing and CPU optimizer offload; 3 optimizer steps of 2 micro-steps each,
fp32, in process (world size 1, gloo through a FileStore), backend aot_eager (torch.compile's tracing and
autograd without code generation: inductor needs a C++ toolchain and minutes on this CPU). The loop prints
the first step's time; dynamo really compiled (unique graphs counted); bad values are exit-2 recipe
errors. Leaves out: inductor and its speed (bench/run.py on the GPU), several ranks.
"""

import pytest
import torch
from _helpers import tiny_gpt_recipe

from zerolaunch.config import RecipeError, load_recipe
from zerolaunch.train.context import RunContext
from zerolaunch.train.loop import run_training

pytestmark = pytest.mark.e2e


def _recipe(
    run_dir, stage, *, compile_on, train_extra=None, zero_extra=None, scope=None, ds_extra=None, world_size=1
):
    train = {
        "steps": 3,
        "micro_batch_size": 2,
        "gradient_accumulation_steps": 2,
        "lr": 1e-2,
        "lr_schedule": "constant",
        "log_every": 100,
        "run_dir": str(run_dir),
        **(train_extra or {}),
    }
    if compile_on:
        train.update({"compile": True, "compile_backend": "aot_eager"})
    if scope:
        train["compile_scope"] = scope
    return load_recipe(
        tiny_gpt_recipe(
            seq_len=16,
            train=train,
            deepspeed={"zero_optimization": {"stage": stage, **(zero_extra or {})}, **(ds_extra or {})},
        ),
        world_size=world_size,
    )


def _ctx():
    return RunContext(rank=0, local_rank=0, world_size=1, device=torch.device("cpu"), resume=None)


CASES = {
    "stage0": (0, None, None),
    "stage2": (2, None, None),
    "stage3": (3, None, {"stage3_param_persistence_threshold": 0}),
    "stage2_ckpt_offload": (2, {"activation_checkpointing": True}, {"offload_optimizer": {"device": "cpu"}}),
}


def _eager_then_compiled(tmp_path, case, scope=None):
    """(eager losses, compiled losses, dynamo's unique graph count of the compiled run) of one CASES entry."""
    from torch._dynamo.utils import counters

    stage, train_extra, zero_extra = case
    torch._dynamo.reset()
    counters.clear()
    eager = run_training(
        _recipe(tmp_path / "eager", stage, compile_on=False, train_extra=train_extra, zero_extra=zero_extra),
        _ctx(),
    )
    assert counters["stats"]["unique_graphs"] == 0
    compiled = run_training(
        _recipe(
            tmp_path / "compiled",
            stage,
            compile_on=True,
            train_extra=train_extra,
            zero_extra=zero_extra,
            scope=scope,
        ),
        _ctx(),
    )
    assert len(compiled) == len(eager) == 3
    return eager, compiled, counters["stats"]["unique_graphs"]


@pytest.mark.parametrize("name", list(CASES))
def test_compiled_blocks_give_the_eager_losses(group, tmp_path, name, capsys):
    eager, compiled, graphs = _eager_then_compiled(tmp_path, CASES[name])
    # one graph for the block class, shared by both blocks (a recompile per block would be 2 or more)
    assert graphs == 1
    torch.testing.assert_close(torch.tensor(compiled), torch.tensor(eager), rtol=1e-6, atol=0)
    out = capsys.readouterr().out
    assert "train.compile: 2 blocks compiled (aot_eager); first step" in out


# compile_scope: model is for stages 0-2 and for stage 3 where nothing is gathered (fp32 at world size 1 here;
# the other stage-3 cases are refused below)
MODEL_CASES = CASES


@pytest.mark.parametrize("name", list(MODEL_CASES))
def test_the_whole_forward_compiled_gives_the_eager_losses(group, tmp_path, name, capsys):
    eager, compiled, graphs = _eager_then_compiled(tmp_path, MODEL_CASES[name], scope="model")
    assert graphs >= 1
    torch.testing.assert_close(torch.tensor(compiled), torch.tensor(eager), rtol=1e-6, atol=0)
    assert "train.compile: the whole forward compiled (aot_eager); first step" in capsys.readouterr().out


BF16 = {"bf16": {"enabled": True}}
PURE_BF16 = {"bf16": {"enabled": True, "bf16_master_weights_and_grads": True, "bf16_optimizer_states": True}}
GATHERS = "ZeRO stage 3 gathers each unit from hooks inside the forward"


@pytest.mark.parametrize(
    "stage,zero_extra,ds_extra,world_size,match",
    [
        # a bf16 model over an fp32 master: each gather casts
        (3, None, BF16, 1, GATHERS),
        # offloaded params: each gather is a host->device copy
        (3, {"offload_param": {"device": "cpu"}}, None, 1, GATHERS),
        # several ranks: each gather is an all-gather
        (3, None, None, 2, GATHERS),
        (
            2,
            {"offload_optimizer": {"device": "cpu", "overlap_step": True}},
            None,
            1,
            "overlap_step publishes",
        ),
    ],
    ids=["stage3-bf16-fp32-master", "stage3-offload-param", "stage3-world2", "stage2-overlap-step"],
)
def test_the_whole_forward_is_refused_where_hooks_run_inside_it(
    tmp_path, stage, zero_extra, ds_extra, world_size, match
):
    with pytest.raises(RecipeError, match=rf"`train.compile_scope` is model .*{match}") as e:
        _recipe(
            tmp_path,
            stage,
            compile_on=True,
            zero_extra=zero_extra,
            scope="model",
            ds_extra=ds_extra,
            world_size=world_size,
        )
    assert stage != 3 or "world size 1 without offload_param" in str(e.value)


@pytest.mark.parametrize(
    "zero_extra,ds_extra",
    [(None, None), (None, PURE_BF16), ({"offload_optimizer": {"device": "cpu"}}, BF16)],
    ids=["fp32", "pure-bf16", "bf16-optimizer-offload"],
)
def test_the_whole_forward_is_accepted_at_stage_3_where_every_unit_aliases(tmp_path, zero_extra, ds_extra):
    recipe = _recipe(tmp_path, 3, compile_on=True, zero_extra=zero_extra, scope="model", ds_extra=ds_extra)
    assert recipe.engine.zero.stage == 3 and recipe.train.compile_scope == "model"


def test_the_loop_refuses_a_whole_forward_compile_over_forward_hooks(group, tmp_path, monkeypatch):
    # the config allowed it (every unit should alias), but the built engine hooks its forward after all
    from zerolaunch.util.errors import TrainError
    from zerolaunch.zero.stage3.unit_sharding import UnitSharding

    monkeypatch.setattr(UnitSharding, "_forward_without_hooks", lambda self: False)
    recipe = _recipe(tmp_path, 3, compile_on=True, scope="model")
    with pytest.raises(TrainError, match="gathers at least one unit from hooks inside the forward"):
        run_training(recipe, _ctx())


@pytest.mark.parametrize(
    "train,match",
    [
        ({"compile": "yes"}, "`train.compile` must be true or false"),
        ({"compile": True, "compile_scope": "layers"}, "must be one of blocks, model"),
        ({"compile_scope": "model"}, "train.compile is false, so it would do nothing"),
        ({"compile": True, "compile_backend": "inductr"}, "must be one of inductor, aot_eager, eager"),
        ({"compile_backend": "aot_eager"}, "train.compile is false, so it would do nothing"),
    ],
)
def test_bad_compile_values_are_recipe_errors(tmp_path, train, match):
    recipe = {
        "model": {"builder": "zerolaunch.models.gpt:build", "args": {"size": "tiny"}},
        "train": {"steps": 1, "micro_batch_size": 1, **train},
    }
    with pytest.raises(RecipeError, match=match):
        load_recipe(recipe, world_size=1)


def test_recipe_show_reports_the_compile_keys(tmp_path):
    recipe = load_recipe(
        {
            "model": {"builder": "zerolaunch.models.gpt:build", "args": {"size": "tiny"}},
            "train": {"steps": 1, "micro_batch_size": 1, "compile": True},
        },
        world_size=1,
    )
    assert recipe.train.compile is True and recipe.train.compile_backend == "inductor"
    assert recipe.train.compile_scope == "blocks" and recipe.origins["train.compile_scope"] == "default"
    assert recipe.origins["train.compile"] == "file" and recipe.origins["train.compile_backend"] == "default"


def test_the_cli_exits_2_on_an_unknown_compile_value(tmp_path):
    import os
    import subprocess
    import sys

    bad = tmp_path / "bad.yaml"
    bad.write_text(
        "model:\n  builder: zerolaunch.models.gpt:build\n  args: {size: tiny}\n"
        "train:\n  steps: 1\n  micro_batch_size: 1\n  compile: true\n  compile_backend: tvm\n"
    )
    p = subprocess.run(
        [sys.executable, "-m", "zerolaunch", "recipe", "show", str(bad)],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ},
    )
    assert p.returncode == 2, (p.stdout, p.stderr)
    text = p.stdout + p.stderr
    assert "line 8: `train.compile_backend` must be one of inductor, aot_eager, eager" in text
    assert "Traceback" not in text
