"""hf/reference.py without ranks: the options a frozen side model's inference engine gets from the run's
DeepSpeed config, and the refusal of sync_ref_model at stage 3. The end-to-end runs are test_hf_dpo.py's."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

pytest.importorskip("transformers", minversion="5.17")

from transformers import LlamaConfig, LlamaForCausalLM  # noqa: E402

from zerolaunch.config.errors import UserError  # noqa: E402
from zerolaunch.hf.reference import frozen_options, prepare_frozen  # noqa: E402


def llama(hidden: int):
    config = LlamaConfig(
        vocab_size=32,
        hidden_size=hidden,
        intermediate_size=2 * hidden,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
    )
    return LlamaForCausalLM(config)


def trainer_args(ds_config: dict, **extra) -> SimpleNamespace:
    """What frozen_options reads of zero_args(...) arguments."""
    base = dict(
        zero_ds_config=ds_config,
        world_size=2,
        per_device_train_batch_size=2,
        gradient_accumulation_steps=1,
        learning_rate=1e-3,
        adam_beta1=0.9,
        adam_beta2=0.999,
        adam_epsilon=1e-8,
        weight_decay=0.0,
        optim="adamw_torch",
        max_grad_norm=1.0,
        get_warmup_steps=lambda steps: 0,
        device="cpu",
    )
    base.update(extra)
    return SimpleNamespace(**base)


def test_frozen_options_keep_zero_and_precision_drop_what_only_training_needs():
    ds = {
        "zero_optimization": {
            "stage": 3,
            "stage3_prefetch_bucket_size": "auto",
            "stage3_param_persistence_threshold": "auto",
            "offload_param": {"device": "cpu"},
            "offload_optimizer": {"device": "cpu"},
        },
        # a schedule whose step count contradicts 0: read for an engine that never steps, it would be an error
        "scheduler": {"type": "WarmupDecayLR", "params": {"total_num_steps": 100, "warmup_num_steps": 10}},
        "optimizer": {"type": "AdamW", "params": {"lr": 5e-4}},
    }
    options = frozen_options(trainer_args(ds), llama(hidden=16))
    assert options.zero.stage == 3
    assert options.zero.offload_param.device == "cpu"
    assert options.zero.offload_optimizer.device != "cpu"
    # the "auto" buckets come from this model's hidden size (16), not the trained model's
    assert options.zero.stage3_param_persistence_threshold == 160
    assert options.zero.stage3_prefetch_bucket_size == int(0.9 * 16 * 16)
    assert ds["zero_optimization"]["offload_optimizer"] == {"device": "cpu"}  # the run's config is untouched


@pytest.mark.parametrize("stage", [0, 2])
def test_frozen_options_keep_the_stage(stage):
    options = frozen_options(trainer_args({"zero_optimization": {"stage": stage}}), llama(hidden=8))
    assert options.zero.stage == stage


def test_sync_ref_model_refused_at_stage_3():
    trainer = SimpleNamespace(args=trainer_args({"zero_optimization": {"stage": 3}}, sync_ref_model=True))
    with pytest.raises(UserError) as caught:
        prepare_frozen(trainer, llama(hidden=8))
    assert "sync_ref_model" in str(caught.value)


class TrainerStandIn:
    """What the accelerator reads of the trainer: its model (weakly referenced, as the mixin does)."""


def test_accelerator_sends_only_other_models_in_evaluation_mode_to_an_inference_engine(monkeypatch):
    """The seam TRL's trainers reach: accelerator.prepare_model(model, evaluation_mode=True) (their path without
    DeepSpeed for ref / reward / teacher models)."""
    import weakref

    from accelerate import Accelerator

    from zerolaunch.hf import trainer as hf_trainer
    from zerolaunch.hf.reference import FrozenModel

    class FakeEngine:
        def __init__(self, module):
            self.module = module

        def __call__(self, *args, **kwargs):
            return self.module(*args, **kwargs)

    prepared = []

    def fake_prepare_frozen(trainer, model):
        prepared.append(model)
        return FrozenModel(FakeEngine(model))

    monkeypatch.setattr(hf_trainer, "prepare_frozen", fake_prepare_frozen)
    accelerator = Accelerator(cpu=True)
    accelerator.__class__ = hf_trainer._accelerator_class(type(accelerator))
    policy, ref, reward = llama(hidden=8), llama(hidden=8), llama(hidden=8)
    trainer = TrainerStandIn()
    trainer.model = trainer.model_wrapped = policy
    accelerator.zero_trainer = weakref.ref(trainer)

    frozen = accelerator.prepare_model(ref, evaluation_mode=True)
    assert isinstance(frozen, FrozenModel) and frozen.module is ref and prepared == [ref]
    assert accelerator.prepare_model(frozen, evaluation_mode=True) is frozen  # not wrapped twice
    assert accelerator.unwrap_model(frozen) is ref
    assert accelerator.prepare_model(reward, evaluation_mode=True, device_placement=True).module is reward
    # the trained model, or a model prepared for training, takes accelerate's own path
    assert accelerator.prepare_model(policy, evaluation_mode=True) is policy
    assert (
        accelerator.prepare_model(llama(hidden=8), evaluation_mode=False).__class__.__name__ != "FrozenModel"
    )
    assert prepared == [ref, reward]
