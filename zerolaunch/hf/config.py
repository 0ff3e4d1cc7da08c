"""A DeepSpeed config given to `zerolaunch.hf.TrainingArguments(deepspeed=...)`: its "auto" values filled
from the TrainingArguments, as transformers fills them for DeepSpeed, and turned into engine options.

The rules are transformers' (integrations/deepspeed.py, HfTrainerDeepSpeedConfig: trainer_config_process
when the arguments are built, trainer_config_finalize once the model and the number of steps are known),
written here so that DeepSpeed need not be installed. The bucket "auto"s (reduce_bucket_size and the
stage-3 ones) are not filled here: `model_hidden` hands the model's hidden size to config's
`deepspeed_engine_options`, whose engine_options.py resolves every bucket "auto", a recipe's or this door's.
An explicit value that contradicts a TrainingArguments value is an error naming both; transformers collects
those until finalize, this raises the ones it can see when the arguments are built and the rest when the
engine is built, before the first step. The DeepSpeed vocabulary itself (which keys exist, what each does)
is config/'s.
"""

from __future__ import annotations

import copy
import json
import os
from typing import Any

from zerolaunch.config.errors import UserError
from zerolaunch.config.hidden import ModelHidden

ADAMW_OPTIMS = ("adamw_torch", "adamw_torch_fused")
"""TrainingArguments.optim values whose update the engine's AdamW computes (torch.optim.AdamW)."""


class ConfigMismatch(UserError, ValueError):
    """A DeepSpeed config value contradicts a TrainingArguments value (both named in the message)."""


def read_ds_config(value: Any) -> dict:
    """A deep copy of the config given as a dict, a JSON file path or a JSON string (as transformers takes)."""
    if isinstance(value, dict):
        return copy.deepcopy(value)
    if isinstance(value, str | os.PathLike) and os.path.isfile(value):
        with open(value) as f:
            data = json.load(f)
    elif isinstance(value, str):
        try:
            data = json.loads(value)
        except json.JSONDecodeError:
            raise UserError(
                f"deepspeed={value!r} is neither an existing file nor a JSON object; give the path of a "
                "ds_config.json or a dict"
            ) from None
    else:
        raise UserError(
            f"deepspeed= takes a dict or the path of a ds_config.json, got {type(value).__name__}"
        )
    if not isinstance(data, dict):
        raise UserError(f"the DeepSpeed config must be a JSON object, got {type(data).__name__}")
    return data


def ds_config_source(given: Any) -> str:
    """How an error names the config the user gave as `deepspeed=` (TrainingArguments or accelerate's
    DeepSpeed plugin), kept as `args.zero_config`: its file where it is one."""
    if given is None:
        return "TrainingArguments without deepspeed= (zerolaunch's stage-0 default)"
    if isinstance(given, str | os.PathLike) and os.path.isfile(given):
        return f"the DeepSpeed config {os.fspath(given)} (TrainingArguments deepspeed=)"
    kind = "a dict" if isinstance(given, dict) else "a JSON string"
    return f"the DeepSpeed config given as {kind} (TrainingArguments deepspeed=)"


