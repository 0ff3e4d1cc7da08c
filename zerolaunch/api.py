"""The library API: `engine = zerolaunch.initialize(model, config)`, the way `deepspeed.initialize` is used.

This module owns: turning a user's config (a recipe dict or file, a DeepSpeed dict or ds_config.json, a
Recipe, EngineOptions, or nothing = the recipe of the `zerolaunch train` run that started this script) into
engine options; starting the process group from torchrun's environment when the script was started by plain
`torchrun`; the user-facing engine wrapper (forward / backward / step / save and load checkpoints); running a
recipe's `entrypoint:` script inside a worker (`run_entrypoint`); and writing a Hugging Face model directory
(`save_hf_pretrained`). The engine itself is zero/, checkpoint files are checkpoint/; this only wires them.
"""

from __future__ import annotations

import atexit
import os
import runpy
import shlex
import sys
from dataclasses import replace
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist

from zerolaunch.checkpoint.extra import HF_CONFIG_KEY
from zerolaunch.models.hf import hf_config_dict, hf_stage3_units, meta_init_fn
from zerolaunch.zero import Engine, EngineOptions, OptimizerOptions, comm

RECIPE_ENV = "ZEROLAUNCH_RECIPE"
"""Path of the resolved recipe JSON of the run that started this process; `initialize(model)` reads it."""
BACKEND_ENV = "ZEROLAUNCH_BACKEND"
"""The process-group backend `zerolaunch train --device` chose for an entrypoint script (gloo / nccl)."""
DEFAULT_MAX_SHARD_BYTES = 2 * 1024**3


# ---- config ---------------------------------------------------------------------------------------------
def _resolve_config(config, overrides, world_size: int):
    """(recipe or None, EngineOptions) from whatever the user passed; see initialize()."""
    if isinstance(config, EngineOptions):
        return None, config
    if config is not None and hasattr(config, "engine") and isinstance(config.engine, EngineOptions):
        return config, config.engine
    from zerolaunch import config as zconfig

    if config is None:
        resolved = os.environ.get(RECIPE_ENV)
        if not resolved:
            # the library's default is DeepSpeed's: one group, every param decayed (see below)
            return None, EngineOptions(optimizer=OptimizerOptions(decay_1d=True))
        recipe = zconfig.load_resolved(resolved)
        return recipe, recipe.engine
    if isinstance(config, dict | str | os.PathLike):
        recipe = zconfig.load_recipe(config, overrides=list(overrides), world_size=world_size)
        options = recipe.engine
        if (
            recipe.origins.get("train.weight_decay_1d", "default") == "default"
            and not options.optimizer.decay_1d
        ):
            # the library's default is DeepSpeed's (one group, every param decayed), whatever the built-in
            # loop's default for a recipe without an entrypoint is; a value given in the recipe is kept.
            options = replace(options, optimizer=replace(options.optimizer, decay_1d=True))
        return recipe, options
    raise TypeError(
        f"zerolaunch.initialize: config must be a recipe/DeepSpeed dict, a path to a recipe or ds_config "
        f"file, a Recipe or EngineOptions, got {type(config).__name__}"
    )


