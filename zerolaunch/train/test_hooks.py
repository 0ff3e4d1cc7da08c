"""Failure injection for the launcher's own tests: the one place zerolaunch crashes on purpose.

worker.py fills a `FailureHook` from ZEROLAUNCH_TEST_FAIL_* environment variables (see `ENV`); the loop
calls `hook.maybe_fire(step, rank, restart_count)` at the start of every optimizer step. It fires only on the
first attempt (restart_count == 0), so a `--max-restarts` run recovers. Unset variables = the hook is off,
which is the only state a real run ever sees.
"""

from __future__ import annotations

import os
import signal
import time
from dataclasses import dataclass

ENV = {
    "step": "ZEROLAUNCH_TEST_FAIL_AT_STEP",
    "rank": "ZEROLAUNCH_TEST_FAIL_RANK",
    "mode": "ZEROLAUNCH_TEST_FAIL_MODE",
}
MODES = ("raise", "kill", "hang")


class InjectedFailure(RuntimeError):
    """Raised by the test hook in mode "raise"."""


@dataclass(frozen=True)
class FailureHook:
    step: int | None = None
    """1-based optimizer step at whose start the failure happens; None = off."""
    rank: int = 0
    mode: str = "raise"
    """raise (an exception), kill (SIGKILL itself) or hang (sleep, for collective-timeout tests)."""

    @classmethod
    def from_env(cls, environ: dict[str, str]) -> FailureHook:
        raw_step = environ.get(ENV["step"])
        if not raw_step:
            return cls()
        mode = environ.get(ENV["mode"], "raise")
        if mode not in MODES:
            raise ValueError(f"{ENV['mode']} must be one of {', '.join(MODES)}, got {mode!r}")
        return cls(step=int(raw_step), rank=int(environ.get(ENV["rank"], "0")), mode=mode)

    def maybe_fire(self, step: int, rank: int, restart_count: int) -> None:
        if self.step is None or step != self.step or rank != self.rank or restart_count != 0:
            return
        if self.mode == "kill":
            os.kill(os.getpid(), signal.SIGKILL)
        if self.mode == "hang":
            time.sleep(3600)
        raise InjectedFailure(f"test hook: rank {rank} fails at step {step} ({ENV['step']} is set)")
