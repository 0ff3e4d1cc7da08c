"""`RunContext`: what one worker process knows about itself, handed from worker.py to the loop.

The worker reads the environment (torchelastic's RANK, LOCAL_RANK, WORLD_SIZE, TORCHELASTIC_RESTART_COUNT)
and its command line; the loop reads only this object, so it can be driven from a test without env vars.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class RunContext:
    rank: int
    local_rank: int
    world_size: int
    device: torch.device
    group: object | None = None
    """Process group of the run (None = the default group)."""
    restart_count: int = 0
    """torchelastic restarts so far; > 0 means resume from the latest checkpoint."""
    resume: str | None = None
    """--resume: None (fresh unless restarted), "auto" (latest checkpoint if any) or a checkpoint path."""
    verify_checkpoints: bool = True
    """False with `train --no-verify`: resume and model.init_from read checkpoints without their crc32 check."""

    @property
    def is_rank0(self) -> bool:
        return self.rank == 0
