"""Recipe files and overrides: YAML/JSON, line numbers, --set precedence, origins, paths, key names.

Leaves out the DeepSpeed vocabulary (test_config_deepspeed) and "auto" (test_config_auto).
"""

import json

import pytest

from zerolaunch.config import RecipeError, load_recipe
from zerolaunch.config.load import parse_override

RECIPE = """\
model:
  args:
    size: tiny
    dropout: 0.0
train:
  steps: 20
  lr: 1e-3
  micro_batch_size: 2
checkpoint:
  every: 5
"""


@pytest.fixture
def recipe_file(tmp_path):
    path = tmp_path / "exp.yaml"
    path.write_text(RECIPE)
    return path


def test_yaml_and_json_give_the_same_recipe(tmp_path, recipe_file):
    import yaml

    json_path = tmp_path / "exp.json"
    json_path.write_text(json.dumps(yaml.safe_load(RECIPE.replace("1e-3", "0.001"))))
    from_yaml, from_json = load_recipe(recipe_file), load_recipe(json_path)
    assert from_yaml.train == from_json.train
    assert from_yaml.engine == from_json.engine
    assert from_yaml.train.lr == 1e-3  # YAML 1.1 would read 1e-3 as a string


def test_precedence_set_over_file_over_default(recipe_file):
    recipe = load_recipe(recipe_file, overrides=["train.lr=3e-4", "zero_optimization.stage=3"])
    assert recipe.train.lr == 3e-4 and recipe.engine.optimizer.lr == 3e-4
    assert recipe.engine.zero.stage == 3
    assert recipe.origins["train.lr"] == "--set"
    assert recipe.origins["train.steps"] == "file"
    assert recipe.origins["train.seed"] == "default"
    assert recipe.origins["engine.zero.stage"] == "--set"
    assert recipe.origins["model.args.dropout"] == "file"


def test_a_deepspeed_key_given_only_by_set_keeps_zerolaunch_defaults(recipe_file):
    # DeepSpeed's defaults (stage 0, no scheduler) apply to a DeepSpeed block written in a file; one that
    # --set creates must not silently turn the recipe's ZeRO-1 into plain data parallel.
    plain = load_recipe(recipe_file)
    tuned = load_recipe(recipe_file, overrides=["zero_optimization.reduce_bucket_size=1000"])
    assert tuned.engine.zero.reduce_bucket_size == 1000
    assert tuned.engine.zero.stage == plain.engine.zero.stage == 1
    assert tuned.engine.scheduler == plain.engine.scheduler


def test_set_with_deepspeed_prefix_and_later_set_wins(recipe_file):
    recipe = load_recipe(
        recipe_file, overrides=["deepspeed.zero_optimization.stage=2", "zero_optimization.stage=3"]
    )
    assert recipe.engine.zero.stage == 3


@pytest.mark.parametrize(
    ("text", "path", "value"),
    [
        ("train.lr=3e-4", ("train", "lr"), 3e-4),
        ("train.activation_checkpointing=true", ("train", "activation_checkpointing"), True),
        ("bf16.enabled=auto", ("deepspeed", "bf16", "enabled"), "auto"),
        ("gradient_clipping=5e-1", ("deepspeed", "gradient_clipping"), 0.5),
        (
            "zero_optimization.reduce_bucket_size=5e8",
            ("deepspeed", "zero_optimization", "reduce_bucket_size"),
            5e8,
        ),
        ("train.betas=[0.9, 0.95]", ("train", "betas"), [0.9, 0.95]),
        ("model.args.name=gpt2", ("model", "args", "name"), "gpt2"),
    ],
)
def test_parse_override(text, path, value):
    assert parse_override(text) == (path, value)


@pytest.mark.parametrize("text", ["train.lr", "=3", "train..lr=1", "trian.lr=1", "reduce_bucket_size=5e8"])
def test_bad_overrides(text):
    with pytest.raises(RecipeError, match="--set"):
        parse_override(text)


def test_unknown_key_names_file_line_path_and_closest(recipe_file):
    recipe_file.write_text(RECIPE.replace("  micro_batch_size", "  micro_bach_size"))
    with pytest.raises(RecipeError) as err:
        load_recipe(recipe_file)
    message = str(err.value)
    assert f"{recipe_file} line 8" in message
    assert "`train.micro_bach_size`" in message and "Did you mean `micro_batch_size`?" in message


def test_unknown_top_level_key(tmp_path):
    path = tmp_path / "r.yaml"
    path.write_text("trian:\n  steps: 3\n")
    with pytest.raises(RecipeError, match=r"unknown top-level key `trian`. Did you mean `train`\?"):
        load_recipe(path)


def test_unknown_key_from_set_names_the_flag(recipe_file):
    with pytest.raises(RecipeError, match=r"--set train.step=3.*Did you mean `steps`"):
        load_recipe(recipe_file, overrides=["train.step=3"])


def test_yaml_syntax_error_has_the_line(tmp_path):
    path = tmp_path / "broken.yaml"
    path.write_text("train:\n  steps: 3\n  lr: [1e-3\nmodel: {}\n")
    with pytest.raises(RecipeError, match=r"broken.yaml line \d+, column \d+: not valid YAML"):
        load_recipe(path)


