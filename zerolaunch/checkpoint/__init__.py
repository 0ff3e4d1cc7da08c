"""Checkpoints: crash-safe save, exact resume, resume at another world size, offline conversion.

Public API (the training loop calls the first two at one hook):
`save_checkpoint(engine, root, *, step, extra, keep, group)`, `load_checkpoint(engine, path_or_root)`,
`latest_checkpoint(root)`, `convert_checkpoint(src, out, ...)` (also reads DeepSpeed ZeRO checkpoints).
Imports are lazy so `import zerolaunch.checkpoint` stays cheap for the CLI.
"""

from __future__ import annotations

_EXPORTS = {
    "save_checkpoint": "zerolaunch.checkpoint.save",
    "latest_checkpoint": "zerolaunch.checkpoint.save",
    "load_checkpoint": "zerolaunch.checkpoint.load",
    "convert_checkpoint": "zerolaunch.checkpoint.convert",
    "CheckpointError": "zerolaunch.checkpoint.errors",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    if name in _EXPORTS:
        import importlib

        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
