"""A memory-estimate `Setup` for tests, written flat: the workload keywords as Setup takes them, and
engine options by their field name in ZeroOptions, PrecisionOptions or OptimizerOptions."""

from __future__ import annotations

from dataclasses import fields, replace

from zerolaunch.memory import Setup
from zerolaunch.zero.options import EngineOptions, OptimizerOptions, PrecisionOptions, ZeroOptions

_SECTIONS = {"zero": ZeroOptions, "precision": PrecisionOptions, "optimizer": OptimizerOptions}


def bf16_setup(**kw) -> Setup:
    """Setup(engine=EngineOptions with the named option fields set, **the rest). dtype is bf16 unless given:
    estimate-memory's default, which these tests' figures assume (the engine's own default is fp32)."""
    kw.setdefault("dtype", "bf16")
    engine = EngineOptions()
    for section, cls in _SECTIONS.items():
        names = {f.name for f in fields(cls)} & kw.keys()
        if names:
            changed = replace(getattr(engine, section), **{n: kw.pop(n) for n in names})
            engine = replace(engine, **{section: changed})
    return Setup(engine=engine, **kw)
