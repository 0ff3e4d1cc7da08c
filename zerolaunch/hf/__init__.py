"""Hugging Face Trainer on zerolaunch's engine: change one import.

    from zerolaunch.hf import Trainer, TrainingArguments      # was: from transformers import ...

`zero_trainer(cls)` / `zero_args(cls)` do the same for any Trainer subclass and its arguments class (TRL's
SFTTrainer / SFTConfig, ...). See docs/hf-trainer.md. Importing this package imports transformers.
"""

from __future__ import annotations

import transformers

from zerolaunch.hf.args import zero_args
from zerolaunch.hf.meta_load import plain_from_pretrained
from zerolaunch.hf.trainer import ZeroModel, zero_trainer

TrainingArguments = zero_args(transformers.TrainingArguments)
Trainer = zero_trainer(transformers.Trainer)

__all__ = [
    "Trainer",
    "TrainingArguments",
    "ZeroModel",
    "plain_from_pretrained",
    "zero_args",
    "zero_trainer",
]
