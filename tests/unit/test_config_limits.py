"""The recipe loader's limits: key types, depth, size, integer bounds and DeepSpeed key types.

Each case is a recipe a user could write (or a tool could generate) that used to crash the loader with a
TypeError / RecursionError, take minutes, or pass and fail later inside torch. Each must now be one
`RecipeError` naming the key or the limit, fast. Leaves out: the fuzzed mixtures (test_fuzz_recipes.py).
"""

from __future__ import annotations

import json
import time

import pytest
import yaml

from zerolaunch.config import load_recipe
from zerolaunch.config.errors import RecipeError
from zerolaunch.config.limits import MAX_DEPTH, MAX_RECIPE_BYTES, MAX_VALUES, scan_yaml_events


def _error(tmp_path, text: str, name: str = "r.yaml") -> str:
    file = tmp_path / name
    file.write_text(text)
    start = time.perf_counter()
    with pytest.raises(RecipeError) as err:
        load_recipe(file, check_builders=True)
    assert time.perf_counter() - start < 5
    message = " ".join(err.value.message.split())
    assert str(file) in message
    return message


@pytest.mark.parametrize(
    "text,key,where,kind",
    [
        ("on: 1\n", "on", "at the top level", "a boolean"),
        ("train:\n  no: 1\n", "no", "under `train`", "a boolean"),
        ("null: 1\n", "null", "at the top level", "null"),
        ("1.5: x\n", "1.5", "at the top level", "a number"),
        ("1: x\n", "1", "at the top level", "an integer"),
        (
            "deepspeed:\n  zero_optimization:\n    off: 2\n",
            "off",
            "under `deepspeed.zero_optimization`",
            "a boolean",
        ),
        ("model:\n  args:\n    2024-01-01: 2\n", "2024-01-01", "under `model.args`", "a date"),
    ],
)
def test_a_key_yaml_does_not_read_as_a_name(tmp_path, text, key, where, kind):
    message = _error(tmp_path, text)
    assert f"the key `{key}` {where} is read by YAML as {kind}" in message
    assert f"line {text.count(chr(10))}" in message
    assert f'Quote it ("{key}": ...)' in message


def test_a_quoted_key_is_a_name(tmp_path):
    message = _error(tmp_path, '"on": 1\n')
    assert "unknown top-level key `on`" in message


@pytest.mark.parametrize(
    "text",
    [
        "a: " + "[" * 5000 + "]" * 5000 + "\n",  # flow: the C composer would crash at 100k
        "a: " + "[" * 100_000 + "]" * 100_000 + "\n",
        "a:\n" + "- " * 5000 + "x\n",
        "".join("  " * i + f"k{i}:\n" for i in range(40)),
    ],
    ids=["flow-5000", "flow-100k", "block-seq-5000", "mapping-40"],
)
def test_deep_nesting_is_refused_with_the_limit(tmp_path, text):
    assert f"nest deeper than {MAX_DEPTH} levels" in _error(tmp_path, text)


class _CappedLoader(yaml.SafeLoader):
    """A YAML library whose scanner refuses deep flow nesting itself while looking ahead, before the parser
    yields the events our depth check counts (libyaml in newer PyYAML wheels stops at 1000 levels)."""

    def fetch_flow_collection_start(self, token_class):
        if self.flow_level >= 2 * MAX_DEPTH:
            mark = self.get_mark()
            raise yaml.scanner.ScannerError("while increasing flow level", mark, "too deep", mark)
        super().fetch_flow_collection_start(token_class)


@pytest.mark.parametrize("depth", [MAX_DEPTH + 1, 5000])
def test_deep_nesting_is_named_as_our_limit_when_the_yaml_library_stops_first(depth):
    text = "a: " + "[" * depth + "]" * depth + "\n"
    with pytest.raises(RecipeError) as err:
        scan_yaml_events(text, "r.yaml", _CappedLoader)
    assert err.value.message.startswith(f"r.yaml line 1: mappings and lists nest deeper than {MAX_DEPTH}")


def test_a_syntax_error_stays_the_yaml_librarys_own():
    with pytest.raises(yaml.YAMLError):
        scan_yaml_events("a: [1, 2\nb: ]]\n", "r.yaml", _CappedLoader)


def test_deep_json_is_refused_with_the_limit(tmp_path):
    text = '{"train": ' + "[" * 100_000 + "]" * 100_000 + "}"
    assert f"nest deeper than {MAX_DEPTH} levels" in _error(tmp_path, text, "ds.json")


def test_a_10_mb_recipe_is_refused_before_it_is_read(tmp_path):
    text = "data:\n  args:\n    x: [" + "1," * 5_000_000 + "1]\n"
    message = _error(tmp_path, text)
    assert f"a recipe is limited to {MAX_RECIPE_BYTES:,} bytes" in message


def test_a_long_list_and_an_anchor_bomb_are_refused(tmp_path):
    long = "data:\n  args:\n    x: [" + "1," * (MAX_VALUES + 10) + "1]\n"
    assert f"more than {MAX_VALUES:,} keys, values and list items" in _error(tmp_path, long)
    bomb = "a: &a [1,1,1,1,1,1,1,1,1,1]\n" + "".join(
        f"{n}: &{n} [{', '.join([f'*{p}'] * 10)}]\n" for p, n in zip("abcde", "bcdef", strict=True)
    )
    assert "anchors counted each time they are used" in _error(tmp_path, bomb)


