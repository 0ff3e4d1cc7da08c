"""zerolaunch's ZeRO engine: stages 0-3 behind one `Engine` facade. Imports only torch and itself.

`Engine` and `StepInfo` load lazily (PEP 562) so that `zerolaunch.zero.options`, which the recipe code
imports, stays free of torch: `zerolaunch --help` and `recipe show` must answer instantly.
"""

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


def __getattr__(name: str):
    if name in ("Engine", "StepInfo"):
        from . import engine

        return getattr(engine, name)
    raise AttributeError(f"module 'zerolaunch.zero' has no attribute {name!r}")
