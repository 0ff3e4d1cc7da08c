""" "auto" resolution: bucket sizes from the hidden size (Hugging Face's rules), precision, optimizer and
scheduler values from the train section, and the clear error when an "auto" cannot be resolved.

Leaves out the batch rule (test_config_batch).
"""

import pytest

from zerolaunch.config import RecipeError, load_recipe
from zerolaunch.config.hidden import gpt_hidden_sizes

BUCKET_AUTOS = {
    "zero_optimization": {
        "stage": 3,
        "reduce_bucket_size": "auto",
        "stage3_prefetch_bucket_size": "auto",
        "stage3_param_persistence_threshold": "auto",
    }
}


@pytest.mark.parametrize("key", ["d_model", "hidden_size", "n_embd"])
def test_bucket_autos_from_model_args(key):
    recipe = load_recipe({"model": {"builder": "x.y:build", "args": {key: 96}}, "deepspeed": BUCKET_AUTOS})
    zero = recipe.engine.zero
    assert zero.reduce_bucket_size == 96 * 96
    assert zero.stage3_prefetch_bucket_size == int(0.9 * 96 * 96)
    assert zero.stage3_param_persistence_threshold == 960
    assert recipe.origins["engine.zero.reduce_bucket_size"] == "auto"
    assert f"h=96 (model.args.{key})" in recipe.notes["engine.zero.reduce_bucket_size"]


@pytest.mark.parametrize("size", ["tiny", "125m", "1.3b"])
def test_bucket_autos_from_the_builtin_gpt_size(size):
    h = gpt_hidden_sizes()[size]
    recipe = load_recipe({"model": {"args": {"size": size}}, "deepspeed": BUCKET_AUTOS})
    assert recipe.engine.zero.reduce_bucket_size == h * h
    assert recipe.engine.zero.stage3_param_persistence_threshold == 10 * h


def test_size_table_is_the_one_gpt_py_builds_from_and_needs_no_torch():
    import subprocess
    import sys

    from zerolaunch.models import gpt

    assert gpt_hidden_sizes() == {name: spec["d_model"] for name, spec in gpt.SIZES.items()}
    code = "import sys, zerolaunch.config.hidden; sys.exit('torch' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code]).returncode == 0


def test_bucket_autos_from_a_hugging_face_config(tmp_path, monkeypatch):
    inline = {
        "builder": "zerolaunch.models.hf:build",
        "args": {"config": {"model_type": "llama", "hidden_size": 32}},
    }
    assert load_recipe({"model": inline, "deepspeed": BUCKET_AUTOS}).engine.zero.reduce_bucket_size == 32 * 32
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "config.json").write_text('{"model_type": "gpt2", "n_embd": 48}')
    monkeypatch.chdir(tmp_path)
    folder = {"builder": "zerolaunch.models.hf:build", "args": {"path": "m"}}
    recipe = load_recipe({"model": folder, "deepspeed": BUCKET_AUTOS})
    assert recipe.engine.zero.stage3_param_persistence_threshold == 480
    assert "m/config.json" in recipe.notes["engine.zero.stage3_param_persistence_threshold"]


def test_unknown_hidden_size_is_a_clear_error():
    with pytest.raises(RecipeError) as err:
        load_recipe({"model": {"builder": "my.models:build"}, "deepspeed": BUCKET_AUTOS})
    message = str(err.value)
    assert "reduce_bucket_size" in message and "model.args.d_model" in message
    with pytest.raises(RecipeError, match="not a built-in GPT size"):
        load_recipe({"model": {"args": {"size": "huge"}}, "deepspeed": BUCKET_AUTOS})


def test_auto_only_where_resolvable():
    with pytest.raises(RecipeError, match="allgather_bucket_size"):
        load_recipe({"deepspeed": {"zero_optimization": {"allgather_bucket_size": "auto"}}})


@pytest.mark.parametrize(
    ("precision", "bf16", "fp16"), [("bf16", True, False), ("fp16", False, True), ("fp32", False, False)]
)
def test_precision_auto_follows_train_precision(precision, bf16, fp16):
    recipe = load_recipe(
        {
            "train": {"precision": precision},
            "deepspeed": {"bf16": {"enabled": "auto"}, "fp16": {"enabled": "auto"}},
        }
    )
    assert recipe.engine.precision.dtype == precision
    assert recipe.origins["engine.precision.dtype"] == "auto"


def test_optimizer_and_scheduler_autos_take_the_train_values():
    recipe = load_recipe(
        {
            "train": {
                "lr": 6e-4,
                "betas": [0.9, 0.95],
                "eps": 1e-6,
                "weight_decay": 0.1,
                "gradient_clipping": 0.5,
                "warmup_steps": 7,
                "steps": 70,
            },
            "deepspeed": {
                "optimizer": {
                    "type": "AdamW",
                    "params": {k: "auto" for k in ("lr", "betas", "eps", "weight_decay")},
                },
                "scheduler": {
                    "type": "WarmupDecayLR",
                    "params": {
                        k: "auto"
                        for k in ("warmup_min_lr", "warmup_max_lr", "warmup_num_steps", "total_num_steps")
                    },
                },
                "gradient_clipping": "auto",
            },
        }
    )
    opt, sched = recipe.engine.optimizer, recipe.engine.scheduler
    assert (opt.lr, opt.betas, opt.eps, opt.weight_decay) == (6e-4, (0.9, 0.95), 1e-6, 0.1)
    assert recipe.engine.gradient_clipping == 0.5
    assert (sched.warmup_min_lr, sched.warmup_max_lr, sched.warmup_num_steps, sched.total_num_steps) == (
        0.0,
        6e-4,
        7,
        70,
    )
    assert all(
        recipe.origins[f"engine.scheduler.{k}"] == "auto" for k in ("warmup_max_lr", "total_num_steps")
    )


def test_spelled_twice_conflicts():
    with pytest.raises(RecipeError, match="disagree"):
        load_recipe(
            {"train": {"lr": 1e-3}, "deepspeed": {"optimizer": {"type": "AdamW", "params": {"lr": 2e-3}}}}
        )
    with pytest.raises(RecipeError, match="disagree"):
        load_recipe({"train": {"gradient_clipping": 1.0}, "deepspeed": {"gradient_clipping": 0.3}})
    agreed = load_recipe(
        {"train": {"lr": 1e-3}, "deepspeed": {"optimizer": {"type": "AdamW", "params": {"lr": 1e-3}}}}
    )
    assert agreed.engine.optimizer.lr == 1e-3


def test_train_schedule_without_deepspeed():
    cosine = load_recipe({"train": {"steps": 40, "warmup_steps": 4}})
    assert (cosine.engine.scheduler.name, cosine.engine.scheduler.total_num_steps) == ("cosine", 40)
    constant = load_recipe({"train": {"lr_schedule": "constant", "warmup_steps": 4}})
    assert constant.engine.scheduler.name == "WarmupLR" and constant.engine.scheduler.warmup_type == "linear"
    assert load_recipe({"train": {"lr_schedule": "constant"}}).engine.scheduler.name == "none"
