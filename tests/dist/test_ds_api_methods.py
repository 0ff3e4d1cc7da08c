"""The engine methods a DeepSpeed script calls, against DeepSpeed 0.19.8 running the same script.

Runs tests/dist/_ds_api_run.py under both engines (2 CPU gloo ranks each, fp32, accumulation 2, 4 optimizer
steps, two param groups with their own lr under WarmupLR with and without warmup_max_lr, WarmupCosineLR and
WarmupDecayLR, ZeRO stages 1-3; and WarmupLR with per-group lists for warmup_min_lr / warmup_max_lr at stage 2:
the lrs, the weights, a list of the wrong length refused) and compares what rank 0 saw:
get_lr() before training and after every step(), is_gradient_accumulation_boundary() before every
micro-step, set_gradient_accumulation_boundary() (a window of 3 backwards and one step(), then one-backward
windows: the flags, global_steps and get_lr() after each step, and the weights), no_sync() (refused at stages 2/3, step() inside it refused at stage 1), train()/eval(), the rank
and batch-size getters, global_steps, the weights after zero_grad() at each boundary, and the file
save_16bit_model writes (DeepSpeed's pytorch_model.bin against our model.safetensors, tensor by tensor;
nothing written and False at ZeRO-3 without stage3_gather_16bit_weights_on_model_save), and
exclude_frozen_parameters (fc1.bias frozen) on save_16bit_model and save_checkpoint: the tensors left in the
file and the checkpoint, a strict load refused, a load_module_strict=False load giving back the saved weights. DeepSpeed's values
are made in this run, not recorded. Not covered: bf16/fp16 (the 16-bit writer's own test:
test_model16_save.py).
"""

from __future__ import annotations

from pathlib import Path

import _spawn
import pytest
import torch

pytest.importorskip("deepspeed")

from safetensors.torch import load_file  # noqa: E402

SCRIPT = Path(__file__).with_name("_ds_api_run.py")
CASES = ["stage1", "stage2", "stage3", "stage3_no_gather"]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("ds_api")
    return _spawn.run_engines(SCRIPT, ("deepspeed", "zerolaunch"), tmp, tmp / "save"), tmp / "save"


@pytest.mark.parametrize("case", CASES)
def test_same_answers_as_deepspeed(runs, case):
    seen, _ = runs
    ours, ref = seen["zerolaunch"][case], seen["deepspeed"][case]
    keys = ("no_sync", "training", "ids", "batch", "boundary", "global_steps", "set_boundary", "saved")
    for key in (*keys, "saved_no_frozen", "checkpoint_names"):
        assert ours[key] == ref[key], key
    # a strict load of a checkpoint without its frozen params is refused by both (the exception types differ)
    assert (ours["strict_load"] == "ok") == (ref["strict_load"] == "ok")
    assert len(ours["lr"]) == len(ref["lr"])
    for mine, theirs in zip(ours["lr"], ref["lr"], strict=True):
        assert mine == pytest.approx(theirs, rel=1e-12, abs=0.0)
    for key in ("weights", "loaded"):
        assert sorted(ours[key]) == sorted(ref[key])
        for name, expected in ref[key].items():
            atol = 1e-5 * expected.abs().max().item()
            torch.testing.assert_close(ours[key][name], expected, rtol=1e-5, atol=atol, msg=f"{key} {name}")
    # load_module_strict=False: the trainable weights are the saved ones again, the frozen one the model's
    for name, saved in ours["weights"].items():
        torch.testing.assert_close(ours["loaded"][name], saved, rtol=0, atol=0)


def test_per_group_lists_give_deepspeeds_lrs_and_weights(runs):
    """WarmupLR with warmup_min_lr [0, 1e-4] and warmup_max_lr [1e-2, 5e-3] over two groups with their own lr
    (0.01, 0.02, both ignored: the lists set each group's range): the same lr list after every step (exact)
    and the same weights; a list of 3 values for the 2 groups is a ValueError in both."""
    ours, ref = runs[0]["zerolaunch"]["lists"], runs[0]["deepspeed"]["lists"]
    assert ours["lr"] == ref["lr"]
    assert ref["lr"][0] == [0, 1e-4] and ref["lr"][-1] == pytest.approx([1e-2, 5e-3])
    assert (
        len({tuple(lr) for lr in ref["lr"]}) == 3
    )  # the mins, one warmup step, the maxes: the lists move it
    assert sorted(ours["weights"]) == sorted(ref["weights"])
    for name, expected in ref["weights"].items():
        atol = 1e-5 * expected.abs().max().item()
        torch.testing.assert_close(ours["weights"][name], expected, rtol=1e-5, atol=atol, msg=name)
    assert ref["wrong_length"][0] == ours["wrong_length"][0] == "ValueError"
    assert "expected 2 value for min_lr, got 3" in ref["wrong_length"][1]
    message = ours["wrong_length"][1]
    assert "warmup_min_lr is a list of 3 values" in message and "2 param groups" in message
    assert "the groups of model_parameters" in message


def test_the_sequences_are_not_trivial(runs):
    """The schedule must move the lr between steps and the accumulation must alternate, else equal lists
    would prove little."""
    ref = runs[0]["deepspeed"]["stage1"]
    assert len({tuple(lr) for lr in ref["lr"]}) == 3
    assert ref["lr"][-1] == pytest.approx([0.01, 0.02])
    assert ref["boundary"] == [False, True] * 4
    # the caller's boundary wins over the count: 3 backwards then one optimizer step, then one step each
    flags = [x for x in ref["set_boundary"] if isinstance(x, bool)]
    assert flags == [False, False, True, True, True]
    assert [x[0] for x in ref["set_boundary"] if isinstance(x, tuple)] == [5, 6, 7]
    assert ref["no_sync"] == "entered; step inside: AssertionError"
    assert runs[0]["deepspeed"]["stage2"]["no_sync"] == "AssertionError"
    # a warmup_max_lr is every group's peak; WarmupCosineLR keeps the groups' 1:2 ratio
    assert runs[0]["deepspeed"]["stage2"]["lr"][-1] == pytest.approx([0.05, 0.05])
    cosine = runs[0]["deepspeed"]["stage3"]["lr"]
    assert (
        all(second == pytest.approx(2 * first) for first, second in cosine)
        and len(set(map(tuple, cosine))) > 2
    )


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


@pytest.mark.parametrize("case", ["stage1", "stage2", "stage3"])
def test_exclude_frozen_parameters_leaves_the_frozen_param_out(runs, case):
    seen, save = runs
    theirs = torch.load(save / "deepspeed" / f"{case}_no_frozen" / "pytorch_model.bin", map_location="cpu")
    ours = load_file(save / "zerolaunch" / f"{case}_no_frozen" / "model.safetensors")
    assert "fc1.bias" not in theirs and sorted(ours) == sorted(theirs)
    for name, expected in theirs.items():
        torch.testing.assert_close(ours[name], expected, rtol=1e-5, atol=1e-5 * expected.abs().max().item())
    names = seen["deepspeed"][case]["checkpoint_names"]
    assert "fc1.bias" not in names and "fc1.weight" in names
    assert seen["deepspeed"][case]["strict_load"] != "ok"


def test_no_16bit_model_at_zero3_without_the_flag(runs):
    _, save = runs
    assert not (save / "deepspeed" / "stage3_no_gather").exists()
    assert not (save / "zerolaunch" / "stage3_no_gather").exists()
