"""Frozen side models under zero_trainer (TRL's reference, reward and teacher models) on an inference engine.

TRL hands such a model to DeepSpeed's `prepare_deepspeed` (an engine with no optimizer, sharded at stage 3,
stage 0 otherwise) when accelerate runs DeepSpeed, and otherwise to `accelerator.prepare_model(model,
evaluation_mode=True)`, which leaves it whole on every rank. Under zero_trainer accelerate runs no DeepSpeed,
so every trainer takes the second call (DPO, KTO, RLOO and GRPO's ref_model, GRPO and RLOO's reward models,
the distillation trainers' teacher): the trainer's accelerator overrides `prepare_model` (ZeroAccelerator in
trainer.py) and sends a model that is not the one being trained here, to build.py's `build_inference_engine`
with the training run's own config. TRL itself is not patched.

The config is the one given to the TrainingArguments, with what prepare_deepspeed drops for an engine that
never steps (the optimizer, the scheduler, offload_optimizer) and the hidden-size "auto" buckets filled from
this model's own config. So stage 3 shards the model on the same unit machinery, following offload_param,
and stages 0-2 keep it whole in the compute dtype on every rank, as DeepSpeed's stage-0 engine does.

The PEFT reference (ref_model=None and an adapter: the policy with its adapter disabled) runs the training
model itself, called outside the engine's forward (`self.model(...)` under `use_adapter`); `guard_direct_calls`
gives such a call at stage 3 the root unit's gather the engine's forward would do.
"""

from __future__ import annotations

import copy
import weakref
from dataclasses import replace

from torch import nn

from zerolaunch.config import deepspeed_engine_options
from zerolaunch.config.errors import UserError
from zerolaunch.zero.weak_hooks import remove_with

FROZEN_ONLY_KEYS = ("optimizer", "scheduler")
"""Config blocks an engine with no optimizer has no use for (dropped, as TRL's prepare_deepspeed does)."""


class EngineForward(nn.Module):
    """A model the Trainer or TRL holds whose forward runs through an engine (stage 3 gathers each unit as it
    runs); `.module` is the Hugging Face model, and its attributes (config, ...) read through."""

    def __init__(self, engine):
        super().__init__()
        self.module = engine.module
        object.__setattr__(self, "engine", engine)  # not a submodule: the engine is no nn.Module

    def forward(self, *args, **kwargs):
        return self.engine(*args, **kwargs)

    def __getattr__(self, name):
        try:
            return super().__getattr__(name)
        except AttributeError:
            return getattr(self.module, name)


class FrozenModel(EngineForward):
    """What TRL keeps as its ref / reward / teacher model: forward through the inference engine."""


def frozen_options(args, model: nn.Module):
    """Engine options for a frozen model from the TrainingArguments' DeepSpeed config (zero_ds_config)."""
    from zerolaunch.hf.config import TrainerDSConfig, ds_config_source, model_hidden, optimizer_block

    config = copy.deepcopy(args.zero_ds_config)
    for key in FROZEN_ONLY_KEYS:
        config.pop(key, None)
    zero = config.get("zero_optimization")
    if isinstance(zero, dict):
        zero.pop("offload_optimizer", None)
    filled = TrainerDSConfig(config)
    filled.finalize(args, 0)  # no schedule to fill
    # the options need an optimizer to describe; the inference engine builds none
    config["optimizer"] = optimizer_block(args)
    # the bucket "auto"s from this model's hidden size
    options = deepspeed_engine_options(
        config,
        world_size=args.world_size,
        model_hidden=model_hidden(model),
        source=ds_config_source(getattr(args, "zero_config", None)),
    )
    return replace(options, gradient_accumulation_steps=1)


def is_training_model(trainer, model) -> bool:
    """Whether `model` is (a wrapper of) the model the trainer trains: that one the trainer's engine takes."""
    if isinstance(model, EngineForward):
        return True
    return any(model is m for m in (trainer.model, getattr(trainer, "model_wrapped", None)) if m is not None)


def prepare_frozen(trainer, model: nn.Module) -> FrozenModel:
    """COLLECTIVE at stage 3 (every rank prepares the same models in the same order): `model` on an
    inference engine built with the trainer's config; its params become frozen."""
    from zerolaunch.build import build_inference_engine

    if getattr(trainer.args, "sync_ref_model", False):
        stage = (trainer.args.zero_ds_config.get("zero_optimization") or {}).get("stage", 0)
        if stage == 3:
            raise UserError(
                "sync_ref_model=True at ZeRO stage 3: the reference model is sharded on its own inference "
                "engine, so TRL's SyncRefModelCallback cannot mix the policy's weights into it. Set "
                "sync_ref_model=False, or use stage 0-2 (the reference is then whole on every rank)"
            )
    engine = build_inference_engine(model, frozen_options(trainer.args, model), device=trainer.args.device)
    guard_direct_calls(engine)  # a caller that unwraps it and runs the module itself
    return FrozenModel(engine)


def guard_direct_calls(engine) -> None:
    """Stage 3: a forward of `engine.module` that does not come through `engine(...)` (TRL's PEFT reference,
    `trainer.model(...)` with the adapter disabled, in evaluation or in a precompute pass) runs inside
    Engine.gathered(), which gathers the root around it as the engine's own forward does, and does nothing
    inside the engine's forward or right after a forward with grad (the root is still gathered for backward
    and the units' own hooks gather each unit as it runs). Without it such a call reads the root's released
    buffer: wrong log-probs and no error (DPO's evaluate with a PEFT reference showed it)."""
    if engine.stage != 3:
        return
    contexts: list = []  # per forward of the module in progress, innermost last
    # the hooks live on the user's model, which may outlive the engine: they hold it weakly and go with it
    # ([Note: weak hooks] in zero/weak_hooks.py)
    engine_ref = weakref.ref(engine)

    def before(module, args):
        engine = engine_ref()
        if engine is None:
            return
        context = engine.gathered()
        context.__enter__()
        contexts.append(context)

    def after(module, args, output):
        if contexts:
            contexts.pop().__exit__(None, None, None)

    handles = [
        engine.module.register_forward_pre_hook(before),
        engine.module.register_forward_hook(after, always_call=True),
    ]
    remove_with(engine, handles)
