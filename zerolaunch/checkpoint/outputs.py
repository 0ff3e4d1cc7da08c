"""What convert and reshard share: a tensor to write (OutTensor) and a byte progress bar.

Its own module so that convert.py, deepspeed.py and reshard.py import it rather than each other.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class OutTensor:
    name: str
    shape: tuple[int, ...]
    dtype: torch.dtype
    """The dtype as the source holds it (fp32 for trainable state); floats are cast to --dtype on output."""
    source: str
    """The tensor to read: `name` itself, or the tensor a tied alias shares."""


class ByteProgress:
    """A rich progress bar in bytes, or nothing."""

    def __init__(self, enabled: bool, total_bytes: int, description: str):
        self._enabled = enabled
        self._total = total_bytes
        self._description = description

    def __enter__(self) -> ByteProgress:
        self.advance: Callable[[int], None] = lambda n: None
        if self._enabled:
            from rich.progress import BarColumn, DownloadColumn, Progress, TimeRemainingColumn

            self._bar = Progress(
                "[progress.description]{task.description}",
                BarColumn(),
                DownloadColumn(),
                TimeRemainingColumn(),
                transient=True,
            )
            self._bar.__enter__()
            task = self._bar.add_task("converting", total=self._total)
            self.advance = lambda n: self._bar.advance(task, n)
        return self

    def __exit__(self, *exc) -> None:
        if self._enabled:
            self._bar.__exit__(*exc)
