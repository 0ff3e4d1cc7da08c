"""`zero_trainer(cls)`: a Hugging Face Trainer class (transformers' or a subclass such as TRL's SFTTrainer)
whose every step runs through zerolaunch's engine, at ZeRO stages 0-3.

How it plugs in, the way transformers plugs DeepSpeed in (integrations/deepspeed.py), without accelerate's
DDP wrapper: `_prepare_for_training` builds the engine (build.py build_engine, the one every door uses) over
`trainer.model` instead of `accelerator.prepare`, and the Trainer then drives a `ZeroModel` (forward through
the engine) with `ZeroOptimizer` as its optimizer. The accelerator's class is swapped for a subclass whose
`backward` is the engine's backward, followed at the accumulation boundary (accelerate's `sync_gradients`,
which the Trainer sets) by the engine's step: grad norm, clipping, the fp16 skip and the optimizer update
happen there, and `optimizer.step()` is then a no-op, as under DeepSpeed. The engine is built with
gradient_accumulation_steps 1 because the Trainer normalises the loss over the window itself (a plain mean /
accumulation, or the token count `num_items_in_batch`); the engine then averages the grads over the ranks,
as DDP does.

The optimizer and lr schedule are decided in one place, optim_sched.py `zero_optim_sched` (the config's
`scheduler` block runs the engine's schedule, else the Trainer's own scheduler drives the engine's lrs), as
transformers' `deepspeed_optim_sched` decides them for DeepSpeed. Checkpoints: `checkpoint-N/` holds save_model's
HF folder, the Trainer's own files (trainer_state.json, rng_state_*.pth, scheduler.pt) and the engine's sharded
checkpoint in `checkpoint-N/zerolaunch/`. Needs a transformers whose Trainer has TRAINER_HOOKS (checked: 5.17 and
5.25 have them, 5.0 and 4.x do not: refused at class creation, with the version).
"""

from __future__ import annotations

import copy
import functools
import os
import shutil
import weakref
from dataclasses import replace
from pathlib import Path

import torch

from zerolaunch.checkpoint.hf_save import with_hf_config, write_hf_pretrained
from zerolaunch.checkpoint.load import load_checkpoint
from zerolaunch.checkpoint.save import save_checkpoint
from zerolaunch.config import deepspeed_engine_options
from zerolaunch.config.errors import UserError
from zerolaunch.hf.optim_sched import EngineLRScheduler, zero_optim_sched
from zerolaunch.hf.reference import (
    EngineForward,
    FrozenModel,
    guard_direct_calls,
    is_training_model,
    prepare_frozen,
)
from zerolaunch.zero import comm

ENGINE_DIR = "zerolaunch"
"""checkpoint-N/zerolaunch/: the engine's sharded checkpoint (all ranks write their own shard)."""

WEIGHT_FILES = (
    "model.safetensors",
    "model.safetensors.index.json",
    "pytorch_model.bin",
    "adapter_model.safetensors",  # a PeftModel's save (checkpoint/peft_adapter.py)
    "adapter_model.bin",
)


class ZeroModel(EngineForward):
    """What the Trainer calls its wrapped model (`model_wrapped`): forward through the training engine."""

    def zero_grad(self, set_to_none: bool = True) -> None:
        """The engine clears its grads at each step; the Trainer's calls between steps change nothing."""


