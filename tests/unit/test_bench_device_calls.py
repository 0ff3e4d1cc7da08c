"""bench/device_calls.sh on the CPU: the commands each step would run on the device (DRY=1) name test files
that exist, rows and models their bench scripts know, and recipe overrides that estimate-memory accepts; an
unknown step is refused with exit 2 and the list of steps. Leaves out: running any step (they need a GPU)."""

from __future__ import annotations

import shlex
import subprocess
import sys
from pathlib import Path

import pytest
from _helpers import load_bench_script

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "bench" / "device_calls.sh"
STEPS = (
    "tests",
    "tax-resident",
    "tax-llama",
    "train-path",
    "longseq-gpt",
    "longseq-llama",
    "offload-peers",
    "offload-z3",
    "estimate-longseq",
)


def _dry(*steps: str) -> subprocess.CompletedProcess:
    env = {"PATH": "/usr/bin:/bin", "DRY": "1", "OUT": "/nonexistent"}
    return subprocess.run(["bash", str(SCRIPT), *steps], cwd=ROOT, env=env, capture_output=True, text=True)


@pytest.fixture(scope="module")
def planned() -> dict[str, list[str]]:
    """step name -> its command's words, for every step."""
    done = _dry("all")
    assert done.returncode == 0, done.stderr
    commands = {}
    for line in done.stdout.splitlines():
        name, _, command = line.partition(": ")
        commands[name] = shlex.split(command)
    return commands


def _flag(words: list[str], flag: str) -> str:
    return words[words.index(flag) + 1]


def test_every_step_plans_a_command(planned):
    estimates = {"estimate-ckpt", "estimate-ckpt-chunk", "estimate-ckpt-offload-chunk"}
    assert set(planned) == (set(STEPS) - {"estimate-longseq"}) | estimates


def test_the_cuda_test_files_exist(planned):
    files = [w for w in planned["tests"] if w.startswith("tests/")]
    assert len(files) >= 10
    missing = [f for f in files if not (ROOT / f).is_file()]
    assert not missing, missing


@pytest.mark.parametrize(
    ("script", "known"),
    [
        ("engine_tax", lambda m: m.ROWS + m.BUILTIN_ROWS),
        ("longseq", lambda m: m.ROWS),
        ("offload", lambda m: m.ROWS),
    ],
)
def test_rows_and_models_are_the_scripts_own(planned, script, known):
    module = load_bench_script(script)
    used = [words for words in planned.values() if f"bench/{script}.py" in words]
    assert used
    for words in used:
        unknown = set(_flag(words, "--rows").split(",")) - set(known(module))
        assert not unknown, (words, unknown)
        if "--models" in words:
            assert set(_flag(words, "--models").split(",")) <= set(module.MODELS), words


def test_estimate_overrides_are_accepted_by_estimate_memory(planned):
    for name, words in planned.items():
        if not name.startswith("estimate-"):
            continue
        sets = [w for i, w in enumerate(words) if i and words[i - 1] == "--set"]
        cmd = [sys.executable, "-m", "zerolaunch", "estimate-memory", _flag(words, "--recipe"), "--json"]
        cmd += ["--set", "deepspeed.zero_optimization.stage=3"]
        for kv in sets:
            cmd += ["--set", kv]
        done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, (name, done.stdout[-800:], done.stderr[-800:])


def test_an_unknown_step_is_refused_with_the_list():
    done = _dry("tests", "longseq")
    assert done.returncode == 2
    assert "unknown step 'longseq'" in done.stderr and "longseq-gpt" in done.stderr
    assert done.stdout == ""
