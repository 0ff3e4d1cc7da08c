"""The root cause of a failed run, as one short panel.

torchelastic reports a failed worker group as a ChildFailedError holding one ProcessFailure per failed
rank. The first failure by timestamp is the root cause, except for the ranks that only show symptoms of
another's death: an exception saying a peer closed the connection, or a SIGTERM / SIGINT (the agent's own
"stop" to the survivors). A killed rank's timestamp is when the agent noticed (it wrote no error file), so
without this rule the peer that lost it, which raised a moment earlier, would be blamed. Ties (timestamps
are whole seconds) go to a rank with an error file, since a rank that raised explains more. A rank that
exited 0 while the others failed on a lost peer or a timeout (an entrypoint script that returned early) is
named instead (`early_exit`): torch records no failure for it. The panel says which rank, its exit code or
signal, the exception line, the last lines of the traceback (from the `@record` error file, else the tail of
the rank's stderr log) and the log path.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from zerolaunch.util.atomic import writer_unique_name
from zerolaunch.util.disk_errors import disk_error, is_disk_error

TRACEBACK_LINES = 8
PEER_LOST = (
    "connection reset by peer",
    "connection closed by peer",
    "broken pipe",
    "remote process exited",
    "socket closed",
    "nccl communicator was aborted",
)
"""Exception text of a rank that lost a peer (gloo / NCCL wording): a consequence, not a cause."""
SECONDARY_SIGNALS = ("SIGTERM", "SIGINT")
SECONDARY_TEXT = ("failed on another rank",)
"""A rank that stopped because another one failed (checkpoint/save.py's agreement): not the cause."""


@dataclass(frozen=True)
class FailureReport:
    rank: int
    exit_text: str
    """"exit code 1" or "signal SIGKILL"."""
    exception: str
    """The exception line, or what is known instead."""
    traceback_tail: list[str]
    log_path: str | None
    hint: str | None = None
    """What the failure suggests beyond itself (e.g. which rank probably hung)."""


def root_cause(failures: dict) -> tuple[int, object]:
    """(global rank, ProcessFailure) of the first failure."""

    def key(item):
        rank, f = item
        has_file = os.path.isfile(getattr(f, "error_file", "") or "")
        return (is_secondary(f), f.timestamp, not has_file, rank)

    return min(failures.items(), key=key)


def is_secondary(failure) -> bool:
    """True when the failure looks like a reaction to another rank's failure."""
    message = str(failure.message).lower()
    if any(words in message for words in PEER_LOST + SECONDARY_TEXT):
        return True
    return failure.exitcode < 0 and failure.signal_name() in SECONDARY_SIGNALS


def _tail(path: str | None, n: int) -> list[str]:
    if not path or not os.path.isfile(path):
        return []
    with open(path, errors="replace") as fp:
        lines = [line.rstrip("\n") for line in fp.readlines()]
    return [line for line in lines if line.strip()][-n:]


def timeout_hint(
    report: FailureReport, failed: set[int], ranks_here: set[int], timeout_seconds: float
) -> str | None:
    """For a collective timeout: name the ranks on this node that never failed on their own (hung)."""
    if not is_timeout(report):
        return None
    quiet = sorted(ranks_here - failed)
    who = (
        f"rank(s) {', '.join(map(str, quiet))} did not fail on their own: probably hung (or far slower)"
        if quiet
        else "the stuck rank is on another node or failed too"
    )
    return f"a collective timed out after --timeout {timeout_seconds:g} s: {who}; see their logs"


def is_timeout(report: FailureReport) -> bool:
    return "timed out" in report.exception.lower() or "timeout" in report.exception.lower()


def early_exit(report: FailureReport, exited_ok: list[int], log_path_of) -> FailureReport:
    """The report to show when ranks of this node exited 0 while the others failed, else `report`.

    A rank whose script returned (or called sys.exit(0)) before the others finished leaves them in a
    collective that loses its peer ("Connection closed by peer") or times out: the rank that left is the
    cause, though torch records no failure for an exit code of 0. A root cause that raised on its own (not
    a peer lost, not a timeout) stays the root cause. log_path_of(rank) -> that rank's stderr log."""
    if not exited_ok or not (report.exception and (_lost_a_peer(report) or is_timeout(report))):
        return report
    rank = exited_ok[0]
    log_path = log_path_of(rank)
    return FailureReport(
        rank=rank,
        exit_text="exit code 0 before the other ranks finished",
        exception=(
            f"rank {rank} ended (its script returned or exited 0) while the other ranks were still running; "
            f"rank {report.rank} then failed waiting for it in a collective: {report.exception.splitlines()[0]}"
        ),
        traceback_tail=_tail(log_path, TRACEBACK_LINES),
        log_path=log_path,
        hint=(
            "every rank must run the same steps and collectives to the end: look for an early return, "
            f"sys.exit or a shorter loop on rank {rank}"
        ),
    )


def _lost_a_peer(report: FailureReport) -> bool:
    return any(words in report.exception.lower() for words in PEER_LOST)


def describe(rank: int, failure, log_path: str | None) -> FailureReport:
    if failure.exitcode < 0:
        exit_text = f"signal {failure.signal_name()}"
    else:
        exit_text = f"exit code {failure.exitcode}"
    message = failure.message
    tail: list[str] = []
    if isinstance(message, dict):
        exception = str(message.get("message", "")).strip()
        stack = str(message.get("extraInfo", {}).get("py_callstack", ""))
        lines = [line for line in stack.splitlines() if line.strip()]
        if lines and exception.startswith(lines[-1].strip()):
            lines = lines[:-1]  # the traceback's last line is the exception, already shown
        tail = lines[-TRACEBACK_LINES:]
    else:
        log_tail = _tail(log_path, TRACEBACK_LINES)
        exception = log_tail[-1] if log_tail else str(message)
        if failure.exitcode < 0:
            exception = (
                f"killed by {failure.signal_name()} (no Python exception: the process did not get to raise)"
            )
        tail = log_tail
    return FailureReport(rank, exit_text, exception or "(no message)", tail, log_path)


def render(report: FailureReport, *, restarts_used: int | None = None):
    from rich.panel import Panel
    from rich.text import Text

    text = Text()
    text.append(f"rank {report.rank} failed: {report.exit_text}\n", style="bold")
    text.append(report.exception + "\n", style="red")
    if report.traceback_tail:
        text.append("\n")
        for line in report.traceback_tail:
            text.append(line + "\n", style="dim")
    if report.hint:
        text.append(f"\n{report.hint}\n", style="yellow")
    if report.log_path:
        text.append(f"\nfull log: {Path(report.log_path)}")
    if restarts_used:
        text.append(f"\n(after {restarts_used} restart(s))")
    return Panel(text, title="training failed", border_style="red", expand=False)


def disk_problem(folders) -> Exception | None:
    """A DiskError when one of `folders` cannot take a small write (full, read-only, no permission),
    else None: the cause to name when the agent failed on a worker's unreadable error record."""
    for folder in folders:
        probe = Path(folder) / writer_unique_name("zerolaunch-space-test")
        try:
            with open(probe, "wb") as f:
                f.write(b"\0" * 65536)
                f.flush()
                os.fsync(f.fileno())
        except OSError as err:
            if is_disk_error(err):
                return disk_error(
                    err,
                    path=folder,
                    what="into",
                    fix="point --run-dir (or checkpoint.dir) at another disk",
                    after="A worker's error record could not be written there either, so its own message is lost.",
                )
        finally:
            try:
                probe.unlink()
            except OSError:
                pass
    return None
