"""The launcher's restart line (launch/restarts.py): which rank, how it ended, the last logged step and
the checkpoint the restarted workers load. Fake failures stand in for torch's ProcessFailure; the real
agent path is tests/e2e/test_train_restart.py."""

import io
import json
from dataclasses import dataclass

from rich.console import Console

from zerolaunch.launch.restarts import RestartAnnouncer


@dataclass
class FakeFailure:
    exitcode: int
    timestamp: int
    message: str = ""
    error_file: str = ""

    def signal_name(self) -> str:
        return {-9: "SIGKILL", -15: "SIGTERM"}.get(self.exitcode, "?")


def announcer(tmp_path, resume=None, max_restarts=2):
    buf = io.StringIO()
    console = Console(file=buf, width=40, color_system=None)
    a = RestartAnnouncer(
        console,
        max_restarts=max_restarts,
        metrics_path=tmp_path / "metrics.jsonl",
        checkpoint_root=tmp_path / "ckpt",
        resume=resume,
    )
    return a, buf


def write_checkpoint(root, step):
    folder = root / f"step_{step:06d}"
    folder.mkdir(parents=True)
    (folder / "manifest.json").write_text("{}")
    (root / "latest").write_text(folder.name)


def test_names_the_killed_rank_not_the_one_the_agent_stopped(tmp_path):
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps({"step": s}) + "\n" for s in (1, 2, 3, 4)))
    write_checkpoint(tmp_path / "ckpt", 4)
    a, buf = announcer(tmp_path)
    a.note_failures({0: FakeFailure(-15, 100), 3: FakeFailure(-9, 101)})
    a.announce(2)
    # soft-wrapped: one line even on a 40-column console
    assert buf.getvalue() == "attempt 2/3: rank 3 died (SIGKILL) after step 4; resuming from step_000004\n"


def test_exit_code_no_metrics_no_checkpoint(tmp_path):
    a, _ = announcer(tmp_path, max_restarts=1)
    a.note_failures({1: FakeFailure(1, 5)})
    assert a.message(2) == (
        "attempt 2/2: rank 1 failed (exit code 1) before its first step; "
        "no checkpoint yet: starting over from step 0"
    )


def test_explicit_resume_path_and_unknown_rank(tmp_path):
    (tmp_path / "metrics.jsonl").write_text('{"step": 7}\n{"step": 8, "lo')  # torn last line
    a, _ = announcer(tmp_path, resume="/ckpts/step_000005")
    assert a.message(3) == (
        "attempt 3/3: the worker group failed after step 7; resuming from /ckpts/step_000005 (--resume)"
    )
