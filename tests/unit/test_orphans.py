"""A process that armed launch/orphans.py `die_with_parent` ends within 10 s of a SIGKILL of its parent
(PDEATHSIG for zerolaunch's own workers, and the watchdog that notices the re-parenting, alone for a script);
one that did not arm it lives on; a call with an `expected_parent` that is already gone exits at once.

Plain Python processes (no torch): a middle process starts the child and is killed. Leaves out: the real
launchers (tests/e2e/test_hangs_orphans.py: torchrun; test_reliability_launcher.py: zerolaunch train).
"""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

CHILD = """
import os, sys, time
from zerolaunch.launch import orphans
if sys.argv[1] == "launcher":  # zerolaunch train's worker: PDEATHSIG and the watchdog
    orphans.die_with_parent(expected_parent=os.getppid())
elif sys.argv[1] == "launcher-no-prctl":  # the same where prctl cannot be armed: the watchdog alone
    orphans._arm_pdeathsig = lambda: None
    orphans.die_with_parent(expected_parent=os.getppid())
elif sys.argv[1] == "script":  # a script under torchrun / accelerate launch: the watchdog
    orphans.die_with_parent()
open(sys.argv[2], "w").write(str(os.getpid()))
time.sleep(120)
"""
MIDDLE = """
import subprocess, sys, time
subprocess.Popen([sys.executable, "-c", sys.argv[1], *sys.argv[2:]])
time.sleep(120)
"""


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def _orphan_survives(tmp_path, how: str) -> bool:
    pid_file = tmp_path / f"child-{how}"
    env = dict(os.environ, PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    middle = subprocess.Popen([sys.executable, "-c", MIDDLE, CHILD, how, str(pid_file)], env=env)
    child = None
    try:
        deadline = time.monotonic() + 60
        while not (pid_file.is_file() and pid_file.read_text()):
            assert time.monotonic() < deadline and middle.poll() is None, "the child never started"
            time.sleep(0.05)
        child = int(pid_file.read_text())
        middle.kill()
        middle.wait(timeout=10)
        deadline = time.monotonic() + 10
        while _alive(child) and time.monotonic() < deadline:
            time.sleep(0.1)
        return _alive(child)
    finally:
        if middle.poll() is None:
            middle.kill()
        if child is not None and _alive(child):
            os.kill(child, signal.SIGKILL)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc and prctl are Linux's")
@pytest.mark.parametrize("how", ["launcher", "launcher-no-prctl", "script"])
def test_an_armed_process_ends_within_10_s_of_its_parents_kill(tmp_path, how):
    assert not _orphan_survives(tmp_path, how)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc and prctl are Linux's")
def test_an_unarmed_process_outlives_its_parent(tmp_path):
    assert _orphan_survives(tmp_path, "none")  # what the guard is for


def test_a_parent_that_is_already_gone_exits_at_once():
    code = "from zerolaunch.launch import orphans; orphans.die_with_parent(expected_parent=1); print('alive')"
    env = dict(os.environ, PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1 and "alive" not in proc.stdout