def _accelerator_class(base: type) -> type:
    class ZeroAccelerator(base):
        """accelerate's Accelerator with the engine's backward (and step at the boundary)."""

        zero_trainer = None  # weakref to the trainer, set by the mixin

        def backward(self, loss, **kwargs):
            trainer = self.zero_trainer() if self.zero_trainer is not None else None
            if trainer is None or trainer.zero_engine is None:
                return super().backward(loss, **kwargs)
            trainer._zero_backward(loss)

        @property
        def optimizer_step_was_skipped(self):
            trainer = self.zero_trainer() if self.zero_trainer is not None else None
            if trainer is not None and trainer.zero_engine is not None:
                return trainer.zero_step is not None and trainer.zero_step.skipped
            return base.optimizer_step_was_skipped.fget(self)

        def unwrap_model(self, model, keep_fp32_wrapper: bool = True, keep_torch_compile: bool = True):
            if isinstance(model, EngineForward):
                model = model.module
            return super().unwrap_model(model, keep_fp32_wrapper, keep_torch_compile)

        def prepare_model(self, model, device_placement=None, evaluation_mode: bool = False):
            # TRL's trainers send their ref / reward / teacher models here when accelerate runs no DeepSpeed:
            # those go on an inference engine (hf/reference.py), the trained model takes the trainer's path
            trainer = self.zero_trainer() if self.zero_trainer is not None else None
            if isinstance(model, FrozenModel):
                return model
            if trainer is None or not evaluation_mode or is_training_model(trainer, model):
                return super().prepare_model(model, device_placement, evaluation_mode)
            return prepare_frozen(trainer, model)

    ZeroAccelerator.__name__ = f"Zero{base.__name__}"
    return ZeroAccelerator


@functools.cache
def _release_group_at_exit() -> None:
    """Leave the process group in step when the script ends (registered once per process).

    A Trainer script ends without destroying the group, which DDP tolerates; the engine's gloo work torn down
    at interpreter finalization, or ranks closing their connections unsynchronized, aborts a rank ("terminate
    called without an active exception"; zero/comm.py destroy_default_group). At exit the group goes the way
    zerolaunch's own workers leave it: collected, a barrier if the script did not fail, destroyed."""
    import atexit
    import sys

    def release() -> None:
        from zerolaunch.zero.comm import destroy_default_group

        failed = hasattr(sys, "last_value") or hasattr(sys, "last_exc")  # an uncaught exception was printed
        destroy_default_group(every_rank_finished=not failed)

    atexit.register(release)


def _synced_generate(generate, engine):
    """model.generate at stage 3: the whole generation inside Engine.gathered(), and synced_gpus on (a rank
    that finished keeps running forwards, so every rank joins every gather, as under DeepSpeed ZeRO-3). It sits
    on the model, which may outlive the engine: it holds the engine weakly ([Note: weak hooks] in
    zero/weak_hooks.py; without the engine the model's forward refuses to run)."""
    engine_ref = weakref.ref(engine)

    @functools.wraps(generate)
    def wrapper(*args, **kwargs):
        engine = engine_ref()
        if engine is None:
            return generate(*args, **kwargs)
        if kwargs.get("synced_gpus") is None:
            kwargs["synced_gpus"] = engine.world_size > 1
        with engine.gathered():
            return generate(*args, **kwargs)

    return wrapper


