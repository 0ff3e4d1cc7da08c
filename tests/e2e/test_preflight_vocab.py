"""A prepared folder whose tokenizer is larger than the model's vocabulary is refused by the launcher's
pre-flight (exit 2, both numbers and the fix) instead of an IndexError in every worker.

Covers the built-in GPT (model.args.vocab_size, through the CLI) and a Hugging Face model (config.json's
vocab_size, the check called in-process). Leaves out: user model builders (their vocabulary is not known
without building the model; the workers meet the error).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from _tiny_tokenizer import make_tokenizer  # noqa: E402

from zerolaunch.config import load_recipe  # noqa: E402
from zerolaunch.config.errors import UserError  # noqa: E402
from zerolaunch.data.prepare import prepare_data  # noqa: E402
from zerolaunch.launch.preflight import check_vocab_fits  # noqa: E402

pytestmark = pytest.mark.e2e

RECIPE = """\
model:
  builder: zerolaunch.models.gpt:build
  args: {{size: tiny, vocab_size: {vocab}, seq_len: 32}}
data:
  builder: zerolaunch.data.tokens:build
  args: {{path: {path}, seq_len: 32}}
train: {{steps: 2, micro_batch_size: 2}}
"""


@pytest.fixture(scope="module")
def prepared(tmp_path_factory):
    root = tmp_path_factory.mktemp("vocab")
    tok = make_tokenizer(root / "tok")  # 300 tokens
    lines = [json.dumps({"text": f"the quick brown fox {i} jumps over the lazy dog"}) for i in range(200)]
    (root / "a.jsonl").write_text("\n".join(lines) + "\n")
    prepare_data([root / "a.jsonl"], tokenizer=tok, out=root / "data", progress=False)
    return root / "data"


def test_a_tokenizer_larger_than_the_gpt_vocab_is_refused_before_any_worker(cli, prepared, tmp_path):
    vocab = json.loads((prepared / "manifest.json").read_text())["tokenizer"]["vocab_size"]
    recipe = tmp_path / "r.yaml"
    recipe.write_text(RECIPE.format(vocab=64, path=prepared))
    proc = cli.run(recipe, "--cpu", "1", "--run-dir", tmp_path / "run")
    out = proc.stdout + proc.stderr
    assert proc.returncode == 2, out[-3000:]
    assert "Traceback" not in out and "launching" not in out
    assert f"{vocab:,} tokens" in out and "64 (model.args.vocab_size)" in out
    assert f"model.args.vocab_size: {vocab}" in out


def test_hf_config_vocab_is_compared(prepared, tmp_path):
    model_dir = tmp_path / "hf"
    model_dir.mkdir()
    (model_dir / "config.json").write_text(json.dumps({"model_type": "llama", "vocab_size": 128}))
    raw = {
        "model": {"builder": "zerolaunch.models.hf:build", "args": {"path": str(model_dir)}},
        "data": {"builder": "zerolaunch.data.tokens:build", "args": {"path": str(prepared), "seq_len": 32}},
        "train": {"steps": 2, "micro_batch_size": 2},
    }
    with pytest.raises(UserError) as err:
        check_vocab_fits(load_recipe(raw, world_size=1), "r.yaml")
    assert f"vocab_size in {model_dir / 'config.json'}" in str(err.value) and "128" in str(err.value)
    (model_dir / "config.json").write_text(json.dumps({"model_type": "llama", "vocab_size": 512}))
    check_vocab_fits(load_recipe(raw, world_size=1), "r.yaml")  # a larger model vocabulary is fine
