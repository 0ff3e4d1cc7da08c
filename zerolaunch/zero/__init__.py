"""zerolaunch's ZeRO engine: stages 0-3 behind one `Engine` facade. Imports only torch and itself."""

from .engine import Engine, StepInfo
from .options import (
    EngineOptions,
    OffloadOptions,
    OptimizerOptions,
    PrecisionOptions,
    SchedulerOptions,
    ZeroOptions,
)

__all__ = [
    "Engine",
    "EngineOptions",
    "OffloadOptions",
    "OptimizerOptions",
    "PrecisionOptions",
    "SchedulerOptions",
    "StepInfo",
    "ZeroOptions",
]
