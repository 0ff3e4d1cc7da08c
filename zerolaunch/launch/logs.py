"""Per-rank log files under run_dir/logs, and which lines reach the terminal.

Every worker's stdout/stderr is written to `run_dir/logs/<run_id>_*/attempt_<k>/<local_rank>/{stdout,
stderr}.log` (torch's DefaultLogsSpecs). By default only global rank 0 is echoed to the terminal, without
a prefix (its lines are the run's progress); `--all-ranks` echoes every local rank, prefixed `[rank N] `.
`RunLogsSpecs` remembers each attempt's files, so the failure panel can point at the log of the rank that
failed.

Each worker's error record (torchelastic's error.json, where `@record` writes the exception the launcher
shows) is first written to a folder of the system's temp dir, and copied next to the rank's logs at the
end: on a full or read-only run dir the record would otherwise be empty, and torch's agent dies reading
it (a JSONDecodeError instead of the worker's own message).

Rank 0's stderr echo leaves out the traceback a dying worker prints (its lines carry the `[rank0]: `
prefix of torch's exception hook, and worker.py prints its own that way too): the failure panel shows it
once, and the log file keeps it whole.
"""

from __future__ import annotations

import os
import re
import shutil
import sys
import tempfile
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
        self._error_dir: str | None = None
        self._error_copies: dict[str, str] = {}
        """temp error file -> where it is copied (its rank's log folder)."""

    def reify(self, envs: dict[int, dict[str, str]]) -> LogsDest:
        dest = super().reify(envs)
        self._stop_tails()
        self._move_error_files(dest, envs)
        if self.attempts:
            # reify runs once per attempt: a second call means the agent is restarting a failed group
            if self._announcer is not None:
                self._announcer.announce(len(self.attempts) + 1)
            print(
                f"zerolaunch: logs of the failed attempt: "
                f"{Path(next(iter(self.attempts[-1].stderrs.values()))).parent.parent}",
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
                            "rank0",
                            {local_rank: dest.stderrs[local_rank]},
                            WithoutDyingTraceback(sys.stderr),
                            {local_rank: ""},
                        ),
                    ]
                    for tail in self._tails:
                        tail.start()
        return dest

    def _stop_tails(self) -> None:
        for tail in self._tails:
            tail.stop()  # drains the file to its end before returning
        self._tails = []

    def _move_error_files(self, dest: LogsDest, envs: dict[int, dict[str, str]]) -> None:
        if self._error_dir is None:
            _remove_stale_error_dirs()
            self._error_dir = tempfile.mkdtemp(prefix=f"{ERROR_DIR_PREFIX}{os.getpid()}-")
        attempt = Path(self._error_dir) / f"attempt_{len(self.attempts)}"
        for local_rank, original in dest.error_files.items():
            if not original or original == os.devnull:
                continue
            folder = attempt / str(local_rank)
            folder.mkdir(parents=True, exist_ok=True)
            moved = str(folder / "error.json")
            dest.error_files[local_rank] = moved
            envs[local_rank]["TORCHELASTIC_ERROR_FILE"] = moved
            self._error_copies[moved] = original

    def close(self) -> None:
        """Stop echoing; copy the error records next to the logs (where the disk lets us). Idempotent."""
        self._stop_tails()
        for moved, original in self._error_copies.items():
            if os.path.isfile(moved) and not os.path.isfile(original):
                try:
                    shutil.copyfile(moved, original)
                except OSError:
                    pass  # the run dir's disk is full or read-only: the launcher says so

    def remove_error_files(self) -> None:
        """After the failure was reported: the temp copies are no longer needed."""
        if self._error_dir is not None:
            shutil.rmtree(self._error_dir, ignore_errors=True)
            self._error_dir = None

    def attempt_dir(self) -> Path | None:
        """The latest attempt's log folder (attempt_<k>/, one folder per local rank inside)."""
        if not self.attempts:
            return None
        return Path(next(iter(self.attempts[-1].stderrs.values()))).parent.parent

    def log_files(self, local_rank: int) -> tuple[str | None, str | None]:
        """(stdout, stderr) log of `local_rank` in the latest attempt."""
        if not self.attempts:
            return None, None
        dest = self.attempts[-1]
        return dest.stdouts.get(local_rank), dest.stderrs.get(local_rank)


ERROR_DIR_PREFIX = "zerolaunch-errors-"
"""The temp folders of the workers' error records: zerolaunch-errors-<launcher pid>-<random>."""


def _remove_stale_error_dirs() -> None:
    """Those of launchers that died without cleaning up (kill -9): their pid is gone."""
    for folder in Path(tempfile.gettempdir()).glob(f"{ERROR_DIR_PREFIX}*-*"):
        pid = folder.name[len(ERROR_DIR_PREFIX) :].split("-", 1)[0]
        if not pid.isdigit():
            continue
        try:
            os.kill(int(pid), 0)
        except ProcessLookupError:
            shutil.rmtree(folder, ignore_errors=True)
        except OSError:
            pass  # alive, another user's


DYING_TRACEBACK = re.compile(r"^\[rank\d+\]: ")
"""A line of the traceback a worker prints as it dies (torch's process-group exception hook's prefix)."""


class WithoutDyingTraceback:
    """A write-only text stream passing whole lines on, except a dying worker's traceback lines."""

    def __init__(self, out):
        self._out = out
        self._partial = ""

    def write(self, text: str) -> int:
        *lines, self._partial = (self._partial + text).split("\n")
        kept = [line + "\n" for line in lines if not DYING_TRACEBACK.match(line)]
        if kept:
            self._out.write("".join(kept))
            self._out.flush()
        return len(text)

    def flush(self) -> None:
        self._out.flush()


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