@pytest.mark.parametrize(
    "text,key,limit",
    [
        ("train: {gradient_accumulation_steps: 1e30}\n", "train.gradient_accumulation_steps", "2**20"),
        ("train: {micro_batch_size: 1e30}\n", "train.micro_batch_size", "2**20"),
        ("train: {steps: 1e30}\n", "train.steps", "2**40"),
        ("train: {global_batch_size: 1e12}\n", "train.global_batch_size", "2**30"),
        ("model: {args: {vocab_size: 1099511627776}}\n", "model.args.vocab_size", "2**24"),
        ("data: {args: {seq_len: 1e30}}\n", "data.args.seq_len", "2**24"),
        ("checkpoint: {every: 1e30}\n", "checkpoint.every", "2**40"),
        ("train: {seed: 1e30}\n", "train.seed", "2**63 - 1"),
        (
            "deepspeed: {zero_optimization: {reduce_bucket_size: 1e15}}\n",
            "deepspeed.zero_optimization.reduce_bucket_size",
            "2**40",
        ),
        (
            "deepspeed: {train_micro_batch_size_per_gpu: 1e30}\n",
            "deepspeed.train_micro_batch_size_per_gpu",
            "2**20",
        ),
    ],
)
def test_absurd_sizes_are_refused_with_the_bound_named(tmp_path, text, key, limit):
    message = _error(tmp_path, text)
    assert f"`{key}`" in message
    assert f"above the limit of {limit}" in message


def test_sizes_at_their_bound_load(tmp_path):
    file = tmp_path / "r.yaml"
    file.write_text(
        "train: {micro_batch_size: 1048576, steps: 1e12}\nmodel: {args: {vocab_size: 16777216}}\n"
    )
    recipe = load_recipe(file)
    assert recipe.train.micro_batch_size == 2**20
    assert recipe.train.steps == 10**12


@pytest.mark.parametrize(
    "block,key,expected",
    [
        ({"steps_per_print": [1]}, "deepspeed.steps_per_print", "a whole number or null"),
        (
            {"zero_optimization": {"contiguous_gradients": "abc"}},
            "deepspeed.zero_optimization.contiguous_gradients",
            "true or false",
        ),
        (
            {"zero_optimization": {"reduce_scatter": "auto"}},
            "deepspeed.zero_optimization.reduce_scatter",
            "true or false",
        ),
        (
            {"zero_optimization": {"sub_group_size": 1.5}},
            "deepspeed.zero_optimization.sub_group_size",
            "a whole number",
        ),
        ({"wall_clock_breakdown": 1}, "deepspeed.wall_clock_breakdown", "true or false"),
        ({"checkpoint": "x"}, "deepspeed.checkpoint", "a mapping"),
    ],
)
def test_deepspeed_keys_without_effect_still_get_deepspeeds_type(tmp_path, block, key, expected):
    message = _error(tmp_path, json.dumps({"deepspeed": block}), "r.json")
    assert f"`{key}` must be {expected} (DeepSpeed's type for it)" in message


def test_deepspeed_no_effect_keys_of_the_right_type_load_noted(tmp_path):
    block = {
        "steps_per_print": None,
        "zero_optimization": {"contiguous_gradients": True, "sub_group_size": 1e9},
    }
    file = tmp_path / "r.json"
    file.write_text(json.dumps({"deepspeed": block}))
    recipe = load_recipe(file)
    assert "no effect" in recipe.notes["deepspeed.zero_optimization.sub_group_size"]


@pytest.mark.parametrize(
    "args,expected",
    [
        (
            "data: {args: {seqlen: 3}}",
            "`data.args.seqlen` is not an argument of the builder (zerolaunch.data.synthetic:build). Did you mean `seq_len`?",
        ),
        ("data: {args: {seed: 3}}", "`data.args.seed` is passed by zerolaunch itself"),
        ("data: {args: {seq_len: auto}}", '`data.args.seq_len` is "auto"'),
        ("data: {args: {seq_len: -1}}", "`data.args.seq_len` must be >= 1"),
        ("model: {args: {size: huge}}", "`model.args.size` is 'huge', not a built-in GPT size"),
        ("model: {args: {dropout: 2}}", "`model.args.dropout` must be between 0.0 and 1.0"),
    ],
)
def test_builder_args_are_checked_at_load(tmp_path, args, expected):
    assert expected in _error(tmp_path, args + "\n")


def test_a_set_value_gets_the_same_limits(tmp_path):
    file = tmp_path / "r.yaml"
    file.write_text("train: {steps: 2}\n")
    with pytest.raises(RecipeError) as deep:
        load_recipe(file, overrides=["model.args.x=" + "[" * 100_000 + "]" * 100_000])
    assert deep.value.message.startswith(
        "--set model.args.x=... line 1: mappings and lists nest deeper than 32"
    )
    with pytest.raises(RecipeError) as key:
        load_recipe(file, overrides=["model.args={1: 2}"])
    assert "the key 1 at the top level is an integer, not a name" in key.value.message
