"""The Trainer door's engine options: the DeepSpeed config of zero_args' TrainingArguments, filled by
hf/config.py, resolved by config's `deepspeed_engine_options` (no recipe: the door brings its model and data).
What the options are for each DeepSpeed key is tests/unit's (test_deepspeed_engine_options.py and the config
tests); here, that the trained and the frozen model's options come that way, with its errors."""

from __future__ import annotations

import copy
from types import SimpleNamespace

import pytest

pytest.importorskip("transformers", minversion="5.17")  # the Trainer hooks zerolaunch.hf replaces

from zerolaunch.config import RecipeError, deepspeed_engine_options  # noqa: E402
from zerolaunch.config.hidden import ModelHidden  # noqa: E402
from zerolaunch.hf import TrainingArguments  # noqa: E402
from zerolaunch.hf.reference import frozen_options  # noqa: E402
from zerolaunch.hf.trainer import ZeroTrainerMixin  # noqa: E402

HIDDEN = 24
MODEL = SimpleNamespace(config=SimpleNamespace(hidden_size=HIDDEN))


def _trainer(ds_config: dict | str) -> SimpleNamespace:
    """What the mixin's config and options steps read of a Trainer: its arguments and model."""
    args = TrainingArguments(output_dir="/tmp/unused", report_to=[], use_cpu=True, deepspeed=ds_config)
    return SimpleNamespace(args=args, model=MODEL)


def _trained_options(trainer, num_training_steps: int = 10):
    config, _ = ZeroTrainerMixin._zero_config(trainer, num_training_steps)
    return ZeroTrainerMixin._zero_options(trainer, config)


def test_a_deepspeed_checkpoint_block_reaches_the_engine_options():
    """DeepSpeed's own `checkpoint` block in a ds_config.json: read as a recipe, the config was refused (its
    keys taken for a recipe's checkpoint section)."""
    ds = {
        "checkpoint": {"tag_validation": "Warn"},
        "zero_optimization": {"stage": 2, "reduce_bucket_size": "auto"},
    }
    trainer = _trainer(ds)
    options = _trained_options(trainer)
    assert (options.zero.stage, options.zero.reduce_bucket_size) == (2, HIDDEN * HIDDEN)
    assert options.gradient_accumulation_steps == 1  # the Trainer normalizes the loss over the window itself
    frozen = frozen_options(trainer.args, MODEL)
    assert (frozen.zero.stage, frozen.zero.reduce_bucket_size) == (2, HIDDEN * HIDDEN)


def test_the_trained_options_are_the_filled_configs():
    trainer = _trainer({"zero_optimization": {"stage": 1}, "optimizer": {"type": "AdamW", "params": {}}})
    config, _ = ZeroTrainerMixin._zero_config(trainer, 10)
    expected = deepspeed_engine_options(
        copy.deepcopy(config),
        world_size=trainer.args.world_size,
        model_hidden=ModelHidden(HIDDEN, "the model's config.hidden_size"),
    )
    options = ZeroTrainerMixin._zero_options(trainer, config)
    assert options.zero == expected.zero and options.optimizer == expected.optimizer
    assert options.gradient_accumulation_steps == 1


def test_a_bad_key_gets_the_configs_named_error():
    trainer = _trainer({"zero_optimization": {"stage": 2, "reduce_bucket_sise": 1000}})
    with pytest.raises(RecipeError) as trained:
        _trained_options(trainer)
    with pytest.raises(RecipeError) as frozen:
        frozen_options(trainer.args, MODEL)
    for err in (trained, frozen):
        # named as the user gave it (here a dict), not as a recipe they never wrote
        assert str(err.value).startswith(
            "the DeepSpeed config given as a dict (TrainingArguments deepspeed=)"
        )
        assert "zero_optimization.reduce_bucket_sise" in str(err.value)
        assert "`reduce_bucket_size`" in str(err.value)  # the did-you-mean


def test_a_config_file_is_named_by_its_path(tmp_path):
    path = tmp_path / "ds_config.json"
    path.write_text('{"zero_optimization": {"stage": 2, "reduce_bucket_sise": 1000}}')
    trainer = _trainer(str(path))
    with pytest.raises(RecipeError) as err:
        _trained_options(trainer)
    assert str(err.value).startswith(f"the DeepSpeed config {path} (TrainingArguments deepspeed=)")