class ZeroTrainerMixin:
    """Put before a Trainer class (zero_trainer does it)."""

    zerolaunch_trainer = True

    def __init__(self, *args, **kwargs):
        self.zero_engine = None
        self.zero_step = None  # the StepInfo of the last accumulation boundary
        self.zero_skipped_steps = 0
        self._zero_model: ZeroModel | None = None
        from zerolaunch.hf.meta_load import consume, plain_from_pretrained, reload_whole

        if kwargs.get("peft_config") is not None:
            # PEFT puts adapters on their base layer's device: a model built on meta is loaded whole first
            if "model" in kwargs:
                kwargs["model"] = reload_whole(kwargs["model"])
            elif args:
                args = (reload_whole(args[0]), *args[1:])
        # a model the constructor loads by name (TRL's model="...", a reference model) loads whole too, and a
        # model used outside the engine needs its weights
        with plain_from_pretrained():
            super().__init__(*args, **kwargs)
        consume(self.args)  # later loads (evaluation, an adapter folder read back) are whole
        if not getattr(self.args, "zerolaunch_arguments", False):
            raise UserError(
                f"{type(self).__name__} trains with zerolaunch's engine and needs zerolaunch's arguments: "
                f"pass zerolaunch.hf.zero_args({type(self.args).__name__})(...) (zerolaunch.hf.TrainingArguments "
                "for transformers' own)"
            )
        if self.is_deepspeed_enabled or self.is_fsdp_enabled:
            raise UserError(
                "accelerate was set up with a DeepSpeed or FSDP plugin; zerolaunch's engine does the sharding. "
                "Launch without the plugin (accelerate launch with no --use_deepspeed / --use_fsdp)"
            )
        if self.optimizer is not None or self.lr_scheduler is not None:
            raise UserError(
                "Trainer(optimizers=(...)): the engine builds and steps its own optimizer over its shards. Put "
                "an `optimizer` (and `scheduler`) block in the DeepSpeed config instead, or use the "
                "TrainingArguments' optim / lr_scheduler_type"
            )

    # ---- accelerator and placement ------------------------------------------------------------------------
    def create_accelerator_and_postprocess(self) -> None:
        super().create_accelerator_and_postprocess()
        self.accelerator.__class__ = _accelerator_class(type(self.accelerator))
        self.accelerator.zero_trainer = weakref.ref(self)
        # the engine holds the compute dtype and scales fp16 losses itself: no autocast, no GradScaler
        self.accelerator.native_amp = False
        self.accelerator.scaler = None

    def _move_model_to_device(self, model, device) -> None:
        """The engine places each rank's share (stage 3 never holds the whole model on the device)."""

    # ---- the engine ---------------------------------------------------------------------------------------
    def _zero_config(self, num_training_steps: int):
        from zerolaunch.hf.config import TrainerDSConfig, optimizer_block

        filled = TrainerDSConfig(copy.deepcopy(self.args.zero_ds_config))
        if num_training_steps == 0:
            # evaluate()/predict() before train() steps nothing, and a schedule over 0 steps is invalid
            # ("auto" total_num_steps would be 0); train() installs the config's schedule on this engine
            filled.config.pop("scheduler", None)
        filled.finalize(self.args, num_training_steps)
        config = filled.config
        own_optimizer = "optimizer" not in config
        if own_optimizer:
            config["optimizer"] = optimizer_block(self.args)
        return config, own_optimizer

    def _zero_options(self, config: dict):
        from zerolaunch.hf.config import ds_config_source, model_hidden

        hidden = model_hidden(self.model)
        options = deepspeed_engine_options(
            config,
            world_size=self.args.world_size,
            model_hidden=hidden,
            source=ds_config_source(getattr(self.args, "zero_config", None)),
        )
        # the Trainer divides the loss by the accumulation (or by the window's token count) itself
        return replace(options, gradient_accumulation_steps=1)

    def _trainer_groups(self):
        """The Trainer's own optimizer groups (create_optimizer's decay split), for a config without an
        optimizer block: transformers' DeepSpeed integration hands DeepSpeed those same groups."""
        decay = set(self.get_decay_parameter_names(self.model))
        named = [(n, p) for n, p in self.model.named_parameters() if p.requires_grad]
        groups = [
            {"params": [p for n, p in named if n in decay], "weight_decay": self.args.weight_decay},
            {"params": [p for n, p in named if n not in decay], "weight_decay": 0.0},
        ]
        return [g for g in groups if g["params"]]

    def _zero_build(self, num_training_steps: int) -> None:
        """Build the engine once (a later train() or evaluate() reuses it) and install this run's optimizer
        and schedule (optim_sched.py)."""
        from zerolaunch.build import build_engine

        config, own_optimizer = self._zero_config(num_training_steps)
        options = self._zero_options(config)
        if self.zero_engine is None:
            engine = build_engine(
                self.model,
                options,
                device=self.args.device,
                model_parameters=self._trainer_groups() if own_optimizer else None,
            )
            self.zero_engine = engine
            _release_group_at_exit()
            self.model = engine.module
            self._zero_model = ZeroModel(engine)
            guard_direct_calls(engine)  # TRL's PEFT reference calls the model outside the engine
            if engine.stage == 3 and hasattr(self.model, "generate"):
                self.model.generate = _synced_generate(self.model.generate, engine)
        self.optimizer, self.lr_scheduler = zero_optim_sched(
            self, self.zero_engine, config, options, num_training_steps
        )

    def _wrap_model(self, model, training: bool = True, dataloader=None):
        if self._zero_model is None:
            self._zero_build(num_training_steps=0)  # evaluate()/predict() before train()
        self.model_wrapped = self._zero_model
        return self._zero_model

    def create_optimizer_and_scheduler(self, num_training_steps: int) -> None:
        self._zero_build(num_training_steps)

    def _prepare_for_training(self, max_steps, train_dataloader, resume_from_checkpoint):
        self._zero_build(max_steps)
        self.model_wrapped = model = self._zero_model
        if resume_from_checkpoint is not None:
            self._load_optimizer_and_scheduler(resume_from_checkpoint)
        for attr in ("model", "optimizer", "lr_scheduler"):
            setattr(self.callback_handler, attr, getattr(self, attr))
        self.callback_handler.train_dataloader = train_dataloader
        return model, train_dataloader

    def _zero_backward(self, loss: torch.Tensor) -> None:
        engine = self.zero_engine
        # accelerate sets sync_gradients before the micro-step: the engine learns the window's last backward
        # ahead of it (offloaded grads go to the host from that backward: [Note: device-summed window])
        boundary = bool(self.accelerator.sync_gradients)
        engine.backward(loss, window_ends=boundary)
        info = engine.step(boundary)
        if boundary:
            self.zero_step = info
            self.zero_skipped_steps += int(info.skipped)

    # ---- what the Trainer logs comes from the engine's step -------------------------------------------------
    def _clip_grad_norm(self, model):
        return None if self.zero_step is None else self.zero_step.grad_norm

    def _get_grad_norm(self, model, grad_norm=None):
        if grad_norm is not None:
            return grad_norm
        return None if self.zero_step is None else self.zero_step.grad_norm

    def _get_learning_rate(self) -> float:
        if self.zero_step is None:
            return float(self.zero_engine.lrs_at(self.zero_engine.global_steps)[0])
        return float(self.zero_step.lr)

    def log(self, logs: dict, *args, **kwargs) -> None:
        engine = self.zero_engine
        if engine is not None and "loss" in logs and engine.options.precision.dtype == "fp16":
            logs["skipped_steps"] = self.zero_skipped_steps
        super().log(logs, *args, **kwargs)

    # ---- saving ---------------------------------------------------------------------------------------------
    def save_model(self, output_dir: str | None = None, _internal_call: bool = False) -> None:
        """COLLECTIVE: what save_pretrained writes (config, weights, the processing class, training_args.bin),
        streamed from the engine one tensor at a time at every stage (checkpoint/hf_folder.py)."""
        if self.zero_engine is None:
            return super().save_model(output_dir, _internal_call)
        output_dir = output_dir if output_dir is not None else self.args.output_dir
        self._write_pretrained(Path(output_dir))
        if self.args.should_save:
            if self.processing_class is not None:
                self.processing_class.save_pretrained(output_dir)
            torch.save(self.args, os.path.join(output_dir, "training_args.bin"))

    def _write_pretrained(self, out: Path) -> None:
        rank0 = comm.rank(None) == 0
        staging = out / ".zerolaunch-pretrained"
        if rank0:
            out.mkdir(parents=True, exist_ok=True)
        comm.barrier(None)
        engine = self.zero_engine
        # its writer publishes `staging` whole
        write_hf_pretrained(
            engine.module, engine.iter_full_state, engine.param_specs(), engine.group, staging
        )
        if rank0:
            # into a folder that may hold other things (output_dir holds the checkpoints): file by file
            for name in os.listdir(out):
                if name in WEIGHT_FILES or (name.startswith("model-") and name.endswith(".safetensors")):
                    os.remove(out / name)
            for path in staging.iterdir():
                os.replace(path, out / path.name)
            shutil.rmtree(staging)
        comm.barrier(None)

    def _save_optimizer_and_scheduler(self, output_dir: str) -> None:
        engine = self.zero_engine
        extra = with_hf_config(None, engine.module, engine.rank)  # convert-checkpoint writes config.json
        save_checkpoint(
            engine, Path(output_dir) / ENGINE_DIR, step=engine.global_steps, extra=extra, group=engine.group
        )
        if self.args.should_save and not isinstance(self.lr_scheduler, EngineLRScheduler):
            torch.save(self.lr_scheduler.state_dict(), os.path.join(output_dir, "scheduler.pt"))

    def _load_optimizer_and_scheduler(self, checkpoint: str | None) -> None:
        if checkpoint is None:
            return

        folder = Path(checkpoint) / ENGINE_DIR
        if not folder.is_dir():
            raise UserError(
                f"{checkpoint} holds no zerolaunch engine checkpoint ({ENGINE_DIR}/): it was saved with "
                "save_only_model=True or by another engine, so the optimizer state is not there. Resume from a "
                "checkpoint saved without save_only_model, or start a new run with the model loaded from it"
            )
        load_checkpoint(self.zero_engine, folder, group=self.zero_engine.group)
        scheduler = Path(checkpoint) / "scheduler.pt"
        if scheduler.is_file() and not isinstance(self.lr_scheduler, EngineLRScheduler):
            self.lr_scheduler.load_state_dict(torch.load(scheduler, weights_only=True))
            # a torch scheduler's state does not hold its optimizer's lrs (the stock Trainer restores them
            # with optimizer.pt): set the groups' lrs the engine reads to where the schedule stands
            for group, lr in zip(self.optimizer.param_groups, self.lr_scheduler.get_last_lr(), strict=True):
                group["lr"] = lr
        # a subclass's own additions run (TRL's GRPOTrainer restores its entropy controller here); transformers'
        # part finds no optimizer.pt in the folder and loads nothing
        super()._load_optimizer_and_scheduler(checkpoint)

    def _load_from_checkpoint(self, resume_from_checkpoint: str, model=None) -> None:
        if self.zero_engine is None:  # the weights go into the model the engine is built from
            return super()._load_from_checkpoint(resume_from_checkpoint, model)
        # the engine is built: its checkpoint (loaded in _prepare_for_training) carries the weights

    def _load_best_model(self) -> None:
        best = self.state.best_model_checkpoint
        folder = Path(best) / ENGINE_DIR
        if not folder.is_dir():
            raise UserError(
                f"load_best_model_at_end: {best} holds no zerolaunch engine checkpoint ({ENGINE_DIR}/), "
                "it was saved with save_only_model=True; turn save_only_model off to load the best model back"
            )
        # weights and optimizer state, as DeepSpeed's integration loads the best checkpoint
        load_checkpoint(self.zero_engine, folder, group=self.zero_engine.group)


def zero_trainer(cls: type) -> type:
    """The zerolaunch version of a Trainer class: same constructor and methods, steps through the engine.
    Applying it twice returns the same class."""
    if getattr(cls, "zerolaunch_trainer", False):
        return cls
    missing = [name for name in TRAINER_HOOKS if not hasattr(cls, name)]
    if missing:
        import transformers

        raise UserError(
            f"zero_trainer needs a Trainer with {', '.join(missing)} (transformers 5.17 and 5.25 have them, 5.0 "
            f"does not); transformers {transformers.__version__} is installed: pip install 'transformers>=5.17'"
        )
    if cls not in _CLASSES:
        _CLASSES[cls] = type(cls.__name__, (ZeroTrainerMixin, cls), {"__module__": "zerolaunch.hf"})
    return _CLASSES[cls]


_CLASSES: dict[type, type] = {}

TRAINER_HOOKS = ("_prepare_for_training", "_clip_grad_norm", "_get_grad_norm", "_get_learning_rate")
"""The Trainer's methods this integration replaces that older releases do not have."""
