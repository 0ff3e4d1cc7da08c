"""`from_pretrained` under stage-3 zerolaunch TrainingArguments: the model is built on the meta device and the
engine fills each unit from the folder's safetensors files as it shards it, so no rank ever holds the whole
model (docs/hf-trainer.md, "A pretrained model at stage 3").

This is what transformers does for DeepSpeed: TrainingArguments with a stage-3 `deepspeed=` config keep an
HfDeepSpeedConfig alive, and while it lives `from_pretrained` builds the model under `deepspeed.zero.Init`,
which loads each param straight into its shard. Here the arguments (hf/args.py) call `activate(args)`; from
then until a Trainer is built with them (`consume`), while they live (a weak reference, as transformers holds
its config), `PreTrainedModel.from_pretrained`
of a local folder with safetensors weights returns `models/hf_load.py`'s meta model, whose CheckpointInit the
engine runs unit by unit (reading one tensor at a time, converted to the model's dtype: a bf16 file loaded
as fp32 is converted a tensor at a time, not as a whole model per rank).

What falls through to transformers' own load, whole on every rank until the engine shards it: anything this
path cannot reproduce exactly (a hub id or a folder without safetensors, quantization, device_map, adapters,
config overrides passed as keywords, fp32-kept modules under a 16-bit dtype, extra model arguments), loads
made inside a Trainer's constructor (TRL loads its models there, then PEFT puts adapters on their base
layer's device, which must be a real one), and loads under `plain_from_pretrained()`. A meta-built model handed
to a Trainer with a `peft_config` is loaded again whole for the same reason (`reload_whole`).
It does not know the engine; build.py's meta_init_fn finds the CheckpointInit on the model.
"""

from __future__ import annotations

import contextlib
import functools
import os
import weakref
from pathlib import Path

_active: weakref.ref | None = None
"""The stage-3 arguments that switch the meta load on (the latest arguments made decide, as transformers'
HfDeepSpeedConfig global does); None: off."""
_paused = 0
"""Depth of plain_from_pretrained() blocks (and Trainer constructors) now running."""

PASSED_KWARGS = frozenset({"dtype", "torch_dtype", "attn_implementation"})
"""from_pretrained keywords the meta build honours."""
NEUTRAL_KWARGS = {
    "local_files_only": None,
    "use_safetensors": (None, True),
    "low_cpu_mem_usage": None,
    "trust_remote_code": (None, False),
    "revision": (None, "main"),
    "cache_dir": None,
    "token": None,
    "force_download": (None, False),
    "weights_only": (None, True),
    "proxies": None,
    "resume_download": None,
    "subfolder": (None, ""),
    "_from_auto": None,
    "_commit_hash": None,
    "code_revision": None,
    "adapter_kwargs": None,  # used only when the folder holds an adapter, which falls through
}
"""Keywords that change nothing for a local safetensors folder at these values (None: any value)."""


def activate(args) -> None:
    """Called by the arguments' __post_init__: stage-3 arguments switch the meta load on while they live,
    any other arguments switch it off."""
    global _active
    stage = (getattr(args, "zero_ds_config", None) or {}).get("zero_optimization", {}).get("stage", 0)
    _active = weakref.ref(args) if stage == 3 else None
    if _active is not None:
        _install()


def consume(args) -> None:
    """Called once a Trainer is built with `args`: the rule covers the loads between the arguments and their
    Trainer (the models it trains); a load after it (an evaluation, an adapter folder read back) is whole."""
    global _active
    if _active is not None and _active() is args:
        _active = None


def deactivate() -> None:
    """from_pretrained loads as transformers does from now on, whichever arguments still live."""
    global _active
    _active = None


def is_active() -> bool:
    return _paused == 0 and _active is not None and _active() is not None


@contextlib.contextmanager
def plain_from_pretrained():
    """Inside this block `from_pretrained` loads the whole model as transformers does, even under stage-3
    arguments (a model used outside the Trainer, e.g. a scorer run on its own)."""
    global _paused
    _paused += 1
    try:
        yield
    finally:
        _paused -= 1


@functools.cache
def _install() -> None:
    """Wrap PreTrainedModel.from_pretrained once per process (the wrapper does nothing while inactive)."""
    from transformers import PreTrainedModel

    original = PreTrainedModel.from_pretrained.__func__

    @functools.wraps(original)
    def from_pretrained(cls, pretrained_model_name_or_path, *model_args, **kwargs):
        local = _meta_loadable(cls, pretrained_model_name_or_path, model_args, kwargs)
        if local is None:
            return original(cls, pretrained_model_name_or_path, *model_args, **kwargs)
        return _load_on_meta(cls, local, kwargs)

    PreTrainedModel.from_pretrained = classmethod(from_pretrained)


