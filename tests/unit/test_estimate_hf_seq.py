"""estimate-memory --model HF_DIR: the default sequence length is the model's own max_position_embeddings when
that is below the default 1024 (a 256-position model was estimated at 1024 tokens); --seq-len still wins.
Leaves out: the activation formula itself (test_estimate_*)."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from zerolaunch.cli.app import app

pytest.importorskip("transformers")

CONFIG = {
    "model_type": "llama",
    "vocab_size": 128,
    "hidden_size": 32,
    "intermediate_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 256,
}


def _setup(tmp_path, *extra):
    folder = tmp_path / "hf"
    folder.mkdir(exist_ok=True)
    (folder / "config.json").write_text(json.dumps(CONFIG))
    result = CliRunner().invoke(app, ["estimate-memory", "--model", str(folder), "--json", *extra])
    assert result.exit_code == 0, result.output
    return json.loads(result.output)["setup"]


def test_the_models_own_positions_are_the_default_seq_len(tmp_path):
    assert _setup(tmp_path)["seq_len"] == 256
    assert _setup(tmp_path, "--seq-len", "128")["seq_len"] == 128
