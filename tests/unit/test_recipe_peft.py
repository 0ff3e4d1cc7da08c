"""The recipe's `peft:` block: resolved into `recipe.peft` (a frozen PeftSection with LoraConfig's names),
round-tripped through recipe.resolved.json, shown by the table, and refused with the key's name and the fix
when wrong (unknown key with did-you-mean, bad values, peft not installed). Which module names exist is
checked once the model is built (tests/e2e/test_peft_recipe.py)."""

from __future__ import annotations

import importlib.util

import pytest

from zerolaunch.config import load_recipe
from zerolaunch.config.errors import RecipeError
from zerolaunch.config.schema import PeftSection, Recipe, flat_items


def _recipe(peft):
    return {"peft": peft} if peft is not None else {}


def test_absent_block_is_none():
    assert load_recipe(_recipe(None)).peft is None


def test_block_resolves_with_lora_config_names_and_defaults():
    recipe = load_recipe(_recipe({"r": 16, "lora_alpha": 32, "target_modules": ["q_proj", "v_proj"]}))
    assert recipe.peft == PeftSection(
        r=16,
        lora_alpha=32,
        lora_dropout=0.0,
        target_modules=("q_proj", "v_proj"),
        bias="none",
        modules_to_save=(),
    )
    assert recipe.origins["peft.r"] == "file" and recipe.origins["peft.lora_dropout"] == "default"
    assert Recipe.from_json(recipe.to_json()).peft == recipe.peft
    rows = dict(flat_items(recipe))
    assert rows["peft.r"] == 16 and rows["peft.target_modules"] == ["q_proj", "v_proj"]


def test_all_linear_and_modules_to_save():
    peft = load_recipe(
        _recipe({"target_modules": "all-linear", "modules_to_save": ["lm_head"], "bias": "lora_only"})
    ).peft
    assert (peft.target_modules, peft.modules_to_save, peft.bias) == ("all-linear", ("lm_head",), "lora_only")
    assert Recipe.from_json(
        load_recipe(_recipe({"target_modules": "all-linear"})).to_json()
    ).peft.target_modules == ("all-linear")


@pytest.mark.parametrize(
    "block, needles",
    [
        ({"rank": 8}, ["peft.rank", "Did you mean `r`"]),
        ({"r": 0}, ["peft.r", "between 1 and"]),
        ({"lora_dropout": 1.5}, ["peft.lora_dropout", "between 0.0 and 1.0"]),
        ({"lora_alpha": 0}, ["peft.lora_alpha", "> 0"]),
        ({"target_modules": "q_proj"}, ["peft.target_modules", "all-linear", "[q_proj]"]),
        ({"bias": "some"}, ["peft.bias", "lora_only"]),
        ([8], ["peft", "mapping"]),
    ],
)
def test_bad_values_refused_at_the_key(block, needles):
    with pytest.raises(RecipeError) as err:
        load_recipe(_recipe(block))
    for needle in needles:
        assert needle in str(err.value)


def test_peft_not_installed_is_a_recipe_error(monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "peft" else real(name, *a)
    )
    with pytest.raises(RecipeError, match="pip install peft"):
        load_recipe(_recipe({"r": 4}))


def test_target_modules_checked_against_the_model():
    from torch import nn

    from zerolaunch.models.peft import target_problem

    model = nn.Sequential()
    model.add_module("proj", nn.Linear(3, 3))
    model.add_module("head", nn.Linear(3, 2))
    assert target_problem(model, PeftSection(target_modules=("proj",), modules_to_save=("head",))) is None
    typo = target_problem(model, PeftSection(target_modules=("proj", "heda")))
    assert "`heda`" in typo and "Did you mean `head`" in typo
    assert "modules_to_save" in target_problem(
        model, PeftSection(target_modules=("proj",), modules_to_save=("x",))
    )
    assert "all-linear" in target_problem(model, PeftSection(target_modules="all-linear"))
