"""Training from a prepared folder in-process (world size 1, gloo through a FileStore), and the SFT recipe
through the real CLI.

Covers: the built-in GPT learns from data.tokens (loss falls); a resumed run sees the same batches (same
losses as the uninterrupted run); validation on held-out windows (eval lines, metrics.jsonl records whose
perplexity is exp(eval loss), the lowest eval loss's checkpoint kept beside the newest `keep`); stage 3 with
the document mask and eval, the loader in a forked prefetch process giving the same run as on a thread.
Leaves out: several ranks (tests/dist/test_global_loss_norm.py), the loader's details (unit tests).
"""

from __future__ import annotations

import json
import math
import sys
from dataclasses import replace
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from _tiny_tokenizer import make_tokenizer  # noqa: E402

from zerolaunch.config import load_recipe  # noqa: E402
from zerolaunch.data.prepare import prepare_data  # noqa: E402
from zerolaunch.train.context import RunContext  # noqa: E402
from zerolaunch.train.loop import run_training  # noqa: E402

pytestmark = pytest.mark.e2e
WORDS = "the quick brown fox jumps over the lazy dog".split()


@pytest.fixture(scope="module")
def prepared(tmp_path_factory):
    root = tmp_path_factory.mktemp("data")
    tok = make_tokenizer(root / "tok")
    lines = [json.dumps({"text": " ".join(WORDS[i % 5 :] + WORDS[: i % 5])}) for i in range(400)]
    (root / "a.jsonl").write_text("\n".join(lines) + "\n")
    prepare_data([root / "a.jsonl"], tokenizer=tok, out=root / "text", progress=False)
    return root


def _recipe(
    run_dir,
    data_dir,
    steps=8,
    every=0,
    keep=3,
    eval_every=0,
    keep_best=None,
    lr=3e-3,
    stage=2,
    prefetch="auto",
):
    raw = {
        "model": {
            "builder": "zerolaunch.models.gpt:build",
            "args": {"size": "tiny", "vocab_size": 300, "seq_len": 32},
        },
        "data": {
            "builder": "zerolaunch.data.tokens:build",
            "args": {"path": str(data_dir), "seq_len": 32, "holdout": 0.1},
        },
        "train": {
            "steps": steps,
            "micro_batch_size": 4,
            "gradient_accumulation_steps": 2,
            "lr": lr,
            "lr_schedule": "constant",
            "log_every": 100,
            "run_dir": str(run_dir),
        },
        "checkpoint": {"every": every, "keep": keep},
        "deepspeed": {"zero_optimization": {"stage": stage}},
    }
    raw["data"]["prefetch"] = prefetch
    if eval_every:
        raw["data"]["eval"] = {"split": "eval"}
        raw["train"].update(eval_every=eval_every, eval_batches=3)
    if keep_best:
        raw["checkpoint"]["keep_best"] = keep_best
    return load_recipe(raw, world_size=1)


def _ctx(resume=None):
    return RunContext(rank=0, local_rank=0, world_size=1, device=torch.device("cpu"), resume=resume)


def test_trains_and_resumes_exactly(group, prepared, tmp_path):
    full = run_training(_recipe(tmp_path / "full", prepared / "text", every=4), _ctx())
    assert full[-1] < full[0] - 0.5
    resumed = run_training(
        _recipe(tmp_path / "resumed", prepared / "text"),
        _ctx(resume=str(tmp_path / "full/checkpoints/step_000004")),
    )
    assert resumed == full[4:]


def test_eval_records(group, prepared, tmp_path, capsys):
    recipe = _recipe(tmp_path / "run", prepared / "text", steps=8, eval_every=3)
    csv_dir = tmp_path / "csv"
    monitors = {"csv_monitor": {"dir": str(csv_dir)}}
    run_training(replace(recipe, train=replace(recipe.train, monitors=monitors)), _ctx())
    out = capsys.readouterr().out
    assert "eval_loss" in out and "eval_ppl" in out
    records = [json.loads(line) for line in (tmp_path / "run/metrics.jsonl").read_text().splitlines()]
    evals = [r for r in records if "eval_loss" in r]
    assert [r["step"] for r in evals] == [3, 6, 8]  # every 3 steps and after the last
    for r in evals:
        assert r["eval_perplexity"] == pytest.approx(math.exp(r["eval_loss"]))
    assert evals[-1]["eval_loss"] < evals[0]["eval_loss"]
    rows = (csv_dir / "Train_Samples_eval_loss.csv").read_text().splitlines()
    assert [float(r.split(",")[1]) for r in rows[1:]] == pytest.approx([r["eval_loss"] for r in evals])
    assert (csv_dir / "Train_Samples_eval_perplexity.csv").is_file()


def test_keep_best_keeps_the_lowest_eval_beside_the_newest(group, prepared, tmp_path, monkeypatch):
    from zerolaunch.train.evaluate import Evaluator

    scripted = iter([3.0, 1.0, 2.0, 4.0])  # evaluations at steps 2, 4, 6, 8: the best is step 4's
    monkeypatch.setattr(Evaluator, "run", lambda self: (lambda v: (v, math.exp(v)))(next(scripted)))
    run_training(
        _recipe(
            tmp_path / "run", prepared / "text", steps=8, every=2, keep=1, eval_every=2, keep_best="eval_loss"
        ),
        _ctx(),
    )
    saved = json.loads((tmp_path / "run/checkpoints/best.json").read_text())
    assert saved == {"step": 4, "eval_loss": 1.0}
    kept = sorted(p.name for p in (tmp_path / "run/checkpoints").glob("step_*"))
    assert kept == ["step_000004", "step_000008"]


def test_stage3_and_a_prefetch_process(group, prepared, tmp_path):
    """The document mask through stage 3's gathered blocks, eval without gradients at stage 3, and the loader
    in a forked prefetch process (file descriptors shared with it): the same run as on a thread."""
    runs = {}
    for prefetch in ("thread", "process"):
        run_dir = tmp_path / prefetch
        losses = run_training(
            _recipe(run_dir, prepared / "text", steps=4, eval_every=2, stage=3, prefetch=prefetch), _ctx()
        )
        lines = (run_dir / "metrics.jsonl").read_text().splitlines()
        runs[prefetch] = (losses, [json.loads(x)["eval_loss"] for x in lines if "eval_loss" in x])
    assert runs["thread"] == runs["process"]
    losses, evals = runs["thread"]
    assert losses[-1] < losses[0] and len(evals) == 2 and evals[1] < evals[0]
