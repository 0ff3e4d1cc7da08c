"""The engine's option rules and the recipe check are one source (issue #18): every rule in
zero/option_rules.py has a case in tests/_option_cases.py, the engine rejects the case's EngineOptions and the
recipe loader rejects the case's recipe at the key the user wrote (file, line, expected values).

Also: options that load from the shipped recipes and the DeepSpeed corpus have no problems (so they pass the
engine's check), and --set / bare ds_config.json spellings of a key. Leaves out the CLI (tests/e2e/
test_cli_option_rules.py) and checks that need a model (stage-3 units, param group counts).
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
from _option_cases import CASES

from zerolaunch.config import RecipeError, load_recipe
from zerolaunch.zero.option_rules import RULES, option_problems
from zerolaunch.zero.options import EngineOptions, ZeroOptions

ROOT = Path(__file__).resolve().parents[2]


def test_every_rule_has_a_case():
    assert sorted(c.rule for c in CASES) == sorted(rule.key for rule in RULES)


def test_default_options_break_no_rule():
    assert option_problems(EngineOptions()) == []


@pytest.mark.parametrize("case", CASES, ids=[c.rule for c in CASES])
def test_the_engine_rejects_the_case_naming_its_key(case):
    from zerolaunch.zero.protocol import validate_options

    assert [p.key for p in option_problems(case.options)] == [case.rule]
    with pytest.raises(ValueError, match=rf"^{case.rule} .*{case.needle}"):
        validate_options(case.options)


@pytest.mark.parametrize("case", CASES, ids=[c.rule for c in CASES])
def test_the_recipe_check_rejects_the_same_case_at_the_key_written(tmp_path, case):
    path = tmp_path / "r.yaml"
    path.write_text(case.recipe)
    with pytest.raises(RecipeError) as err:
        load_recipe(path)
    message = str(err.value)
    assert message.startswith(f"{path} line {case.line}: `{case.key}`"), message
    assert case.needle in message


def test_stage3_max_live_parameters_negative_is_refused_below_stage_3_by_both():
    """The issue's disagreement: the recipe refused a negative value at any stage, the engine only at 3."""
    from zerolaunch.zero.protocol import validate_options

    for stage in (0, 1, 2, 3):
        options = EngineOptions(zero=ZeroOptions(stage=stage, stage3_max_live_parameters=-1))
        with pytest.raises(ValueError, match="stage3_max_live_parameters must be >= 0"):
            validate_options(options)
        with pytest.raises(RecipeError, match="`deepspeed.zero_optimization.stage3_max_live_parameters`"):
            load_recipe(
                {"deepspeed": {"zero_optimization": {"stage": stage, "stage3_max_live_parameters": -1}}}
            )


def _loadable() -> list[Path]:
    return sorted((ROOT / "recipes").glob("*.yaml")) + sorted((ROOT / "tests/data/ds_configs").glob("*.json"))


def test_what_the_recipe_check_passes_the_engine_check_passes():
    loaded = 0
    for path in _loadable():
        try:
            recipe = load_recipe(path, world_size=2)
        except RecipeError:
            continue  # refused: tests/unit/test_ds_config_corpus.py says why
        assert option_problems(recipe.engine) == [], path
        loaded += 1
    assert loaded >= 10


def test_a_broken_rule_from_set_names_the_flag(tmp_path):
    path = tmp_path / "r.yaml"
    path.write_text("train:\n  steps: 2\n")
    with pytest.raises(RecipeError) as err:
        load_recipe(path, overrides=["zero_optimization.offload_param.device=cpu"])
    message = str(err.value)
    assert message.startswith("--set zero_optimization.offload_param.device=cpu: ")
    assert "`deepspeed.zero_optimization.offload_param`" in message and "only ZeRO stage 3" in message


def test_a_bare_ds_config_is_named_without_the_deepspeed_prefix(tmp_path):
    path = tmp_path / "ds_config.json"
    path.write_text(
        '{\n  "zero_optimization": {\n    "stage": 1,\n    "stage3_max_reuse_distance": -1\n  }\n}\n'
    )
    with pytest.raises(RecipeError, match=rf"^{path} line 4: `zero_optimization.stage3_max_reuse_distance`"):
        load_recipe(path)


def test_a_rule_on_an_option_nobody_wrote_names_the_engine_key():
    from zerolaunch.config.engine_options import option_error
    from zerolaunch.config.tree import RawTree
    from zerolaunch.config.values import Resolver

    tree = RawTree()
    tree.put((), {"train": {}}, "file", "r.yaml", {})
    problem = option_problems(replace(EngineOptions(), gradient_accumulation_steps=0))[0]
    message = str(option_error(Resolver(tree, 1), problem))
    assert message.startswith("r.yaml: `engine.gradient_accumulation_steps` (default) must be >= 1"), message
