"""The library API: `engine = zerolaunch.initialize(model, config)`, the way `deepspeed.initialize` is used.

This module owns: turning a user's config (a recipe dict or file, a DeepSpeed dict or ds_config.json, a Recipe,
EngineOptions, or nothing = the recipe of the `zerolaunch train` run that started this script) into engine
options; the user-facing engine wrapper (forward / backward / step / save and load checkpoints); and
`save_hf_pretrained(engine, out)` for scripts (the writer is checkpoint/hf_save.py). The engine itself is zero/,
checkpoint files are checkpoint/; the process group a plain `torchrun` script gets is launch/process_group.py's;
environment variables are read in launch/env.py. This only wires them.
"""

from __future__ import annotations

import difflib
import os
import warnings
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path

import torch
import torch.distributed as dist

from zerolaunch.build import build_engine
from zerolaunch.checkpoint.hf_save import with_hf_config, write_hf_pretrained
from zerolaunch.launch import env
from zerolaunch.launch.process_group import init_process_group
from zerolaunch.models.compiling import compile_for
from zerolaunch.util.errors import TrainError
from zerolaunch.zero import EngineOptions, comm


# ---- config ---------------------------------------------------------------------------------------------
def _decay_every_param(options: EngineOptions) -> EngineOptions:
    """The library's default is DeepSpeed's: one group, every param decayed (deepspeed.initialize with
    model.parameters()), whatever the built-in loop's default for a recipe without an entrypoint is."""
    if options.optimizer.decay_1d:
        return options
    return replace(options, optimizer=replace(options.optimizer, decay_1d=True))


def _resolve_config(config, overrides, world_size: int):
    """(recipe or None, EngineOptions) from whatever the user passed; see initialize()."""
    if isinstance(config, EngineOptions):
        return None, config
    if config is not None and hasattr(config, "engine") and isinstance(config.engine, EngineOptions):
        return config, config.engine
    from zerolaunch import config as zconfig

    if config is None:
        resolved = env.resolved_recipe_path()
        if not resolved:
            return None, _decay_every_param(EngineOptions())
        recipe = zconfig.load_resolved(resolved)
        return recipe, recipe.engine
    if isinstance(config, dict | str | os.PathLike):
        recipe = zconfig.load_recipe(config, overrides=list(overrides), world_size=world_size)
        options = recipe.engine
        if recipe.origins.get("train.weight_decay_1d", "default") == "default":
            options = _decay_every_param(options)  # a value given in the recipe is kept
        return recipe, options
    raise TypeError(
        f"zerolaunch.initialize: config must be a recipe/DeepSpeed dict, a path to a recipe or ds_config "
        f"file, a Recipe or EngineOptions, got {type(config).__name__}"
    )


# ---- device -----------------------------------------------------------------------------------------------
def _default_device() -> torch.device:
    # a gloo group (e.g. `zerolaunch train --device cpu` on a GPU host) means the run is on the CPU.
    on_gloo = dist.is_initialized() and dist.get_backend() == "gloo"
    if torch.cuda.is_available() and not on_gloo:
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


# ---- the engine wrapper -------------------------------------------------------------------------------------
def _unknown_attribute_message(wrapper, name: str) -> str:
    supported = sorted(n for n in {*dir(type(wrapper)), *vars(wrapper)} if not n.startswith("_"))
    message = (
        f"'ZeroLaunchEngine' object has no attribute {name!r}: it is not a DeepSpeed engine attribute zerolaunch "
        "supports (docs/deepspeed.md lists the supported surface)"
    )
    close = difflib.get_close_matches(name, supported, n=1)
    message += f"; did you mean {close[0]!r}?" if close else "."
    if name in dir(wrapper.engine):  # dir, not hasattr: no property of the engine runs
        message += (
            f" The inner zerolaunch engine has a {name!r}, not part of that surface: engine.engine.{name} "
            "reaches it."
        )
    return message