def _meta_loadable(cls, name, model_args, kwargs) -> Path | None:
    """The local folder when this call can be a meta load, else None (transformers loads it)."""
    if not is_active() or model_args or name is None or not os.path.isdir(name):
        return None
    for key, value in kwargs.items():
        if key in PASSED_KWARGS or key == "config" and _is_config(value):
            continue
        allowed = NEUTRAL_KWARGS.get(key, ())
        if key not in NEUTRAL_KWARGS or allowed is not None and value not in allowed:
            return None
    local = Path(name)
    if not (local / "config.json").is_file() or (local / "adapter_config.json").is_file():
        return None
    from zerolaunch.models.hf_load import INDEX_FILE, SINGLE_FILE

    if not ((local / SINGLE_FILE).is_file() or (local / INDEX_FILE).is_file()):
        return None
    if getattr(cls, "_keep_in_fp32_modules", None) or getattr(cls, "_keep_in_fp32_modules_strict", None):
        return None  # transformers keeps some modules fp32 under a 16-bit dtype; a plain cast would not
    return local


def _is_config(value) -> bool:
    return value is not None and hasattr(value, "to_json_string") and hasattr(value, "model_type")


def _load_on_meta(cls, local: Path, kwargs: dict):
    """The model on the meta device, as from_pretrained would hand it back (its dtype, generation config,
    eval mode), filled from `local` by the stage-3 engine."""
    import transformers
    from transformers import AutoConfig

    from zerolaunch.models.hf_load import build_meta

    config = kwargs.get("config")
    if config is None:
        config = AutoConfig.from_pretrained(str(local), local_files_only=True)
    dtype = _resolve_dtype(kwargs, config, local)
    extra = {}
    if kwargs.get("attn_implementation") is not None:
        extra["attn_implementation"] = kwargs["attn_implementation"]
    model = build_meta(local, transformers, dtype, extra, model_class=cls, config=config)
    if hasattr(model.config, "dtype"):
        model.config.dtype = dtype
    generation = local / "generation_config.json"
    if generation.is_file() and model.can_generate():
        model.generation_config = transformers.GenerationConfig.from_pretrained(str(local))
    model.eval()  # from_pretrained hands back eval mode
    # how to load it whole after all (reload_whole: a Trainer given a peft_config)
    model.zerolaunch_plain_load = functools.partial(_plain_load, cls, str(local), dict(kwargs))
    return model


def _plain_load(cls, name: str, kwargs: dict):
    with plain_from_pretrained():
        return cls.from_pretrained(name, **kwargs)


def reload_whole(model):
    """A model this module built on meta, loaded again by transformers (whole, with values); any other model
    as it is. PEFT adds adapters on their base layer's device, which must then be a real one."""
    load = getattr(model, "zerolaunch_plain_load", None)
    if load is None or not any(p.is_meta for p in model.parameters()):
        return model
    return load()


def _resolve_dtype(kwargs: dict, config, local: Path):
    """The dtype transformers' from_pretrained would load in: the one asked for; "auto" (transformers 5's
    default): the config's, else the weights' first floating tensor's; None before transformers 5: torch's
    default dtype."""
    import torch
    import transformers

    dtype = kwargs.get("dtype", kwargs.get("torch_dtype"))
    if dtype is None:
        major = int(transformers.__version__.split(".")[0])
        dtype = "auto" if major >= 5 else torch.get_default_dtype()
    if dtype == "auto":
        dtype = getattr(config, "dtype", None) or getattr(config, "torch_dtype", None)
        if dtype is None:
            dtype = _file_dtype(local)
    if isinstance(dtype, str):
        dtype = getattr(torch, dtype)
    return dtype


def _file_dtype(local: Path):
    import torch
    from safetensors import safe_open

    from zerolaunch.models.hf_load import weight_files

    files = weight_files(local)
    for name, path in files.items():
        with safe_open(str(path), framework="pt") as f:
            dtype = f.get_slice(name).get_dtype()
        value = getattr(torch, {"F32": "float32", "BF16": "bfloat16", "F16": "float16"}.get(dtype, ""), None)
        if isinstance(value, torch.dtype):
            return value
    return torch.get_default_dtype()
