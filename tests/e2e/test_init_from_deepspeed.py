"""`model.init_from: <DeepSpeed checkpoint>` against live DeepSpeed 0.19.8 (CPU, gloo, 2 ranks).

tests/dist/_ds_init_from_run.py trains the built-in GPT 2 steps with DeepSpeed (ZeRO 1/2/3 fp32, ZeRO-3
bf16), saves each checkpoint and records DeepSpeed's loss on the batches zerolaunch will draw first. Then:
the weights init_from reads equal DeepSpeed's own zero_to_fp32 consolidation exactly; a 1-rank zerolaunch run
(another ZeRO stage than the checkpoint's) has DeepSpeed's loss as its first loss; `zerolaunch train` on 2
ranks from the save dir (and from the tag folder) logs DeepSpeed's loss over both ranks' batches. The
checkpoints are made in this run, not recorded. Leaves out: fp16 (DeepSpeed's fp16 does not run on CPU).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from _helpers import tiny_gpt_recipe

from zerolaunch.config import load_recipe
from zerolaunch.train import batches
from zerolaunch.train.context import RunContext
from zerolaunch.train.init_weights import load_initial_weights
from zerolaunch.train.loop import run_training

pytest.importorskip("deepspeed")
pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "tests" / "dist" / "_ds_init_from_run.py"
GPT_ARGS = {"size": "tiny", "vocab_size": 64, "seq_len": 16}
CASES = ("zero1_fp32", "zero2_fp32", "zero3_fp32", "zero3_bf16")


def _recipe_dict(run_dir, stage=2, bf16=False, init_from=None) -> dict:
    recipe = tiny_gpt_recipe(
        seq_len=16,
        train={
            "steps": 1,
            "micro_batch_size": 2,
            "gradient_accumulation_steps": 1,
            "lr": 1e-2,
            "lr_schedule": "constant",
            "seed": 3,
            "log_every": 1,
            "run_dir": str(run_dir),
        },
        deepspeed={"zero_optimization": {"stage": stage}, "bf16": {"enabled": bf16}},
    )
    assert recipe["model"]["args"] == GPT_ARGS  # the model built below with gpt.build(**GPT_ARGS)
    recipe["model"]["init_from"] = init_from
    return recipe


@pytest.fixture(scope="module")
def deepspeed_runs(tmp_path_factory):
    """(folder of DeepSpeed save dirs, results): probes are the first batches of 1 rank, then of 2 ranks."""
    tmp = tmp_path_factory.mktemp("ds_init_from")
    recipe = load_recipe(_recipe_dict(tmp / "r"), world_size=1)
    probes = [next(iter(batches.build_data(recipe, 0, 1)))]
    probes += [next(iter(batches.build_data(recipe, r, 2))) for r in range(2)]
    torch.save(probes, tmp / "probes.pt")
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", "DS_ACCELERATOR": "cpu"}
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), str(tmp), str(tmp / "probes.pt")],
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return tmp, torch.load(tmp / "results.pt")


def _ctx():
    return RunContext(rank=0, local_rank=0, world_size=1, device=torch.device("cpu"))


@pytest.mark.parametrize("case", CASES)
def test_weights_equal_deepspeeds_zero_to_fp32(deepspeed_runs, case):
    from zerolaunch.models import gpt

    folder, results = deepspeed_runs
    model = gpt.build(**GPT_ARGS)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    load_initial_weights(model, str(folder / case))
    got = model.state_dict()
    ref = results[case]["weights"]
    assert set(ref) <= set(got)
    for name, want in ref.items():
        assert torch.equal(got[name], want.float()), name
    assert any(not torch.equal(before[k], got[k]) for k in ref)  # DeepSpeed's training moved the weights


@pytest.mark.parametrize(("case", "our_stage"), [("zero1_fp32", 3), ("zero2_fp32", 1), ("zero3_fp32", 2)])
def test_first_loss_equals_deepspeeds_fp32(deepspeed_runs, group, tmp_path, case, our_stage):
    folder, results = deepspeed_runs
    want = results[case]["losses"][0]
    recipe = load_recipe(
        _recipe_dict(tmp_path / "run", stage=our_stage, init_from=str(folder / case)), world_size=1
    )
    assert run_training(recipe, _ctx()) == [pytest.approx(want, abs=1e-6)]
    fresh = replace(recipe, model=replace(recipe.model, init_from=None))
    assert run_training(
        replace(fresh, train=replace(fresh.train, run_dir=str(tmp_path / "fresh"))), _ctx()
    ) != [pytest.approx(want, abs=1e-3)]


def test_first_loss_equals_deepspeeds_bf16(deepspeed_runs, group, tmp_path):
    folder, results = deepspeed_runs
    want = results["zero3_bf16"]["losses"][0]
    recipe = load_recipe(
        _recipe_dict(tmp_path / "run", stage=3, bf16=True, init_from=str(folder / "zero3_bf16")), world_size=1
    )
    (loss,) = run_training(recipe, _ctx())
    assert loss == pytest.approx(want, rel=1e-3)  # bf16 arithmetic: equal weights, kernels may round apart


@pytest.mark.parametrize("form", ["save_dir", "tag_folder"])
def test_zerolaunch_train_on_two_ranks_starts_from_deepspeeds_weights(deepspeed_runs, cli, tmp_path, form):
    folder, results = deepspeed_runs
    src = folder / "zero3_fp32"
    if form == "tag_folder":
        src = src / (src / "latest").read_text().strip()
    recipe = _recipe_dict(tmp_path / "run", stage=2, init_from=str(src))
    path = tmp_path / "recipe.json"
    path.write_text(json.dumps(recipe))
    proc = cli.run(path, "--cpu", "2", "--run-dir", tmp_path / "run", timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    (first,) = [m for m in cli.metrics(tmp_path / "run") if "loss" in m]
    want = sum(results["zero3_fp32"]["losses"][1:]) / 2  # the mean over the two ranks' first batches
    assert first["loss"] == pytest.approx(want, abs=1e-6)