def test_json_syntax_error_has_the_line(tmp_path):
    path = tmp_path / "broken.json"
    path.write_text('{\n  "train": {"steps": 3,}\n}\n')
    with pytest.raises(RecipeError, match=r"broken.json line 2, column \d+: not valid JSON"):
        load_recipe(path)


def test_duplicate_keys_are_an_error(tmp_path):
    path = tmp_path / "dup.yaml"
    path.write_text("train:\n  lr: 1.0e-3\n  lr: 2.0e-3\n")
    with pytest.raises(RecipeError, match="duplicate key 'lr'"):
        load_recipe(path)


def test_missing_and_empty_files(tmp_path):
    with pytest.raises(RecipeError, match="does not exist"):
        load_recipe(tmp_path / "nope.yaml")
    (tmp_path / "empty.yaml").write_text("")
    with pytest.raises(RecipeError, match="is empty"):
        load_recipe(tmp_path / "empty.yaml")


def test_deepspeed_block_as_a_path_relative_to_the_recipe(tmp_path):
    (tmp_path / "conf").mkdir()
    (tmp_path / "conf" / "ds.json").write_text(
        json.dumps({"zero_optimization": {"stage": 2}, "train_batch_size": 16})
    )
    (tmp_path / "conf" / "r.yaml").write_text("deepspeed: ds.json\ntrain:\n  micro_batch_size: 2\n")
    recipe = load_recipe(tmp_path / "conf" / "r.yaml", world_size=2)
    assert recipe.engine.zero.stage == 2
    assert recipe.train.gradient_accumulation_steps == 4
    (tmp_path / "conf" / "r.yaml").write_text("deepspeed: missing.json\n")
    with pytest.raises(RecipeError, match="missing.json does not exist"):
        load_recipe(tmp_path / "conf" / "r.yaml")


def test_unknown_key_in_a_referenced_deepspeed_file_names_that_file(tmp_path):
    (tmp_path / "ds.json").write_text('{\n  "zero_optimization": {\n    "stag": 2\n  }\n}\n')
    (tmp_path / "r.yaml").write_text("deepspeed: ds.json\n")
    with pytest.raises(RecipeError) as err:
        load_recipe(tmp_path / "r.yaml")
    assert f"{tmp_path / 'ds.json'} line 3" in str(err.value) and "Did you mean `stage`?" in str(err.value)


def test_deepspeed_key_at_recipe_top_level_says_where_it_goes(tmp_path):
    path = tmp_path / "r.yaml"
    path.write_text("train:\n  steps: 2\nzero_optimization:\n  stage: 2\n")
    with pytest.raises(RecipeError, match="goes under `deepspeed:`"):
        load_recipe(path)


@pytest.mark.parametrize(
    ("spec", "match"),
    [
        ({"train": {"lr": -1e-3}}, "must be > 0"),
        ({"train": {"lr": "fast"}}, "must be a number"),
        ({"train": {"steps": 0}}, "must be >= 1"),
        ({"train": {"precision": "fp8"}}, "must be one of fp32, bf16, fp16"),
        ({"train": {"activation_checkpointing": "yes"}}, "must be true or false"),
        ({"train": {"betas": [0.9]}}, "two numbers"),
        ({"train": "fast"}, "must be a mapping"),
        ({"train": {"lr": "auto"}}, '"auto" belongs in the DeepSpeed block'),
        ({"checkpoint": {"keep": -1}}, "checkpoint.keep"),
        ({"entrypoint": "no_such_script.py"}, "does not exist"),
        ({"model": {"init_from": "no_such_weights.safetensors"}}, "does not exist"),
        ({"model": {"builder": "not-a-spec"}}, '"pkg.module:fn"'),
        ({"model": {"builder": "missing_file.py:build"}}, "does not exist"),
    ],
)
def test_bad_values_are_clear_errors(spec, match):
    with pytest.raises(RecipeError, match=match):
        load_recipe(spec)


def test_entrypoint_and_paths_resolve_against_the_recipe_folder(tmp_path):
    (tmp_path / "train_me.py").write_text("print('hi')\n")
    (tmp_path / "r.yaml").write_text("entrypoint: train_me.py\ntrain:\n  run_dir: out/x\n")
    recipe = load_recipe(tmp_path / "r.yaml")
    assert recipe.entrypoint == str((tmp_path / "train_me.py").resolve())
    assert recipe.checkpoint.dir == "out/x/checkpoints"
    assert recipe.origins["checkpoint.dir"] == "derived"


def test_world_size_must_be_positive():
    with pytest.raises(RecipeError, match="world size"):
        load_recipe({}, world_size=0)


def test_deepspeed_file_from_set_is_relative_to_the_working_dir(tmp_path, monkeypatch):
    (tmp_path / "ds.json").write_text('{"zero_optimization": {"stage": 3}}')
    monkeypatch.chdir(tmp_path)
    recipe = load_recipe({"train": {"steps": 3}}, overrides=["deepspeed=ds.json"])
    assert recipe.engine.zero.stage == 3 and recipe.origins["engine.zero.stage"] == "--set"
