"""config's `deepspeed_engine_options`: a DeepSpeed config dict -> EngineOptions, the Hugging Face door's way
in. Checked against `load_recipe` on the same dict (options and error messages alike, over the real configs of
tests/data/ds_configs), and shown to read no model, data or checkpoint section. The Trainer's use of it is
tests/hf's (test_hf_engine_options.py)."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest

import zerolaunch.config.load as load_module
from zerolaunch.config import RecipeError, UserError, deepspeed_engine_options, load_recipe
from zerolaunch.config.hidden import ModelHidden

CORPUS = Path(__file__).resolve().parents[1] / "data" / "ds_configs"
H = ModelHidden(24, "the model's config.hidden_size")


def _corpus() -> list[tuple[str, int]]:
    rows = []
    for line in (CORPUS / "EXPECTED.tsv").read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            name, world, *_ = line.split("\t")
            rows.append((name, int(world)))
    return rows


def _outcome(resolve):
    """The options, or the message of the user error, of one resolution."""
    try:
        return resolve()
    except UserError as err:
        return f"refused: {err}"


@pytest.mark.parametrize(("name", "world_size"), _corpus(), ids=[n for n, _ in _corpus()])
def test_a_real_config_resolves_as_load_recipe_resolves_it(name, world_size):
    config = json.loads((CORPUS / name).read_text())
    given = copy.deepcopy(config)
    # named as load_recipe names a dict, so that the messages compare whole
    ours = _outcome(
        lambda: deepspeed_engine_options(config, world_size=world_size, model_hidden=H, source="the recipe")
    )
    recipe = _outcome(lambda: load_recipe(config, world_size=world_size, model_hidden=H))
    assert ours == (recipe if isinstance(recipe, str) else recipe.engine)
    assert config == given  # the caller's dict is not normalized in place


@pytest.mark.parametrize(
    "config",
    [
        {"zero_optimization": {"stage": 2, "reduce_bucket_sise": 1000}},  # a misspelt key: did you mean
        {"zero_optimization": {"stage": 7}},  # a value out of range (the engine's rule)
        {
            "zero_optimization": {"stage": 2, "offload_param": {"device": "cpu"}}
        },  # offload_param needs stage 3
        {"bf16": {"enabled": True}, "fp16": {"enabled": True}},
        {"optimizer": {"type": "Lamb"}},
        {"zero_optimization": {"stage": 3, "reduce_bucket_size": "auto"}, "train_batch_size": 3},
    ],
)
def test_a_bad_config_gets_load_recipes_error(config):
    with pytest.raises(RecipeError) as ours:
        deepspeed_engine_options(copy.deepcopy(config), world_size=2, model_hidden=H, source="the recipe")
    with pytest.raises(RecipeError) as recipe:
        load_recipe(copy.deepcopy(config), world_size=2, model_hidden=H)
    assert str(ours.value) == str(recipe.value)


def test_an_error_names_the_config_as_its_caller_names_it():
    bad = {"zero_optimization": {"stag": 2}}
    with pytest.raises(
        RecipeError, match=r"^the DeepSpeed config: unknown DeepSpeed key `zero_optimization\.stag`"
    ):
        deepspeed_engine_options(copy.deepcopy(bad), world_size=2, model_hidden=H)
    with pytest.raises(RecipeError, match=r"^ds_config\.json \(from the Trainer\): unknown DeepSpeed key"):
        deepspeed_engine_options(
            bad, world_size=2, model_hidden=H, source="ds_config.json (from the Trainer)"
        )


def test_no_model_data_or_checkpoint_section_is_read(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("a recipe section was resolved")

    monkeypatch.setattr(load_module, "_sections", refuse)
    monkeypatch.setattr(load_module, "resolve_peft", refuse)
    options = deepspeed_engine_options(
        {"zero_optimization": {"stage": 3, "reduce_bucket_size": "auto"}}, world_size=2, model_hidden=H
    )
    assert (options.zero.stage, options.zero.reduce_bucket_size) == (3, 24 * 24)


def test_deepspeeds_checkpoint_block_is_a_deepspeed_key():
    """A ds_config.json may carry DeepSpeed's own `checkpoint` block; as a recipe it would be the recipe's
    checkpoint section, and the config's other keys DeepSpeed keys out of place."""
    config = {"checkpoint": {"tag_validation": "Warn"}, "zero_optimization": {"stage": 2}}
    with pytest.raises(RecipeError):
        load_recipe(copy.deepcopy(config), world_size=2, model_hidden=H)
    assert deepspeed_engine_options(config, world_size=2, model_hidden=H).zero.stage == 2


def test_a_config_is_deepspeeds_even_when_empty():
    """{} is DeepSpeed's defaults (stage 0), as `deepspeed: {}` in a recipe, not zerolaunch's own (stage 1)."""
    assert deepspeed_engine_options({}, world_size=1, model_hidden=H).zero.stage == 0


def test_a_bucket_auto_needs_the_models_hidden_size():
    config = {"zero_optimization": {"stage": 2, "reduce_bucket_size": "auto"}}
    unknown = ModelHidden(None, "the model's config (no hidden_size or hidden_sizes)")
    with pytest.raises(RecipeError, match=r"reduce_bucket_size.*no hidden_size or hidden_sizes"):
        deepspeed_engine_options(config, world_size=1, model_hidden=unknown)


@pytest.mark.parametrize("world_size", [0, True, 1.5])
def test_a_bad_world_size_is_refused(world_size):
    with pytest.raises(RecipeError, match="world size must be a positive integer"):
        deepspeed_engine_options({}, world_size=world_size, model_hidden=H)


def test_a_config_that_is_no_mapping_is_refused():
    with pytest.raises(RecipeError, match="must be a mapping, got list"):
        deepspeed_engine_options([{"zero_optimization": {}}], world_size=1, model_hidden=H)