class ZeroLaunchEngine:
    """What initialize() returns: DeepSpeed's engine surface over `zerolaunch.zero.Engine`.

    Only what is defined here is supported (docs/deepspeed.md lists it); any other name raises AttributeError
    instead of reaching into the inner engine, whose members are internal. That engine is `.engine`, for the
    checkpoint and HF-output code (and tests) that need it.
    """

    def __init__(self, engine, recipe=None):
        self.engine = engine
        self.recipe = recipe
        self.module = engine.module
        self.device = engine.device
        self.group = engine.group
        self.rank = comm.rank(engine.group)
        self.world_size = comm.world_size(engine.group)
        self._monitors = None  # DeepSpeed's tensorboard / csv_monitor / wandb blocks: rank 0 writes each step
        if recipe is not None and recipe.train.monitors and self.rank == 0:
            from zerolaunch.report.monitors import Monitors

            self._monitors = Monitors(recipe.train.monitors)
        self._losses: list[torch.Tensor] = []
        self.global_rank = self.rank  # DeepSpeed's name for the rank in the data-parallel group
        self.local_rank = env.local_rank()  # DeepSpeed reads LOCAL_RANK too
        self._in_no_sync = False
        self._boundary: bool | None = None  # set_gradient_accumulation_boundary's; None: counted by step()
        self.compiled: str | None = None  # compile()'s scope once it ran

    def __getattr__(self, name):
        # Python calls this only for names the wrapper lacks. Refusing them (rather than forwarding to the inner
        # engine) keeps the surface scripts depend on the one documented, and makes a DeepSpeed attribute that
        # zerolaunch lacks fail by name instead of resolving to an internal of ours with another meaning.
        if name.startswith("__") or "engine" not in self.__dict__:  # copy/pickle probes, half-built objects
            raise AttributeError(name)
        raise AttributeError(_unknown_attribute_message(self, name))

    # ---- the inner engine's state that scripts read (DeepSpeed's names) ------------------------------------------
    @property
    def global_steps(self) -> int:
        """Optimizer steps taken (DeepSpeed's global_steps; restored by load_checkpoint)."""
        return self.engine.global_steps

    @property
    def micro_steps(self) -> int:
        """step() calls counted so far (DeepSpeed's micro_steps); discard_window() takes a failed window's back."""
        return self.engine.micro_steps

    @property
    def options(self) -> EngineOptions:
        """The EngineOptions the engine was built from (the resolved config's engine part)."""
        return self.engine.options

    def wait_for_step(self) -> None:
        """With `offload_optimizer.overlap_step`: wait for the step in flight before reading params outside a
        forward (zero/engine.py Engine.wait_for_step); a no-op otherwise."""
        self.engine.wait_for_step()

    def memory_bytes(self) -> dict[str, int]:
        """Bytes this rank holds per kind (model states and engine buffers; activations not included)."""
        return self.engine.memory_bytes()

    def close(self) -> None:
        """Finish a step in flight and release the nvme swap files now (they also go at exit)."""
        self.engine.close()

    def consolidated_state_dict(self) -> dict[str, torch.Tensor]:
        """COLLECTIVE (call on every rank): the whole model's state dict on rank 0, `{}` on the other ranks.

        Keys are those of the unsharded `module.state_dict()` (every param, each tied name, persistent buffers),
        values CPU tensors in full precision: floating tensors in fp32 (from a 16-bit model, the fp32 master of
        the trainable params; frozen params and buffers, which have no master, upcast), others as they are. At
        stage 3 the params are gathered one unit at a time, so rank 0 holds the dict plus one unit.
        `module.state_dict()` is not this under stage 3: outside a forward it holds zero-stride placeholders of
        each param's shape, not the weights (docs/deepspeed.md)."""
        keys = list(self.module.state_dict(keep_vars=True))
        wanted = set(keys)
        aliases = {spec.name: spec.aliases for spec in self.engine.param_specs()}
        out: dict[str, torch.Tensor] = {}
        for name, tensor in self.engine.iter_full_state(torch.float32):  # every rank iterates it: it gathers
            if self.rank != 0:
                continue
            tensor = tensor.detach().to("cpu", copy=True)  # gathered tensors may share a buffer reused next
            for key in (name, *aliases.get(name, ())):
                if key in wanted:
                    out[key] = tensor
        return {key: out[key] for key in keys} if self.rank == 0 else {}

    def _to_device(self, value):
        if torch.is_tensor(value):
            return value.to(self.device, non_blocking=True) if value.device != self.device else value
        if isinstance(value, dict):
            return {k: self._to_device(v) for k, v in value.items()}
        if isinstance(value, list | tuple):
            return type(value)(self._to_device(v) for v in value)
        return value

    def __call__(self, *args, **kwargs):
        """Forward. A lone dict is spread as keyword args (`engine(batch)` == `model(**batch)`, what HF
        models want); tensors are moved to the engine's device first."""
        args, kwargs = self._to_device(args), self._to_device(kwargs)
        if len(args) == 1 and isinstance(args[0], dict) and not kwargs:
            return self.engine(**args[0])
        return self.engine(*args, **kwargs)

    def backward(self, loss) -> None:
        """Backward of a scalar loss, or of the `.loss` / ["loss"] of a model output."""
        if not torch.is_tensor(loss):
            loss = loss["loss"] if isinstance(loss, dict) else getattr(loss, "loss", loss)
        if not torch.is_tensor(loss):
            raise TypeError(
                f"engine.backward needs a scalar loss tensor or an output with .loss, got {type(loss).__name__}"
            )
        if self._monitors is not None:
            self._losses.append(loss.detach().float())
        self.engine.backward(loss, window_ends=self._boundary)

    def step(self):
        """Call after every backward; the optimizer steps at each accumulation boundary -> StepInfo."""
        # DeepSpeed's message and exception type (raised, not asserted: python -O keeps it): a step would
        # reduce the grads no_sync holds back.
        if self._in_no_sync:
            raise AssertionError("It is illegal to call Engine.step() inside no_sync context manager")
        info = self.engine.step(self._boundary)
        if self._monitors is not None and (info.stepped or info.skipped):
            # rank 0's loss, averaged over the accumulation (no collective: the other ranks write nothing)
            loss = torch.stack(self._losses).mean().item() if self._losses else None
            self._losses.clear()
        if self._monitors is not None and info.stepped:
            self._monitors.write_step(self.engine.global_steps, info, loss, self.recipe)
        return info

    # ---- the rest of DeepSpeed's engine surface (deepspeed/runtime/engine.py, 0.19.8) -----------------------
    def compile(
        self, backend: str = "inductor", compile_kwargs=None, schedule=None, compiled_autograd_enabled=False
    ) -> None:
        """DeepSpeed's engine.compile(): torch.compile of the model, as `train.compile` does it
        (models/compiling.py). DeepSpeed compiles the whole module; here the model's whole forward is
        compiled (`compile_scope: model`) wherever no engine hook runs inside it (Engine.forward_hooks_free:
        stages 0-2 without overlap_step, and stage 3 where nothing is gathered: at world size 1 every unit
        aliases what it holds, or every param is persistent), and otherwise each unit's forward
        (`compile_scope: blocks`), since dynamo would trace stage 3's gather hooks or overlap_step's publish
        hooks into the graph. With the inductor
        backend the optimizer step is fused too where it can be (Engine.use_fused_step), as
        `train.compile_optimizer` defaults. A second call does nothing, as DeepSpeed's. `schedule` and
        `compiled_autograd_enabled` are DeepCompile's and compiled autograd's, which zerolaunch does not have:
        refused, not ignored."""
        if schedule is not None:
            raise ValueError(
                "engine.compile(schedule=...) is a DeepCompile schedule; zerolaunch has no DeepCompile (the "
                "config's `compile` block is refused too). Call engine.compile() without it"
            )
        if compiled_autograd_enabled:
            raise ValueError(
                "engine.compile(compiled_autograd_enabled=True): zerolaunch runs backward eagerly (its gradient "
                "hooks reduce during backward); call engine.compile() without it"
            )
        if self.is_compiled:
            return
        kwargs = dict(compile_kwargs or {})
        if "backend" in kwargs:
            warnings.warn(
                "engine.compile: the `backend` in compile_kwargs is overridden by the `backend` argument "
                "(as in DeepSpeed)",
                stacklevel=2,
            )
            kwargs.pop("backend")
        options = self.engine.options
        try:
            self.compiled = compile_for(
                self.module,
                scope="model" if self.engine.forward_hooks_free else "blocks",
                backend=backend,
                unit_classes=options.zero.stage3_units,
                compile_kwargs=kwargs,
            )
        except TrainError as e:  # stage 3 on a model without repeated blocks to compile one by one
            raise ValueError(f"engine.compile(): {e}") from None
        if backend == "inductor":
            self.engine.use_fused_step()

    @property
    def is_compiled(self) -> bool:
        """DeepSpeed's: whether compile() ran."""
        return self.compiled is not None

    def train(self, mode: bool = True) -> None:
        self.module.train(mode)

    def eval(self) -> None:
        self.module.train(False)

    def zero_grad(self) -> None:
        """DeepSpeed's: every param's .grad = None. The engine's own accumulation needs no call (step() clears
        it); in a window it drops what was accumulated so far, at stages 0/1 (the engine re-attaches zeroed
        grad views at the next backward); at stages 2/3 the grads already reduced into shards are kept, as in
        DeepSpeed's ZeRO-2/3 buffers."""
        for param in self.module.parameters():
            param.grad = None

    def discard_window(self) -> None:
        """Drop the accumulation window's grads after a backward raised (zero/engine.py Engine.discard_window,
        [Note: failed backward]); the window's losses are dropped from the monitors' mean too."""
        self._losses.clear()
        self.engine.discard_window()

    def get_lr(self) -> list[float]:
        """The lr of each optimizer param group for the next optimizer step (DeepSpeed steps its scheduler
        after each optimizer step, so its param groups already hold the next step's lr). Per group as
        DeepSpeed's schedules: see zero/sched.py LRSchedule.lrs_at."""
        return self.engine.lrs_at(self.engine.global_steps)

    def gradient_accumulation_steps(self) -> int:
        return self.engine.options.gradient_accumulation_steps

    def _batch_key(self, name: str, key: str) -> int:
        if self.recipe is None:
            raise ValueError(
                f"engine.{name}() needs the batch sizes of a config: initialize was given EngineOptions, which "
                "carry no batch size; pass a recipe or DeepSpeed config instead"
            )
        return getattr(self.recipe.train, key)

    def train_micro_batch_size_per_gpu(self) -> int:
        return self._batch_key("train_micro_batch_size_per_gpu", "micro_batch_size")

    def train_batch_size(self) -> int:
        return self._batch_key("train_batch_size", "global_batch_size")

    def is_gradient_accumulation_boundary(self) -> bool:
        """Whether the next step() steps the optimizer: DeepSpeed's (micro_steps + 1) % accumulation == 0, with
        micro_steps counted by step(), unless set_gradient_accumulation_boundary set it."""
        if self._boundary is not None:
            return self._boundary
        return (self.engine.micro_steps + 1) % self.gradient_accumulation_steps() == 0

    def set_gradient_accumulation_boundary(self, is_boundary) -> None:
        """DeepSpeed's: overrides the micro-step count from now on (until set again; None restores it). While
        False, step() only counts a micro-step and backwards accumulate; the step() called while True reduces
        the window's grads and steps the optimizer, whatever the number of backwards in the window (each loss
        is still divided by gradient_accumulation_steps, as DeepSpeed's backward does). DeepSpeed's pattern:
        False before the window's first backwards, True before its last, then one step()."""
        self._boundary = is_boundary

    @contextmanager
    def no_sync(self):
        """DeepSpeed's: refused at ZeRO stage 2/3 (their grads are reduce-scattered during backward); at
        stages 0/1 the backwards inside accumulate locally, and step() inside is an error. Stages 0/1 here
        never communicate in backward (the grads are reduced once, at the boundary), so the context only holds
        step() back. Raises AssertionError, as DeepSpeed's asserts do."""
        stage = self.engine.options.zero.stage
        if stage >= 2:
            raise AssertionError(
                f"no_sync context manager is incompatible with gradient partitioning logic of ZeRO stage {stage}"
            )
        if self._in_no_sync:
            raise AssertionError("no_sync context manager reentry is unsupported")
        self._in_no_sync = True
        try:
            yield
        finally:
            self._in_no_sync = False

    def save_16bit_model(
        self, save_dir, save_filename: str = "pytorch_model.bin", exclude_frozen_parameters: bool = False
    ) -> bool:
        """COLLECTIVE: rank 0 writes the whole model in its compute dtype into save_dir, as safetensors (the
        checkpoint's model16 writer: one unit gathered at a time, no pickle).

        The file is `save_filename` with a .safetensors suffix; DeepSpeed's default `pytorch_model.bin` becomes
        `model.safetensors`, the name `from_pretrained` looks for. As DeepSpeed, ZeRO-3 without
        stage3_gather_16bit_weights_on_model_save writes nothing and returns False; otherwise True.
        exclude_frozen_parameters: as DeepSpeed's, the params with requires_grad False are left out.
        """
        from zerolaunch.checkpoint.model16 import MODEL16_NAME, wants_16bit_model, write_16bit_model

        if self.engine.options.zero.stage == 3 and not wants_16bit_model(self.engine):
            if self.rank == 0:
                print(
                    f"zerolaunch: save_16bit_model wrote nothing to {save_dir}: ZeRO-3 needs "
                    "stage3_gather_16bit_weights_on_model_save: true (as DeepSpeed)",
                    flush=True,
                )
            return False
        name = Path(save_filename)
        name = MODEL16_NAME if str(name) == "pytorch_model.bin" else str(name.with_suffix(".safetensors"))
        folder = Path(save_dir)
        if self.rank == 0:
            folder.mkdir(parents=True, exist_ok=True)
        try:
            write_16bit_model(
                self.engine,
                folder,
                rank=self.rank,
                name=name,
                exclude_frozen_parameters=exclude_frozen_parameters,
            )
        finally:  # a failed write on rank 0 still releases the others before it raises
            comm.barrier(self.group)
        return True

    def save_checkpoint(
        self,
        save_dir,
        step: int | None = None,
        extra: dict | None = None,
        *,
        exclude_frozen_parameters: bool = False,
    ):
        """COLLECTIVE: write `save_dir/step_{step}/` (default step: global_steps) and move `latest`.

        exclude_frozen_parameters: as DeepSpeed's, the params with requires_grad False are not saved; load
        such a checkpoint with load_checkpoint(..., load_module_strict=False), which keeps the model's values
        for them (DeepSpeed's strict load refuses their missing keys, and so does this one).

        `extra` is this rank's JSON/tensor dict stored with the checkpoint (DeepSpeed's client_state). For an HF
        model, rank 0's extra also carries the model's config (key "hf_config") so convert-checkpoint can write
        config.json next to the weights.
        """
        from zerolaunch.checkpoint import save_checkpoint

        return save_checkpoint(
            self.engine,
            Path(save_dir),
            step=self.engine.global_steps if step is None else step,
            extra=with_hf_config(extra, self.module, self.rank),
            group=self.group,
            exclude_frozen_parameters=exclude_frozen_parameters,
        )

    def load_checkpoint(self, load_dir, *, load_module_strict: bool = True):
        """Load a checkpoint root (follows `latest`) or one step folder, at any world size / stage; returns
        this rank's saved `extra` (with rank 0's "hf_config" if there was one). load_module_strict=False
        (DeepSpeed's) also loads a checkpoint saved with exclude_frozen_parameters: the frozen params it
        lacks keep the model's values."""
        from zerolaunch.checkpoint import load_checkpoint

        return load_checkpoint(self.engine, Path(load_dir), group=self.group, strict=load_module_strict)

    def save_pretrained(self, out_dir, **kwargs) -> None:
        """COLLECTIVE: see save_hf_pretrained."""
        save_hf_pretrained(self, out_dir, **kwargs)