class TrainerDSConfig:
    """The config dict and the mismatches found while filling it (transformers' HfTrainerDeepSpeedConfig)."""

    def __init__(self, config: dict):
        self.config = config
        self.mismatches: list[str] = []

    def _node(self, dotted: str) -> tuple[dict | None, str]:
        *parents, key = dotted.split(".")
        node = self.config
        for name in parents:
            node = node.get(name)
            if not isinstance(node, dict):
                return None, key
        return node, key

    def get(self, dotted: str, default=None):
        node, key = self._node(dotted)
        return default if node is None else node.get(key, default)

    def is_auto(self, dotted: str) -> bool:
        return self.get(dotted) == "auto"

    def fill_match(self, dotted: str, hf_value, hf_key: str, must_match: bool = True) -> None:
        node, key = self._node(dotted)
        if node is None:
            return
        if node.get(key) == "auto":
            node[key] = hf_value
            return
        value = node.get(key)
        if must_match and value is not None and value != hf_value:
            self.mismatches.append(f"- ds {dotted}={value} vs hf {hf_key}={hf_value}")

    def fill_only(self, dotted: str, hf_value) -> None:
        self.fill_match(dotted, hf_value, "", must_match=False)

    def stage(self) -> int:
        stage = self.get("zero_optimization.stage", 0)
        return stage if isinstance(stage, int) else 0

    def raise_mismatches(self) -> None:
        if self.mismatches:
            raise ConfigMismatch(
                "these DeepSpeed config values contradict the TrainingArguments:\n"
                + "\n".join(self.mismatches)
                + "\nSet them to 'auto' (they then take the TrainingArguments value), or change one side."
            )

    # ---- transformers' trainer_config_process ------------------------------------------------------------
    def process(self, args) -> None:
        """Fill what the arguments alone decide (transformers' trainer_config_process)."""
        train_batch = args.world_size * args.per_device_train_batch_size * args.gradient_accumulation_steps
        self.fill_match(
            "train_micro_batch_size_per_gpu", args.per_device_train_batch_size, "per_device_train_batch_size"
        )
        self.fill_match(
            "gradient_accumulation_steps", args.gradient_accumulation_steps, "gradient_accumulation_steps"
        )
        self.fill_match("train_batch_size", train_batch, "train_batch_size (calculated)")
        self.fill_match("gradient_clipping", args.max_grad_norm, "max_grad_norm")
        self.fill_match("optimizer.params.lr", args.learning_rate, "learning_rate")
        self.fill_match("optimizer.params.betas", [args.adam_beta1, args.adam_beta2], "adam_beta1+adam_beta2")
        self.fill_match("optimizer.params.eps", args.adam_epsilon, "adam_epsilon")
        self.fill_match("optimizer.params.weight_decay", args.weight_decay, "weight_decay")
        self.fill_only("scheduler.params.warmup_min_lr", 0)
        self.fill_match("scheduler.params.warmup_max_lr", args.learning_rate, "learning_rate")
        self.fill_match("fp16.enabled", bool(args.fp16 or args.fp16_full_eval), "fp16|fp16_full_eval")
        self.fill_match("bf16.enabled", bool(args.bf16 or args.bf16_full_eval), "bf16|bf16_full_eval")

    # ---- transformers' trainer_config_finalize -----------------------------------------------------------
    def finalize(self, args, num_training_steps: int) -> None:
        """Fill what needs the step count (transformers' trainer_config_finalize); the bucket "auto"s, which
        need the model, are left to config's `deepspeed_engine_options` (`model_hidden`)."""
        self.fill_match(
            "scheduler.params.total_num_steps", num_training_steps, "num_training_steps (calculated)"
        )
        self.fill_match(
            "scheduler.params.warmup_num_steps",
            max(1, args.get_warmup_steps(num_training_steps)),
            "warmup_steps",
        )
        self.raise_mismatches()


def model_hidden(model) -> ModelHidden:
    """The model's hidden size for the bucket "auto"s, read as transformers reads it (hidden_size, else the
    largest of hidden_sizes, on the config or its text_config), for config's `deepspeed_engine_options`."""
    config = getattr(model, "config", None)
    for cfg, where in ((config, "config"), (getattr(config, "text_config", None), "config.text_config")):
        if cfg is None:
            continue
        if getattr(cfg, "hidden_size", None) is not None:
            return ModelHidden(int(cfg.hidden_size), f"the model's {where}.hidden_size")
        if getattr(cfg, "hidden_sizes", None):
            return ModelHidden(int(max(cfg.hidden_sizes)), f"the model's {where}.hidden_sizes (largest)")
    return ModelHidden(None, "the model's config (no hidden_size or hidden_sizes)")


def optimizer_block(args) -> dict:
    """The optimizer block for a config without one: the Trainer's own optimizer (args.optim) with the
    arguments' lr, betas, eps and weight decay. The engine steps the optimizer itself, so only those it
    computes are accepted."""
    optim = str(getattr(args.optim, "value", args.optim))
    if optim in ADAMW_OPTIMS:
        kind = "AdamW"
        params = {
            "lr": args.learning_rate,
            "betas": [args.adam_beta1, args.adam_beta2],
            "eps": args.adam_epsilon,
            "weight_decay": args.weight_decay,
        }
    elif optim == "sgd":
        kind, params = "SGD", {"lr": args.learning_rate, "weight_decay": args.weight_decay}
    else:
        raise UserError(
            f"TrainingArguments(optim={optim!r}): zerolaunch's engine steps the optimizer on its own shards "
            f"and computes {', '.join(ADAMW_OPTIMS)} and sgd; set optim to one of them, or give the DeepSpeed "
            "config an `optimizer` block (AdamW, Adam, SGD)"
        )
    return {"type": kind, "params": params}