# ---- process group ------------------------------------------------------------------------------------------
def _launched_by_torchrun() -> bool:
    env = os.environ
    return all(k in env for k in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"))


def init_process_group(timeout_s: float = 1800.0) -> bool:
    """Start the default process group from torchrun's env (nccl on CUDA, gloo on CPU) unless one exists.

    Returns True when this call created it. Without torchrun's variables (a plain `python train.py`) nothing is
    started: the engine runs as a world of one.
    """
    if dist.is_initialized() or not _launched_by_torchrun():
        return False
    backend = os.environ.get(BACKEND_ENV) or ("nccl" if torch.cuda.is_available() else "gloo")
    if backend == "nccl":
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    dist.init_process_group(backend, init_method="env://", timeout=timedelta(seconds=timeout_s))
    # the group we made is ours to tear down; torch warns at exit about a group never destroyed. An uncaught
    # exception reaches sys.excepthook before the atexit handlers run: then the peers are not waited for.
    failed = []
    previous_hook = sys.excepthook

    def note_failure(*exc_info):
        failed.append(True)
        previous_hook(*exc_info)

    sys.excepthook = note_failure
    atexit.register(lambda: comm.destroy_default_group(every_rank_finished=not failed))
    return True


def _default_device() -> torch.device:
    # a gloo group (e.g. `zerolaunch train --device cpu` on a GPU host) means the run is on the CPU.
    on_gloo = dist.is_initialized() and dist.get_backend() == "gloo"
    if torch.cuda.is_available() and not on_gloo:
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


# ---- the engine wrapper -------------------------------------------------------------------------------------
class ZeroLaunchEngine:
    """What initialize() returns: DeepSpeed's engine surface over `zerolaunch.zero.Engine`.

    Attributes not defined here (global_steps, memory_bytes(), comm_stats, full_state_dict(), ...) are the
    inner engine's (`.engine`), so the checkpoint contract of docs/ARCHITECTURE.md works on either.
    """

    def __init__(self, engine, recipe=None):
        self.engine = engine
        self.recipe = recipe
        self.module = engine.module
        self.device = engine.device
        self.group = engine.group
        self.rank = comm.rank(engine.group)
        self.world_size = comm.world_size(engine.group)

    def __getattr__(self, name):
        # only called for names not found on the wrapper itself.
        return getattr(self.__dict__["engine"], name)

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
        self.engine.backward(loss)

    def step(self):
        """Call after every backward; the optimizer steps at each accumulation boundary -> StepInfo."""
        return self.engine.step()

    def save_checkpoint(self, save_dir, step: int | None = None, extra: dict | None = None):
        """COLLECTIVE: write `save_dir/step_{step}/` (default step: global_steps) and move `latest`.

        `extra` is this rank's JSON/tensor dict stored with the checkpoint (DeepSpeed's client_state). For an HF
        model, rank 0's extra also carries the model's config (key "hf_config") so convert-checkpoint can write
        config.json next to the weights.
        """
        from zerolaunch.checkpoint import save_checkpoint

        extra = dict(extra or {})
        if self.rank == 0 and HF_CONFIG_KEY not in extra:
            hf_config = hf_config_dict(self.module)
            if hf_config is not None:
                extra[HF_CONFIG_KEY] = hf_config
        return save_checkpoint(
            self.engine,
            Path(save_dir),
            step=self.engine.global_steps if step is None else step,
            extra=extra,
            group=self.group,
        )

    def load_checkpoint(self, load_dir):
        """Load a checkpoint root (follows `latest`) or one step folder, at any world size / stage; returns
        this rank's saved `extra` (with rank 0's "hf_config" if there was one)."""
        from zerolaunch.checkpoint import load_checkpoint

        return load_checkpoint(self.engine, Path(load_dir), group=self.group)

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
    timeout_s: float = 1800.0,
) -> ZeroLaunchEngine:
    """Wrap `model` in the ZeRO engine and return a ZeroLaunchEngine.

    config: a recipe or DeepSpeed dict, a path to a recipe YAML/JSON or ds_config.json, a Recipe, EngineOptions,
    or None (the recipe of the `zerolaunch train` run that started this script, else the engine defaults).
    overrides: `--set`-style "key=value" strings applied to a dict/path config.
    model_parameters: as DeepSpeed's, an iterable of params (one group) or of group dicts with `params` and any
    of lr, weight_decay, betas, eps, name; its groups are the optimizer's (a group's lr follows the schedule in
    proportion). None: one group of every trainable param, decayed (DeepSpeed with model.parameters()), unless
    the recipe sets train.weight_decay_1d: false.
    Starts the process group from torchrun's env when none exists; device defaults to this rank's GPU or CPU.
    """
    init_process_group(timeout_s)
    world_size = comm.world_size(group)
    recipe, options = _resolve_config(config, overrides, world_size)
    options = hf_stage3_units(model, options)
    device = torch.device(device) if device else _default_device()
    param_groups = None
    if model_parameters is not None:
        from zerolaunch.zero.param_groups import client_groups, collect_params

        param_groups = client_groups(collect_params(model), model_parameters, options.optimizer.weight_decay)
    init_fn = meta_init_fn(model, options)  # None unless stage 3 on a meta-built model
    engine = Engine(model, options, group=group, device=device, init_fn=init_fn, param_groups=param_groups)
    return ZeroLaunchEngine(engine, recipe)


