"""The batch rule (global = micro * accum * world_size) in every direction, and its two spellings.

Covers `solve_batch` directly and through `load_recipe` (train.* keys vs the DeepSpeed keys, "auto",
conflicts). Leaves out everything else about recipes (test_config_load / _deepspeed / _auto).
"""

import pytest

from zerolaunch.config import RecipeError, load_recipe
from zerolaunch.config.auto import solve_batch


@pytest.mark.parametrize(
    ("micro", "accum", "global_", "world", "expected", "derived"),
    [
        (3, 2, None, 4, (3, 2, 24), {"global_batch_size"}),
        (3, None, 24, 4, (3, 2, 24), {"gradient_accumulation_steps"}),
        (None, 2, 24, 4, (3, 2, 24), {"micro_batch_size"}),
        (None, None, 24, 4, (6, 1, 24), {"micro_batch_size", "gradient_accumulation_steps"}),
        (5, None, None, 3, (5, 1, 15), {"global_batch_size"}),
        (None, 7, None, 1, (4, 7, 28), {"global_batch_size"}),
        (None, None, None, 2, (4, 1, 8), {"global_batch_size"}),
        (3, 2, 24, 4, (3, 2, 24), set()),
    ],
)
def test_any_two_derive_the_third(micro, accum, global_, world, expected, derived):
    m, a, g, names = solve_batch(micro, accum, global_, world)
    assert (m, a, g) == expected
    assert m * a * world == g
    assert names == derived


def test_all_three_inconsistent_shows_the_arithmetic():
    with pytest.raises(RecipeError) as err:
        solve_batch(4, 2, 32, 2)
    assert "32 != micro_batch_size 4 * gradient_accumulation_steps 2 * world_size 2 = 16" in str(err.value)


@pytest.mark.parametrize(
    ("micro", "accum", "global_", "world"), [(3, None, 20, 2), (None, 3, 20, 2), (None, None, 3, 4)]
)
def test_indivisible_global_is_an_error(micro, accum, global_, world):
    with pytest.raises(RecipeError, match="not divisible"):
        solve_batch(micro, accum, global_, world)


def test_train_keys_and_deepspeed_keys_are_one_value():
    recipe = load_recipe(
        {"train": {"global_batch_size": 64}, "deepspeed": {"train_micro_batch_size_per_gpu": 4}}, world_size=4
    )
    assert (recipe.train.micro_batch_size, recipe.train.gradient_accumulation_steps) == (4, 4)
    assert recipe.engine.gradient_accumulation_steps == 4
    assert recipe.origins["train.gradient_accumulation_steps"] == "derived"
    assert recipe.origins["train.micro_batch_size"] == "file"


def test_deepspeed_auto_takes_the_train_value():
    recipe = load_recipe(
        {
            "train": {"micro_batch_size": 2, "gradient_accumulation_steps": 3},
            "deepspeed": {"train_batch_size": "auto", "gradient_accumulation_steps": "auto"},
        },
        world_size=2,
    )
    assert recipe.train.global_batch_size == 12
    assert recipe.origins["engine.gradient_accumulation_steps"] == "auto"


def test_conflicting_spellings_are_an_error_naming_both():
    with pytest.raises(RecipeError) as err:
        load_recipe({"train": {"micro_batch_size": 2}, "deepspeed": {"train_micro_batch_size_per_gpu": 3}})
    message = str(err.value)
    assert "train.micro_batch_size" in message and "deepspeed.train_micro_batch_size_per_gpu" in message
    assert "disagree" in message


def test_world_size_changes_the_derived_value():
    spec = {"train": {"global_batch_size": 32, "micro_batch_size": 4}}
    assert load_recipe(spec, world_size=1).train.gradient_accumulation_steps == 8
    assert load_recipe(spec, world_size=8).train.gradient_accumulation_steps == 1
    with pytest.raises(RecipeError, match="world_size 16"):
        load_recipe(spec, world_size=16)


@pytest.mark.parametrize("bad", [0, -2, 2.5, "four", True])
def test_batch_values_must_be_positive_integers(bad):
    with pytest.raises(RecipeError, match="train.micro_batch_size"):
        load_recipe({"train": {"micro_batch_size": bad}})
