"""The engine methods a DeepSpeed script calls, against DeepSpeed 0.19.8 running the same script.

Runs tests/dist/_ds_api_run.py under both engines (2 CPU gloo ranks each, fp32, accumulation 2, 4 optimizer
steps, WarmupLR over two param groups with their own lr, ZeRO stages 1-3) and compares what rank 0 saw:
get_lr() before training and after every step(), is_gradient_accumulation_boundary() before every
micro-step, no_sync() (refused at stages 2/3, step() inside it refused at stage 1), train()/eval(), the rank
and batch-size getters, global_steps, the weights after zero_grad() at each boundary, and the file
save_16bit_model writes (DeepSpeed's pytorch_model.bin against our model.safetensors, tensor by tensor;
nothing written and False at ZeRO-3 without stage3_gather_16bit_weights_on_model_save). DeepSpeed's values
are made in this run, not recorded. Not covered: bf16/fp16 (the 16-bit writer's own test:
test_model16_save.py).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

pytest.importorskip("deepspeed")

from safetensors.torch import load_file  # noqa: E402

SCRIPT = Path(__file__).with_name("_ds_api_run.py")
ROOT = Path(__file__).resolve().parents[2]
CASES = ["stage1", "stage2", "stage3", "stage3_no_gather"]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("ds_api")
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", "DS_ACCELERATOR": "cpu"}
    procs = {
        w: subprocess.Popen(
            [sys.executable, str(SCRIPT), w, str(tmp / f"{w}.pt"), str(tmp / "save")],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for w in ("deepspeed", "zerolaunch")
    }
    for which, proc in procs.items():
        output, _ = proc.communicate(timeout=900)
        assert proc.returncode == 0, f"{which} run failed:\n{output[-4000:]}"
    return {w: torch.load(tmp / f"{w}.pt") for w in procs}, tmp / "save"


@pytest.mark.parametrize("case", CASES)
def test_same_answers_as_deepspeed(runs, case):
    seen, _ = runs
    ours, ref = seen["zerolaunch"][case], seen["deepspeed"][case]
    for key in ("no_sync", "training", "ids", "batch", "boundary", "global_steps", "saved"):
        assert ours[key] == ref[key], key
    assert len(ours["lr"]) == len(ref["lr"])
    for mine, theirs in zip(ours["lr"], ref["lr"], strict=True):
        assert mine == pytest.approx(theirs, rel=1e-12, abs=0.0)
    assert sorted(ours["weights"]) == sorted(ref["weights"])
    for name, expected in ref["weights"].items():
        torch.testing.assert_close(
            ours["weights"][name], expected, rtol=1e-5, atol=1e-5 * expected.abs().max().item()
        )


def test_the_sequences_are_not_trivial(runs):
    """The schedule must move the lr between steps and the accumulation must alternate, else equal lists
    would prove little."""
    ref = runs[0]["deepspeed"]["stage1"]
    assert len({tuple(lr) for lr in ref["lr"]}) == 3
    assert ref["lr"][-1] == pytest.approx([0.01, 0.02])
    assert ref["boundary"] == [False, True] * 4
    assert ref["no_sync"] == "entered; step inside: AssertionError"
    assert runs[0]["deepspeed"]["stage2"]["no_sync"] == "AssertionError"


@pytest.mark.parametrize("case", ["stage1", "stage2", "stage3"])
def test_save_16bit_model_holds_deepspeeds_tensors(runs, case):
    seen, save = runs
    theirs = torch.load(save / "deepspeed" / case / "pytorch_model.bin", map_location="cpu")
    ours = load_file(save / "zerolaunch" / case / "model.safetensors")
    assert sorted(ours) == sorted(theirs)
    for name, expected in theirs.items():
        assert ours[name].dtype == expected.dtype, name
        torch.testing.assert_close(ours[name], expected, rtol=1e-5, atol=1e-5 * expected.abs().max().item())
        # and the file is the trained model, not the initial one
        torch.testing.assert_close(ours[name], seen["zerolaunch"][case]["weights"][name], rtol=0, atol=0)


def test_no_16bit_model_at_zero3_without_the_flag(runs):
    _, save = runs
    assert not (save / "deepspeed" / "stage3_no_gather").exists()
    assert not (save / "zerolaunch" / "stage3_no_gather").exists()
