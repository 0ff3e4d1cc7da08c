"""`estimate-memory RECIPE --measure` runs real engine steps and its figures equal the estimate on CPU.

Tests: the tiny GPT recipe at stage 2 (the file's) and stage 3 (--set), 1 rank in-process and 2 gloo ranks
spawned by --measure itself; --json carries estimated and measured bytes per component. A LoRA recipe (a
`peft:` block over the tiny GPT) at stage 2 on 1 rank and stage 3 on 2 ranks: every component within 5%
(exact in fact), the adapter's count, the frozen base sharded at stage 3. A stage-3 LoRA recipe over an HF
model folder: the model reaches the engine on the meta device, as `zerolaunch train` builds it. Leaves out: the
CUDA peak comparison (max_memory_allocated needs a GPU; the lead runs it on the device).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from _helpers import save_tiny_llama_base
from typer.testing import CliRunner

from zerolaunch.cli.app import app

pytestmark = pytest.mark.e2e
RECIPE = str(Path(__file__).resolve().parents[2] / "recipes" / "tiny-gpt.yaml")


@pytest.mark.parametrize(
    "gpus, extra",
    [
        ("1", []),
        (
            "2",
            [
                "--set",
                "zero_optimization.stage=3",
                "--set",
                "zero_optimization.stage3_param_persistence_threshold=10",
            ],
        ),
    ],
)
def test_measure_equals_estimate_per_component(gpus, extra):
    result = CliRunner().invoke(
        app,
        ["estimate-memory", RECIPE, "--gpus", gpus, "--measure", "--measure-steps", "2", "--json", *extra],
    )
    assert result.exit_code == 0, result.output
    measured = json.loads(result.output)["measured"]
    assert measured["world_size"] == int(gpus) and measured["device"] == "cpu"
    assert measured["row"] == ("stage 3" if extra else "stage 2")
    for name, pair in measured["components"].items():
        assert pair["estimated"] == pair["measured"], (name, pair)
    # something was measured (stage 3 without offload may hold no params at all between steps: every unit
    # gathers from its fp32 master and the tiny GPT has nothing under the persistence threshold; an fp32 run
    # at one rank holds no master apart from its params: [Note: master is params])
    assert measured["components"]["optimizer"]["measured"] > 0
    assert (measured["components"]["master"]["measured"] > 0) is bool(extra)
    if not extra:
        assert measured["components"]["params"]["measured"] > 0
    assert len(measured["per_rank"]) == int(gpus)


def test_measure_refuses_one_step():
    result = CliRunner().invoke(app, ["estimate-memory", RECIPE, "--measure", "--measure-steps", "1"])
    assert result.exit_code == 2 and "--measure-steps" in result.output


LORA_STAGES = [("1", "2"), ("2", "3")]


@pytest.mark.parametrize("gpus, stage", LORA_STAGES, ids=["stage2-1rank", "stage3-2ranks"])
def test_measure_agrees_with_the_estimate_on_a_lora_recipe(tmp_path, gpus, stage):
    # a recipe's peft: block: --measure trains the same PeftModel the estimate sized (real engine steps)
    pytest.importorskip("peft")
    recipe = tmp_path / "tiny-lora.yaml"
    recipe.write_text(Path(RECIPE).read_text() + "peft: {r: 4, target_modules: [qkv, fc]}\n")
    args = [str(recipe), "--gpus", gpus, "--measure", "--measure-steps", "2", "--json"]
    args += ["--set", f"zero_optimization.stage={stage}"]
    if stage == "3":
        args += ["--set", "zero_optimization.stage3_param_persistence_threshold=10"]
    result = CliRunner().invoke(app, ["estimate-memory", *args])
    assert result.exit_code == 0, result.output
    data = json.loads(result.output)
    measured = data["measured"]
    assert measured["row"] == f"stage {stage}" and measured["world_size"] == int(gpus)
    # the adapter trains (its grads, master and moments), the base is frozen: r*(in+out) per targeted layer
    assert data["model"]["params"] == 2 * 4 * ((64 + 192) + (64 + 256))
    pairs = measured["components"]
    assert sum(p["estimated"] for p in pairs.values()) == pytest.approx(
        sum(p["measured"] for p in pairs.values()), rel=0.05
    )
    for name, pair in pairs.items():
        assert pair["estimated"] == pytest.approx(pair["measured"], rel=0.05), name
    assert pairs["optimizer"]["measured"] == 2 * 4 * data["model"]["params"] // int(gpus)
    if stage == "3":  # the frozen base is sharded: each rank holds about half of its fp32 bytes
        base = 4 * data["model"]["frozen_params"]
        assert pairs["params"]["measured"] < 0.6 * base


def test_measure_builds_a_stage3_lora_base_on_meta_as_train_does(tmp_path, monkeypatch):
    # zerolaunch train builds an HF base under a peft: block on the meta device at stage 3 and the engine fills
    # it unit by unit from the files; --measure must take that path, not build the whole base first
    pytest.importorskip("peft")
    pytest.importorskip("transformers")

    from zerolaunch import build

    save_tiny_llama_base(tmp_path / "base")
    (tmp_path / "corpus.jsonl").write_text('{"text": "a lazy dog jumps over the quick brown fox"}\n' * 8)
    recipe = tmp_path / "lora.yaml"
    recipe.write_text(
        json.dumps(
            {
                "model": {"builder": "zerolaunch.models.hf:build", "args": {"path": str(tmp_path / "base")}},
                "data": {
                    "builder": "zerolaunch.data.hf_text:build",
                    "args": {"path": str(tmp_path / "corpus.jsonl"), "seq_len": 16},
                },
                "train": {"steps": 2, "micro_batch_size": 1},
                "peft": {"r": 4, "lora_alpha": 8, "target_modules": ["q_proj", "v_proj"]},
                "deepspeed": {"zero_optimization": {"stage": 3, "stage3_param_persistence_threshold": 0}},
            }
        )
    )
    handed = []
    real_build_engine = build.build_engine

    def spy(model, *args, **kwargs):
        handed.append(all(p.is_meta for p in model.parameters()))
        return real_build_engine(model, *args, **kwargs)

    monkeypatch.setattr(build, "build_engine", spy)
    args = [str(recipe), "--gpus", "1", "--measure", "--measure-steps", "2", "--json"]
    result = CliRunner().invoke(app, ["estimate-memory", *args])
    assert result.exit_code == 0, result.output
    assert handed == [True], "--measure built the base with real weights before the engine"
    data = json.loads(result.output)
    assert data["measured"]["row"] == "stage 3"
    pairs = data["measured"]["components"]
    # the adapter's fp32 Adam moments; the whole frozen base on the one rank (files read unit by unit)
    assert pairs["optimizer"]["measured"] == 2 * 4 * data["model"]["params"]
    assert pairs["params"]["measured"] == 4 * data["model"]["frozen_params"]
    for name, pair in pairs.items():
        assert pair["estimated"] == pytest.approx(pair["measured"], rel=0.05), name