def initialize(
    model: torch.nn.Module,
    config=None,
    *,
    overrides: list[str] | tuple[str, ...] = (),
    group=None,
    model_parameters=None,
    device: torch.device | str | None = None,
    timeout_s: float | None = None,
) -> ZeroLaunchEngine:
    """Wrap `model` in the ZeRO engine and return a ZeroLaunchEngine.

    config: a recipe or DeepSpeed dict, a path to a recipe YAML/JSON or ds_config.json, a Recipe, EngineOptions,
    or None (the recipe of the `zerolaunch train` run that started this script, else the engine defaults).
    overrides: `--set`-style "key=value" strings applied to a dict/path config.
    model_parameters: as DeepSpeed's, an iterable of params (one group) or of group dicts with `params` and any
    of lr, weight_decay, betas, eps, name; its groups are the optimizer's (a group's lr follows the schedule as
    DeepSpeed's: zero/sched.py LRSchedule.lrs_at). None: one group of every trainable param, decayed (DeepSpeed with model.parameters()), unless
    the recipe sets train.weight_decay_1d: false.
    Starts the process group from torchrun's env when none exists, with the collective timeout timeout_s, else
    ZEROLAUNCH_TIMEOUT (`zerolaunch train --timeout` sets it), else 1800 s; under torchrun the rank then dies
    with its launcher. device defaults to this rank's GPU or CPU.
    """
    init_process_group(timeout_s)
    world_size = comm.world_size(group)
    recipe, options = _resolve_config(config, overrides, world_size)
    device = torch.device(device) if device else _default_device()
    engine = build_engine(model, options, group=group, device=device, model_parameters=model_parameters)
    return ZeroLaunchEngine(engine, recipe)


