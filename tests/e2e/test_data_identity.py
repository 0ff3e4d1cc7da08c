"""A checkpoint records the identity of its training data; a resume on other data is refused, naming what
changed (old -> new), unless `data.allow_change: true`, which metrics.jsonl then notes at the resumed step.

One run trains on a prepared folder through the CLI (module fixture); the resumes are the CLI (a refusal in
the launcher's pre-flight, an allowed change at another world size), the pre-flight check in-process (each
kind of change), and the worker's own check (the loop in-process, no pre-flight). Leaves out: the identity's
fields one by one for every builder (data/identity.py is small), stage 3 (the identity holds no engine state).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from _tiny_tokenizer import make_tokenizer  # noqa: E402

from zerolaunch.config import load_recipe  # noqa: E402
from zerolaunch.config.errors import UserError  # noqa: E402
from zerolaunch.data.prepare import prepare_data  # noqa: E402
from zerolaunch.launch.preflight import check_data_unchanged  # noqa: E402
from zerolaunch.train.context import RunContext  # noqa: E402
from zerolaunch.train.loop import run_training  # noqa: E402

pytestmark = pytest.mark.e2e
REPO = Path(__file__).resolve().parents[2]
WORDS = "the quick brown fox jumps over the lazy dog".split()
RECIPE = """\
model:
  builder: zerolaunch.models.gpt:build
  args: {{size: tiny, vocab_size: 300, seq_len: 32}}
data:
  builder: zerolaunch.data.tokens:build
  args: {{path: {path}, seq_len: 32}}
train: {{steps: 4, micro_batch_size: 2, lr: 1.0e-3, seed: 7, log_every: 1}}
checkpoint: {{every: 2}}
"""


def _corpus(path: Path, shift: int) -> Path:
    lines = [json.dumps({"text": " ".join(WORDS[(i + shift) % 7 :] + WORDS[:3])}) for i in range(300)]
    path.write_text("\n".join(lines) + "\n")
    return path


def _train(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    env = dict(os.environ, OMP_NUM_THREADS="1", COLUMNS="220")
    env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
    cmd = [sys.executable, "-m", "zerolaunch", "train", *map(str, args)]
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A run of 4 steps on a prepared folder, checkpoints at steps 2 and 4: (root, recipe, run dir)."""
    root = tmp_path_factory.mktemp("identity")
    tok = make_tokenizer(root / "tok")
    prepare_data([_corpus(root / "a.jsonl", 0)], tokenizer=tok, out=root / "data", progress=False)
    recipe = root / "r.yaml"
    recipe.write_text(RECIPE.format(path=root / "data"))
    proc = _train(recipe, "--cpu", "1", "--run-dir", root / "run")
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
    return root, recipe, root / "run"


def _copy_run(trained, tmp_path) -> Path:
    run = tmp_path / "run"
    shutil.copytree(trained[2], run)
    return run


def test_a_resume_with_another_seed_is_refused_before_any_worker(trained, tmp_path):
    root, recipe, _ = trained
    run = _copy_run(trained, tmp_path)
    proc = _train(
        recipe,
        "--cpu",
        "1",
        "--run-dir",
        run,
        "--resume",
        "auto",
        "--set",
        "train.steps=6",
        "--set",
        "train.seed=8",
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode == 2, out[-3000:]
    assert "Traceback" not in out and "launching" not in out
    assert "train.seed 7 -> 8" in out and "allow_change" in out and "step 4" in out
    steps = [json.loads(line)["step"] for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert steps == [1, 2, 3, 4]  # nothing of the run was touched


def test_an_allowed_change_at_another_world_size_is_noted_in_metrics(trained, tmp_path):
    root, recipe, _ = trained
    run = _copy_run(trained, tmp_path)
    allowed = tmp_path / "allowed.yaml"
    text = recipe.read_text().replace("  args: {path", "  allow_change: true\n  args: {path")
    allowed.write_text(text.replace("seq_len: 32}\ntrain", "seq_len: 16}\ntrain"))
    proc = _train(allowed, "--cpu", "2", "--run-dir", run, "--resume", "auto", "--set", "train.steps=6")
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-3000:]
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    events = [r for r in records if r.get("event") == "data_changed"]
    assert events == [
        {"step": 4, "event": "data_changed", "changes": {"data.args.seq_len": {"old": 32, "new": 16}}}
    ]
    assert [r["step"] for r in records if "loss" in r] == [1, 2, 3, 4, 5, 6]
    assert "resumed on other data" in out and "data.args.seq_len 32 -> 16" in out


def _preflight(root: Path, checkpoint: Path, data: Path, **sets):
    overrides = [f"data.args.path={data}"] + [f"{k}={v}" for k, v in sets.items()]
    recipe = load_recipe(root / "r.yaml", overrides=overrides, world_size=2)
    check_data_unchanged(recipe, str(checkpoint), "r.yaml")


def test_preflight_names_each_kind_of_change(trained, tmp_path):
    """Runs last of the module's CLI users: it prepares the trained run's folder again (and restores it)."""
    root, _, run = trained
    ckpt = run / "checkpoints" / "step_000002"
    _preflight(root, ckpt, root / "data")  # the same data, at another world size: accepted
    cases = [
        ({"train.seed": 9}, "train.seed 7 -> 9"),
        ({"data.args.seq_len": 16}, "data.args.seq_len 32 -> 16"),
    ]
    for sets, needle in cases:
        with pytest.raises(UserError) as err:
            _preflight(root, ckpt, root / "data", **sets)
        assert needle in str(err.value) and "step 2" in str(err.value)
    moved = tmp_path / "copy"
    shutil.copytree(root / "data", moved)
    with pytest.raises(UserError) as err:  # the same bytes elsewhere
        _preflight(root, ckpt, moved)
    assert "data.args.path" in str(err.value) and "manifest" not in str(err.value)
    _preflight(root, ckpt, moved, **{"data.allow_change": "true", "train.seed": 9})
    # the checkpoint's own folder prepared again in place, from other text; then again from its own text
    data, tok = root / "data", root / "tok"
    try:
        prepare_data([_corpus(tmp_path / "b.jsonl", 3)], tokenizer=tok, out=data, force=True, progress=False)
        with pytest.raises(UserError) as err:
            _preflight(root, ckpt, data)
        assert "data.manifest_sha256" in str(err.value) and "data.args.path" not in str(err.value)
    finally:
        prepare_data([root / "a.jsonl"], tokenizer=tok, out=data, force=True, progress=False)
    _preflight(root, ckpt, data)  # prepare-data writes the same bytes again: the same identity


def test_the_worker_refuses_too_without_the_preflight(trained, group, tmp_path):
    root, _, run = trained
    recipe = load_recipe(
        root / "r.yaml", overrides=[f"train.run_dir={tmp_path / 'w'}", "train.seed=5"], world_size=1
    )
    ctx = RunContext(
        rank=0, local_rank=0, world_size=1, device=torch.device("cpu"), resume=str(run / "checkpoints")
    )
    with pytest.raises(UserError, match="train.seed 7 -> 5"):
        run_training(recipe, ctx)
