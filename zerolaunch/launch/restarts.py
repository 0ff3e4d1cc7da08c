"""Announcing an elastic restart on the launcher's console, in one line:

    attempt 2/3: rank 1 died (SIGKILL) after step 3; resuming from step_000002

torchelastic restarts a failed worker group inside its agent (`SimpleElasticAgent._invoke_run`) and tells
nobody which rank failed or how. This module owns that line: which rank (failures.root_cause over what the
agent saw), how it ended, the last step metrics.jsonl holds, and the checkpoint the restarted workers load
(the worker's own rule: `--resume PATH` if given, else the checkpoint root's `latest`). It does not restart
anything; the agent does, and RunLogsSpecs.reify (logs.py), which runs once per attempt, calls `announce`.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from zerolaunch.launch import failures as failure_rules
from zerolaunch.report.metrics import read_metrics


class RestartAnnouncer:
    def __init__(
        self, console, *, max_restarts: int, metrics_path: Path, checkpoint_root: Path, resume: str | None
    ):
        self.console = console
        self.max_restarts = max_restarts
        self.metrics_path = Path(metrics_path)
        self.checkpoint_root = Path(checkpoint_root)
        self.resume = resume
        self._failures: dict = {}

    def note_failures(self, failures: dict) -> None:
        """The agent's view of a failed attempt: {global rank: ProcessFailure} of the ranks that ended."""
        self._failures = dict(failures)

    def message(self, attempt: int) -> str:
        """The line for the start of `attempt` (1-based; attempt 2 is the first restart)."""
        if self._failures:
            rank, failure = failure_rules.root_cause(self._failures)
            if failure.exitcode < 0:
                who = f"rank {rank} died ({failure.signal_name()})"
            else:
                who = f"rank {rank} failed (exit code {failure.exitcode})"
        else:
            who = "the worker group failed"  # on another node: this agent saw no failure of its own
        last = self._last_step()
        when = f"after step {last}" if last else "before its first step"
        return f"attempt {attempt}/{self.max_restarts + 1}: {who} {when}; {self._resume_text()}"

    def announce(self, attempt: int) -> None:
        self.console.print(self.message(attempt), markup=False, highlight=False, soft_wrap=True)
        self._failures = {}

    def _last_step(self) -> int | None:
        try:
            records = read_metrics(self.metrics_path)
        except (OSError, ValueError):
            return None
        steps = [r["step"] for r in records if isinstance(r, dict) and isinstance(r.get("step"), int)]
        return steps[-1] if steps else None

    def _resume_text(self) -> str:
        if self.resume and self.resume != "auto":
            return f"resuming from {self.resume} (--resume)"
        # lazy: it imports torch, which the launcher does not need until here
        from zerolaunch.checkpoint import CheckpointError, latest_checkpoint

        try:
            found = latest_checkpoint(self.checkpoint_root) if self.checkpoint_root.is_dir() else None
        except CheckpointError:
            return "its `latest` names no complete checkpoint (the restarted workers will say which)"
        if found is None:
            return "no checkpoint yet: starting over from step 0"
        return f"resuming from {found.name}"


@contextmanager
def failures_noted(announcer: RestartAnnouncer) -> Iterator[None]:
    """While open, the agent elastic_launch builds hands each failed attempt's failures to `announcer`.

    elastic_launch constructs its agent from `torch.distributed.launcher.api.LocalElasticAgent` and offers
    no other way to see a failed attempt before it restarts, so that name points at a subclass here that
    only watches `_monitor_workers`' result (a private method; were it gone, the line names no rank).
    """
    import torch.distributed.launcher.api as launcher_api

    base = launcher_api.LocalElasticAgent

    class WatchedAgent(base):
        def _monitor_workers(self, worker_group):
            result = super()._monitor_workers(worker_group)
            if result.is_failed():
                announcer.note_failures(result.failures)
            return result

    launcher_api.LocalElasticAgent = WatchedAgent
    try:
        yield
    finally:
        launcher_api.LocalElasticAgent = base