def run_entrypoint(recipe, resolved_path, backend: str | None = None) -> None:
    """Run the recipe's `entrypoint:` script in this worker instead of the built-in loop.

    The script runs as `__main__` (runpy) with sys.argv = the entrypoint split shell-style, its folder first on
    sys.path (as `python script.py` would), and ZEROLAUNCH_RECIPE = resolved_path so that
    `zerolaunch.initialize(model)` with no config uses this run's recipe. No process group is started here:
    the script starts its own (plain torchrun style) or initialize() does; `backend` (the run's --device
    choice) is the one initialize() then uses.
    """
    entry = str(recipe.entrypoint or "").strip()
    # the resolved recipe holds an absolute script path (maybe with spaces); else "script.py --arg value".
    argv = [entry] if Path(entry).is_file() else shlex.split(entry)
    if not argv:
        raise ValueError("entrypoint is empty: give a script path, e.g. entrypoint: my_train.py")
    script = Path(argv[0]).expanduser()
    if not script.is_file():
        raise FileNotFoundError(
            f"entrypoint: {script} is not a file (relative paths are taken from {Path.cwd()}); "
            "give the path of your training script"
        )
    saved_argv, saved_path = sys.argv, list(sys.path)
    saved_env = {k: os.environ.get(k) for k in (RECIPE_ENV, BACKEND_ENV)}
    sys.argv = [str(script), *argv[1:]]
    sys.path.insert(0, str(script.resolve().parent))
    os.environ[RECIPE_ENV] = str(Path(resolved_path).resolve())
    if backend:
        os.environ[BACKEND_ENV] = backend
    try:
        runpy.run_path(str(script), run_name="__main__")
    finally:
        sys.argv, sys.path[:] = saved_argv, saved_path
        for key, value in saved_env.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


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
    max_shard_bytes: int = DEFAULT_MAX_SHARD_BYTES,
    tokenizer=None,
) -> Path:
    """COLLECTIVE: write an HF model directory that `AutoModelForCausalLM.from_pretrained` loads.

    Every rank iterates engine.full_state_dict (it gathers); rank 0 writes config.json and the weights:
    model.safetensors, or shards of at most max_shard_bytes + model.safetensors.index.json. Host memory on
    rank 0 stays under one shard. dtype: of the written weights (default: as the model holds them; fp32 from a
    16-bit model gives the exact master weights). Tied weights are written once (HF re-ties them on load);
    non-persistent buffers (rotary tables) are left out, as save_pretrained does. tokenizer: a local folder
    written by tokenizer.save_pretrained; its tokenizer files are copied in (checkpoint/hf_folder.py).
    """
    from zerolaunch.models.hf import is_hf_model

    inner = getattr(engine, "engine", engine)
    model = inner.module
    if not is_hf_model(model):
        raise ValueError(
            f"save_hf_pretrained needs a transformers PreTrainedModel, got {type(model).__name__}; "
            "use zerolaunch convert-checkpoint for other models"
        )
    from zerolaunch.checkpoint.hf_folder import HFFolderWriter

    rank = comm.rank(inner.group)
    persistent = set(model.state_dict().keys())  # tied aliases appear once, non-persistent buffers not at all
    # the one HF writer (checkpoint/hf_folder.py, also convert-checkpoint's): rank 0 builds the folder under
    # a temp name and renames it into place, so a crash leaves the previous folder (or none), never a mix.
    writer = HFFolderWriter(Path(out_dir), max_shard_bytes=max_shard_bytes) if rank == 0 else None
    try:
        for name, tensor in inner.full_state_dict(dtype=dtype):
            if writer is not None and name in persistent:
                writer.add(name, tensor)
        if writer is not None:
            writer.finish(hf_config_dict(model), live_model=model, tokenizer_dir=tokenizer)
    except BaseException:
        if writer is not None:
            writer.abort()
        raise
    comm.barrier(inner.group)
    return Path(out_dir)
