"""`zero_args(cls)`: a TrainingArguments class (transformers' or a subclass such as TRL's SFTConfig) whose
`deepspeed=` config drives zerolaunch's engine instead of DeepSpeed.

The config is taken unchanged (a dict, a JSON file path or a JSON string) and held as `args.zero_config`
(the user's value) and `args.zero_ds_config` (a copy with the arguments' "auto" values filled, hf/config.py).
`args.deepspeed` itself reads None afterwards: transformers and accelerate start DeepSpeed whenever it is set.
"""

from __future__ import annotations

import math

from zerolaunch.config.errors import UserError
from zerolaunch.hf import accelerate_env, meta_load
from zerolaunch.hf.config import TrainerDSConfig, read_ds_config
from zerolaunch.launch import env, hang_census, orphans

DEFAULT_DDP_TIMEOUT = 1800
"""TrainingArguments' own ddp_timeout default: a value left there takes ZEROLAUNCH_TIMEOUT when it is set."""
DEFAULT_CONFIG = {"zero_optimization": {"stage": 0}}
"""TrainingArguments without deepspeed=: plain data parallelism, every step still through the engine."""


class ZeroArgsMixin:
    """Put before a TrainingArguments class (zero_args does it)."""

    zerolaunch_arguments = True

    def __post_init__(self):
        accelerate_env.warn_if_one_of_several()
        if env.launched_by_torchrun():
            # torchrun / accelerate launch: this rank dies with its launcher (no orphan training on), and a
            # collective timeout that ends the script names the hung rank(s)
            orphans.die_with_parent()
            hang_census.install()
        timeout_s = env.script_timeout_s()
        if timeout_s is not None and self.ddp_timeout == DEFAULT_DDP_TIMEOUT:
            # the group accelerate starts takes ddp_timeout: `zerolaunch train --timeout` (or the variable)
            # reaches it unless the script set its own
            self.ddp_timeout = math.ceil(timeout_s)
        given, self.deepspeed = accelerate_env.deepspeed_plugin_config(self.deepspeed), None
        super().__post_init__()
        self.zero_config = given
        config = read_ds_config(given) if given else read_ds_config(DEFAULT_CONFIG)
        if getattr(self, "auto_find_batch_size", False):
            raise UserError(
                "TrainingArguments(auto_find_batch_size=True) is not supported with zerolaunch's engine (it "
                "rebuilds the engine at each retry); set per_device_train_batch_size"
            )
        for flag, block in (
            (self.bf16 or self.bf16_full_eval, "bf16"),
            (self.fp16 or self.fp16_full_eval, "fp16"),
        ):
            # accelerate's DeepSpeed plugin adds the block the arguments ask for when the config has none
            if flag and block not in config:
                config[block] = {"enabled": True}
        # a key the config leaves out takes the arguments' value, as if "auto": the Trainer's own clipping
        # (max_grad_norm) runs where DeepSpeed would fall back to its default of none
        config.setdefault("gradient_clipping", self.max_grad_norm)
        config.setdefault("train_micro_batch_size_per_gpu", self.per_device_train_batch_size)
        config.setdefault("gradient_accumulation_steps", self.gradient_accumulation_steps)
        filled = TrainerDSConfig(config)
        filled.process(self)
        filled.raise_mismatches()
        self.zero_ds_config = filled.config
        # stage 3: from_pretrained builds on meta while these arguments live (DeepSpeed's zero.Init rule)
        meta_load.activate(self)

    def __reduce__(self):
        # a class made by zero_args is not importable by name: pickle (training_args.bin) names its base
        base = next(c for c in type(self).__mro__[1:] if not issubclass(c, ZeroArgsMixin))
        return _rebuild, (base, self.__dict__.copy())


def _rebuild(base: type, state: dict):
    args = object.__new__(zero_args(base))
    args.__dict__.update(state)
    return args


_CLASSES: dict[type, type] = {}


def zero_args(cls: type) -> type:
    """The zerolaunch version of a TrainingArguments class: same fields, same parser, `deepspeed=` read by
    zerolaunch. Applying it twice returns the same class."""
    if getattr(cls, "zerolaunch_arguments", False):
        return cls
    if cls not in _CLASSES:
        _CLASSES[cls] = type(
            cls.__name__, (ZeroArgsMixin, cls), {"__module__": "zerolaunch.hf", "__doc__": cls.__doc__}
        )
    return _CLASSES[cls]
