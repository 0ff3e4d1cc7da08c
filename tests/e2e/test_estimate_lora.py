"""`zerolaunch estimate-memory --lora-rank / --lora-targets` and a recipe's `peft:` block through the command tree.

Tests: --params with --lora-rank (the adapter's count, the frozen base, a recommendation without offload
where full training needs it), a recipe with --lora-rank equal to the same recipe with a written `peft:`
block (the flags become that block), --lora-rank alone on a recipe (every linear layer but the head), bad
LoRA input -> one error and exit 2. Leaves out: --measure on a
LoRA recipe (test_estimate_measure.py) and the row arithmetic (tests/unit/test_memory_lora.py).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from zerolaunch.cli.app import app

pytest.importorskip("peft")
pytestmark = pytest.mark.e2e
RECIPE = str(Path(__file__).resolve().parents[2] / "recipes" / "tiny-gpt.yaml")
runner = CliRunner()


def _json(*args) -> dict:
    result = runner.invoke(app, ["estimate-memory", *args, "--json"])
    assert result.exit_code == 0, result.output
    return json.loads(result.output)


def test_lora_rank_recommends_on_the_adapter():
    common = ("--params", "7e9", "--gpus", "1", "--gpu-memory", "24GiB", "--cpu-memory", "256GiB")
    full = _json(*common)
    lora = _json(*common, "--lora-rank", "16")
    # the stand-in's blocks (n_layer x width from its source line): qkv d->3d, proj d->d, fc d->4d, proj 4d->d
    d, layers = 4096, 33
    assert f"n_layer={layers} d_model={d}" in lora["model"]["source"]
    assert lora["model"]["params"] == layers * 16 * (4 * d + 2 * d + 5 * d + 5 * d)
    assert lora["model"]["frozen_params"] == 7 * 10**9
    # 7B of fp32 Adam state does not fit one 24 GiB GPU without offload; the adapter's does
    assert full["recommended"]["offload"] != "none"
    assert lora["recommended"]["offload"] == "none"


def test_lora_flags_on_a_recipe_are_its_peft_block(tmp_path):
    written = tmp_path / "lora.yaml"
    written.write_text(Path(RECIPE).read_text() + "peft: {r: 4, target_modules: [qkv, fc]}\n")
    args = ("--gpus", "2", "--gpu-memory", "1GiB", "--set", "zero_optimization.stage=3")
    by_flags = _json(RECIPE, *args, "--lora-rank", "4", "--lora-targets", "qkv,fc")
    by_block = _json(str(written), *args)
    assert by_flags["rows"] == by_block["rows"]
    assert by_flags["model"]["params"] == by_block["model"]["params"] == 2 * 4 * ((64 + 192) + (64 + 256))


def test_lora_rank_on_a_recipe_without_targets_adapts_every_linear_layer_but_the_head():
    # the tiny GPT is no transformers model, for which PEFT resolves all-linear: the layers go by name
    data = _json(RECIPE, "--gpu-memory", "1GiB", "--lora-rank", "4")
    d, ff = 64, 256  # 2 blocks: qkv d->3d, attn.proj d->d, fc d->ff, mlp.proj ff->d; lm_head (tied) is not
    assert data["model"]["params"] == 2 * 4 * ((d + 3 * d) + (d + d) + (d + ff) + (ff + d))
    assert "LoRA r=4" in data["model"]["source"]


@pytest.mark.parametrize(
    "args, needle",
    [
        (("--params", "1e9", "--lora-targets", "qkv"), "--lora-rank"),
        (("--params", "1e9", "--lora-rank", "0"), "--lora-rank"),
        (("--model", "gpt-tiny", "--lora-rank", "4", "--lora-targets", "qvk"), "Did you mean qkv"),
        ((RECIPE, "--lora-rank", "4", "--lora-targets", "qvk"), "qkv"),
    ],
)
def test_bad_lora_input_is_one_error_and_exit_2(args, needle):
    result = runner.invoke(app, ["estimate-memory", *args])
    assert result.exit_code == 2, result.output
    assert needle in result.output and "Traceback" not in result.output
