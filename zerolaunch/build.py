"""The one way to wrap a model in the ZeRO engine: `build_engine(model, options, ...)`.

The built-in loop (train/loop.py), the library API (`zerolaunch.initialize`, api.py) and the Hugging Face
Trainer integration (hf/trainer.py) all call it, so a model is prepared the same way whichever door it came
in by: Hugging Face decoder layers become the stage-3 units unless the options name others, a model built on
the meta device is initialised unit by unit with its own init (or its weights files), and DeepSpeed-style
`model_parameters` become the optimizer's groups. `build_inference_engine` prepares a frozen model (a DPO or
GRPO reference model, a reward model) the same way, forward only. This module owns that preparation, not the
engine (zero/) nor where the options come from (config/).
"""

from __future__ import annotations

from dataclasses import replace

import torch

from zerolaunch.models.hf import hf_stage3_units, meta_init_fn
from zerolaunch.zero import Engine, EngineOptions
from zerolaunch.zero.options import OffloadOptions


def build_engine(
    model: torch.nn.Module,
    options: EngineOptions,
    *,
    group=None,
    device: torch.device | str = "cpu",
    model_parameters=None,
) -> Engine:
    """A zero.Engine over `model`. model_parameters: as DeepSpeed's, an iterable of params (one group) or of
    group dicts (`params` plus any of lr, weight_decay, betas, eps, name); None: the groups the options'
    optimizer defines (decay_1d)."""
    options = hf_stage3_units(model, options)
    param_groups = None
    if model_parameters is not None:
        from zerolaunch.zero.param_groups import client_groups, collect_params

        param_groups = client_groups(collect_params(model), model_parameters, options.optimizer.weight_decay)
    return Engine(
        model,
        options,
        group=group,
        device=torch.device(device),
        init_fn=meta_init_fn(model, options),  # None unless stage 3 on a meta-built model
        param_groups=param_groups,
    )


def build_inference_engine(
    model: torch.nn.Module, options: EngineOptions, *, group=None, device: torch.device | str = "cpu"
) -> Engine:
    """A zero.Engine that only runs `model`'s forward, DeepSpeed's inference engine of TRL's
    `prepare_deepspeed`: every param is frozen here (requires_grad False), so no optimizer, master or grad
    state exists. At stage 3 each rank holds 1/N of the weights in the compute dtype (on the host with
    offload_param), a unit gathered around its forward as in training; at stages 0-2 the model is cast to
    the compute dtype and stays whole. `engine(*args, **kwargs)` runs the forward, under torch.no_grad() by
    the caller; `engine.module` is the model. `options` may be the training engine's: what only training
    uses (offload_optimizer, and offload_param below stage 3) is dropped."""
    model.requires_grad_(False)
    zero = replace(options.zero, offload_optimizer=OffloadOptions())  # no optimizer to offload
    if zero.stage < 3:  # whole on every rank, as DeepSpeed's stages 0-2 keep frozen params
        zero = replace(zero, offload_param=OffloadOptions())
    return build_engine(model, replace(options, zero=zero), group=group, device=device)
