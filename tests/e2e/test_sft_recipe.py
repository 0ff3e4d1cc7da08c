"""recipes/hf-sft.yaml through the real CLI: prepare-data on a local jsonl, then `zerolaunch train` of a tiny
local Llama folder (saved here with save_pretrained, with its tokenizer) at --cpu 2.

Covers: the recipe's keys work as written (only paths, sizes and precision overridden); loss falls; eval
lines and the best checkpoint appear. Leaves out: GPUs, bf16 (the CPU run uses fp32), big models.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

pytest.importorskip("transformers")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from _helpers import run_zerolaunch  # noqa: E402
from _tiny_tokenizer import make_tokenizer  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
RECIPE = REPO / "recipes" / "hf-sft.yaml"
pytestmark = pytest.mark.e2e


def _cli(*args, cwd):
    return run_zerolaunch(*args, cwd=cwd, timeout=300)


def test_sft_recipe_on_a_local_model_folder(tmp_path):
    from transformers import LlamaConfig, LlamaForCausalLM

    model_dir = make_tokenizer(tmp_path / "model")
    cfg = LlamaConfig(
        vocab_size=300,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=128,
        bos_token_id=0,
        eos_token_id=1,
        pad_token_id=2,
    )
    LlamaForCausalLM(cfg).save_pretrained(model_dir)
    rows = [
        {"prompt": f"question {i % 7}?", "completion": f" answer {i % 7} the quick fox"} for i in range(300)
    ]
    (tmp_path / "sft.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    prep = _cli(
        "prepare-data",
        "sft.jsonl",
        "--tokenizer",
        "model",
        "--out",
        "data/sft",
        "--mode",
        "prompt-completion",
        cwd=tmp_path,
    )
    assert prep.returncode == 0, prep.stderr
    proc = _cli(
        "train",
        str(RECIPE),
        "--cpu",
        "2",
        "--run-dir",
        str(tmp_path / "run"),
        "--set",
        "model.args.path=model",
        "--set",
        "data.args.path=data/sft",
        "--set",
        "data.args.seq_len=64",
        "--set",
        "data.args.holdout=0.1",
        "--set",
        "train.steps=12",
        "--set",
        "train.micro_batch_size=2",
        "--set",
        "train.gradient_accumulation_steps=2",
        "--set",
        "train.lr=3e-3",
        "--set",
        "train.warmup_steps=0",
        "--set",
        "train.precision=fp32",
        "--set",
        "train.eval_every=4",
        "--set",
        "train.eval_batches=2",
        "--set",
        "checkpoint.every=4",
        "--set",
        "checkpoint.keep=1",
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    records = [json.loads(line) for line in (tmp_path / "run/metrics.jsonl").read_text().splitlines()]
    steps = [r for r in records if "loss" in r]
    evals = [r for r in records if "eval_loss" in r]
    assert len(steps) == 12 and steps[-1]["loss"] < steps[0]["loss"] - 0.5
    assert [r["step"] for r in evals] == [4, 8, 12]
    assert evals[-1]["eval_loss"] < evals[0]["eval_loss"]
    assert (tmp_path / "run/checkpoints/best.json").is_file()