# ---- Hugging Face output ------------------------------------------------------------------------------------
def write_hf_config(config: dict, out_dir, dtype: torch.dtype | None = None) -> None:
    """config.json (and generation_config.json) from a config dict, as save_pretrained writes them."""
    from zerolaunch.checkpoint.hf_out import write_side_files

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    write_side_files(out, config, dtype)


def save_hf_pretrained(
    engine,
    out_dir,
    *,
    dtype: torch.dtype | None = None,
    max_shard_bytes: int | None = None,
    tokenizer=None,
) -> Path:
    """COLLECTIVE: write the HF model directory that `model.save_pretrained` writes, from a ZeroLaunchEngine
    or a zerolaunch.zero.Engine: config.json and the weights under save_pretrained's names and shards (at
    max_shard_bytes; default save_pretrained's), in `dtype` (default: as the model holds them; fp32 from a
    16-bit model gives the exact master weights), the tokenizer or processor (an object or a local folder)
    if given, a PeftModel's adapter folder. Rank 0 holds one tensor group at a time, not a shard
    (checkpoint/hf_save.py write_hf_pretrained)."""
    inner = getattr(engine, "engine", engine)  # a ZeroLaunchEngine, or the engine itself
    return write_hf_pretrained(
        inner.module,
        inner.iter_full_state,
        inner.param_specs(),
        inner.group,
        out_dir,
        dtype=dtype,
        max_shard_bytes=max_shard_bytes,
        tokenizer=tokenizer,
    )
