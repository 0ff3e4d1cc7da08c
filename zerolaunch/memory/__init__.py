"""`zerolaunch estimate-memory`: per-rank memory of every ZeRO stage x offload choice, before a run.

sizes.py (../util/sizes.py) parses inputs; shape.py / modules.py describe the model (arch.py: the facts both share, so that
modules.py never imports shape.py); engine_layout.py, stage3.py and
activations.py hold the arithmetic (the engine's own layout code); lora.py turns a shape into a LoRA adapter
over a frozen base (`--lora-rank`); estimate.py puts the rows together;
deepspeed.py holds DeepSpeed's formulas for comparison. Arithmetic only: the real steps that check the
figures (`--measure`) are train/measure_memory.py's, which runs an Engine.
Importing this package does not import torch (the `--params` path stays fast).
"""

from zerolaunch.memory.estimate import (
    OFFLOADS,
    STATE_KEYS,
    Estimate,
    Row,
    Setup,
    estimate,
)
from zerolaunch.memory.shape import ModelShape, synthetic_gpt
from zerolaunch.util.sizes import EstimateError, parse_bytes, parse_count

__all__ = [
    "OFFLOADS",
    "STATE_KEYS",
    "Estimate",
    "EstimateError",
    "ModelShape",
    "Row",
    "Setup",
    "estimate",
    "parse_bytes",
    "parse_count",
    "synthetic_gpt",
]
