"""`zerolaunch train recipes/hf-tiny-llama.yaml --cpu 2`: an HF Llama trained by the real CLI on 2 gloo ranks.

Covers: the HF builder + hf_text data through the built-in loop (loss falls), and that the run's checkpoint
becomes a directory `AutoModelForCausalLM.from_pretrained` loads with the logits of the trained weights (via
save_hf_pretrained, and via `zerolaunch convert-checkpoint` once that writes config.json). Leaves out: GPUs.
"""

import json
from pathlib import Path

import pytest
import torch
from _helpers import run_zerolaunch

pytest.importorskip("transformers")

from transformers import AutoModelForCausalLM  # noqa: E402

import zerolaunch  # noqa: E402
from zerolaunch.api import save_hf_pretrained  # noqa: E402
from zerolaunch.config import load_resolved  # noqa: E402
from zerolaunch.models import hf  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
RECIPE = REPO / "recipes" / "hf-tiny-llama.yaml"
STEPS = 12

pytestmark = pytest.mark.e2e


def _cli(*args, cwd):
    return run_zerolaunch(*args, cwd=cwd, timeout=240)


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("hf_run")
    lines = [
        json.dumps({"text": f"record {i}: the quick brown fox jumps over the lazy dog."}) for i in range(300)
    ]
    (tmp / "corpus.jsonl").write_text("\n".join(lines) + "\n")
    proc = _cli(
        "train",
        str(RECIPE),
        "--cpu",
        "2",
        "--run-dir",
        str(tmp / "run"),
        "--set",
        "data.args.path=corpus.jsonl",
        "--set",
        f"train.steps={STEPS}",
        cwd=tmp,
    )
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    return tmp


def _trained_engine(run_dir: Path):
    """A world-1 engine holding the run's final checkpoint, built from the run's own resolved recipe."""
    recipe = load_resolved(run_dir / "recipe.resolved.json")
    engine = zerolaunch.initialize(hf.build(**recipe.model.args), recipe)
    engine.load_checkpoint(run_dir / "checkpoints")
    assert engine.global_steps == STEPS
    return engine


def _batch():
    text = b"record 7: the quick brown fox jumps over the lazy dog.\nrecord 8: the"
    return torch.tensor([list(text[:32]), list(text[16:48])])  # (2, 32) byte ids


def test_loss_falls(run):
    losses = [json.loads(line)["loss"] for line in (run / "run" / "metrics.jsonl").read_text().splitlines()]
    assert len(losses) == STEPS
    assert losses[-1] < losses[0] - 0.5


def test_checkpoint_to_hf_directory_keeps_the_logits(run, tmp_path):
    engine = _trained_engine(run / "run")
    out = save_hf_pretrained(engine, tmp_path / "hf")
    reloaded = AutoModelForCausalLM.from_pretrained(out)
    x = _batch()
    with torch.no_grad():
        want = engine.module(input_ids=x).logits
        assert torch.equal(reloaded(input_ids=x).logits, want)
        # and the weights are the trained ones: a fresh init predicts this text far worse
        fresh = hf.build(**load_resolved(run / "run" / "recipe.resolved.json").model.args)
        assert reloaded(input_ids=x, labels=x).loss < fresh(input_ids=x, labels=x).loss - 0.5


def test_convert_checkpoint_output_loads_in_transformers(run, tmp_path):
    out = tmp_path / "converted"
    proc = _cli("convert-checkpoint", str(run / "run" / "checkpoints"), str(out), cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    # the training loop keeps the HF config in the checkpoint; convert writes it next to the weights
    assert (out / "config.json").is_file()
    reloaded = AutoModelForCausalLM.from_pretrained(out)
    engine = _trained_engine(run / "run")
    x = _batch()
    with torch.no_grad():
        assert torch.equal(reloaded(input_ids=x).logits, engine.module(input_ids=x).logits)
