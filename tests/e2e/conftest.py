"""Helpers of the `zerolaunch train` end-to-end tests: a tiny recipe, the CLI run as a subprocess (always
with a timeout), metrics.jsonl reading and process lookups for the signal tests. The one-rank `group` fixture
of the tests that run the training loop in this process is tests/conftest.py's."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from _helpers import tiny_gpt_recipe, write_recipe

REPO = Path(__file__).resolve().parents[2]

FAULTY_MODEL = Path(__file__).resolve().parent / "_faulty_model.py"
"""The tiny GPT with a fault on one rank at one step (the failure and restart tests' model builder)."""


@pytest.fixture
def tiny_recipe(tmp_path):
    """Write the tiny recipe with `steps` / checkpoint `every`; returns its path.

    fault: {"step": 3, "rank": 1, "mode": "raise" | "kill" | "hang"} builds the model with _faulty_model.py,
    which fails that way on that rank at the start of that step, on the first attempt only."""

    def write(steps: int = 10, every: int = 0, fault: dict | None = None) -> Path:
        recipe = tiny_gpt_recipe(
            train={
                "steps": steps,
                "micro_batch_size": 4,
                "lr": 1.0e-2,
                "lr_schedule": "constant",
                "seed": 1234,
                "log_every": 1,
            },
            checkpoint={"every": every},
            deepspeed={"zero_optimization": {"stage": 2}},
        )
        name = f"tiny-{steps}-{every}"
        if fault is not None:
            recipe["model"]["builder"] = f"{FAULTY_MODEL}:build"
            recipe["model"]["args"].update({f"fault_{key}": value for key, value in fault.items()})
            name += "-fault"
        return write_recipe(tmp_path / f"{name}.yaml", recipe)

    return write


class TrainCLI:
    """The CLI and process helpers the e2e tests share (a fixture: test modules do not import conftest)."""

    @staticmethod
    def env(**extra: str) -> dict[str, str]:
        env = dict(os.environ)
        env.update(
            OMP_NUM_THREADS="1", COLUMNS="220", PYTHONPATH=str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
        )
        env.update(extra)
        return env

    @staticmethod
    def cmd(*args: str) -> list[str]:
        return [sys.executable, "-m", "zerolaunch", "train", *map(str, args)]

    @staticmethod
    def run(
        *args: str, timeout: float = 120, cwd: Path | None = None, **env: str
    ) -> subprocess.CompletedProcess:
        return subprocess.run(
            TrainCLI.cmd(*args),
            cwd=cwd,
            env=TrainCLI.env(**env),
            capture_output=True,
            text=True,
            timeout=timeout,
        )

    @staticmethod
    def popen(
        *args: str, stdout=subprocess.PIPE, env: dict[str, str] | None = None, **kwargs
    ) -> subprocess.Popen:
        """`zerolaunch train ARGS` in the background, stderr merged into stdout (a pipe, or a file: a
        launcher whose full pipe nobody reads stalls). The caller kills it (`stop`) when done."""
        return subprocess.Popen(
            TrainCLI.cmd(*args),
            env=TrainCLI.env() if env is None else env,
            stdout=stdout,
            stderr=subprocess.STDOUT,
            text=True,
            **kwargs,
        )

    @staticmethod
    def stop(proc: subprocess.Popen) -> None:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=10)

    @staticmethod
    def wait_for_a_step(proc: subprocess.Popen, run_dir: Path, timeout: float = 150) -> None:
        """Until metrics.jsonl has a row; fails with the output if `proc` (stdout a pipe) exits first."""
        deadline = time.monotonic() + timeout
        while not (run_dir / "metrics.jsonl").is_file() or not TrainCLI.metrics(run_dir):
            assert proc.poll() is None, proc.stdout.read()
            assert time.monotonic() < deadline, "training never started"
            time.sleep(0.2)

    @staticmethod
    def survivors(pids: list[int], within: float, poll: float = 0.1) -> list[int]:
        """The pids still alive after waiting up to `within` seconds for all of them to exit."""
        deadline = time.monotonic() + within
        while any(TrainCLI.alive(pid) for pid in pids) and time.monotonic() < deadline:
            time.sleep(poll)
        return [pid for pid in pids if TrainCLI.alive(pid)]

    @staticmethod
    def metrics(run_dir: Path) -> list[dict]:
        path = run_dir / "metrics.jsonl"
        return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]

    @staticmethod
    def descendants(pid: int) -> list[int]:
        """Live descendant pids of `pid`, from /proc (Linux)."""
        children: dict[int, list[int]] = {}
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            try:
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            children.setdefault(int(fields[1]), []).append(int(entry.name))
        out, todo = [], [pid]
        while todo:
            for child in children.get(todo.pop(), []):
                out.append(child)
                todo.append(child)
        return out

    @staticmethod
    def alive(pid: int) -> bool:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            return False
        return state != "Z"


@pytest.fixture
def cli() -> TrainCLI:
    return TrainCLI()
