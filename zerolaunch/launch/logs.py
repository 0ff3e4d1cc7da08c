"""Per-rank log files under run_dir/logs, and which lines reach the terminal.

Every worker's stdout/stderr is written to `run_dir/logs/<run_id>_*/attempt_<k>/<local_rank>/{stdout,
stderr}.log` (torch's DefaultLogsSpecs). By default only global rank 0 is echoed to the terminal, without
a prefix (its lines are the run's progress); `--all-ranks` echoes every local rank, prefixed `[rank N] `.
`RunLogsSpecs` remembers each attempt's files, so the failure panel can point at the log of the rank that
failed.
"""

from __future__ import annotations

import sys
from pathlib import Path

from torch.distributed.elastic.multiprocessing import DefaultLogsSpecs, Std
from torch.distributed.elastic.multiprocessing.api import LogsDest
from torch.distributed.elastic.multiprocessing.tail_log import TailLog

ALL_RANKS_PREFIX = "[rank${rank}] "


class RunLogsSpecs(DefaultLogsSpecs):
    def __init__(
        self, log_dir: Path, *, all_ranks: bool, max_restarts: int = 0, rank0_stdout=None, announcer=None
    ):
        log_dir.mkdir(parents=True, exist_ok=True)
        # With --all-ranks torch's own tee prints every rank (prefixed through the agent's template);
        # otherwise nothing is tee'd and rank 0 is echoed by our TailLog, which can print without a prefix.
        super().__init__(log_dir=str(log_dir), redirects=Std.ALL, tee=Std.ALL if all_ranks else Std.NONE)
        self.all_ranks = all_ranks
        self.max_restarts = max_restarts
        self.attempts: list[LogsDest] = []
        self.global_ranks: dict[int, int] = {}
        """local rank -> global rank of the latest attempt's workers on this node."""
        self._tails: list[TailLog] = []
        self._rank0_stdout = rank0_stdout
        """Where rank 0's stdout is echoed: sys.stdout, or ConsoleLines while a progress bar owns the terminal."""
        self._announcer = announcer
        """restarts.RestartAnnouncer: says which rank failed and where the restart resumes."""

    def reify(self, envs: dict[int, dict[str, str]]) -> LogsDest:
        dest = super().reify(envs)
        self._stop_tails()
        if self.attempts:
            # reify runs once per attempt: a second call means the agent is restarting a failed group
            if self._announcer is not None:
                self._announcer.announce(len(self.attempts) + 1)
            print(
                f"zerolaunch: logs of the failed attempt: "
                f"{Path(self.attempts[-1].error_files[0]).parent.parent}",
                file=sys.stderr,
                flush=True,
            )
        self.attempts.append(dest)
        self.global_ranks = {local_rank: int(env["RANK"]) for local_rank, env in envs.items()}
        if not self.all_ranks:
            for local_rank, env in envs.items():
                if env.get("RANK") == "0":
                    self._tails = [
                        TailLog(
                            "rank0",
                            {local_rank: dest.stdouts[local_rank]},
                            self._rank0_stdout or sys.stdout,
                            {local_rank: ""},
                        ),
                        TailLog(
                            "rank0", {local_rank: dest.stderrs[local_rank]}, sys.stderr, {local_rank: ""}
                        ),
                    ]
                    for tail in self._tails:
                        tail.start()
        return dest

    def _stop_tails(self) -> None:
        for tail in self._tails:
            tail.stop()  # drains the file to its end before returning
        self._tails = []

    def close(self) -> None:
        self._stop_tails()

    def log_files(self, local_rank: int) -> tuple[str | None, str | None]:
        """(stdout, stderr) log of `local_rank` in the latest attempt."""
        if not self.attempts:
            return None, None
        dest = self.attempts[-1]
        return dest.stdouts.get(local_rank), dest.stderrs.get(local_rank)


class ConsoleLines:
    """A write-only text stream that hands whole lines to a rich Console.

    While a live progress bar is drawn, text written straight to the terminal lands in the middle of the bar;
    `Console.print` puts each line above it instead.
    """

    def __init__(self, console):
        self._console = console
        self._partial = ""

    def write(self, text: str) -> int:
        *lines, self._partial = (self._partial + text).split("\n")
        for line in lines:
            self._console.print(line, markup=False, highlight=False, soft_wrap=True)
        return len(text)

    def flush(self) -> None:
        pass
