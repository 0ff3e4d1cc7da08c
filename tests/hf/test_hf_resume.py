"""A zerolaunch Trainer run resumed from `checkpoint-N/` ends with the weights of the same run unbroken.

Runs tests/hf/_hf_run.py `resume` (2 CPU gloo ranks, ZeRO stages 2 and 3, 6 steps, a checkpoint every 3 with
save_total_limit 1, the Trainer's linear schedule): one run unbroken, one stopped after its step-3 checkpoint
and continued by a new Trainer with resume_from_checkpoint. The engine state (fp32 master, Adam moments, step
count) comes from checkpoint-3/zerolaunch/, the schedule, RNG and data position from the Trainer's own files,
so the final weights must be bit-equal, and every logged loss and lr equal. Not covered: resuming at another
world size (the engine's checkpoint tests cover that).

Also at stage 3: load_best_model_at_end puts the weights of the best checkpoint back (the highest eval loss
counted best, so that it is an earlier one than the last; the
trainer's save_model afterwards writes exactly them), and save_only_model leaves the engine's shards out of the
checkpoint folder while its weights are save_model's.
"""

from __future__ import annotations

import _hf_run
import pytest
import torch

pytest.importorskip("transformers", minversion="5.17")  # the Trainer hooks zerolaunch.hf replaces


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    return _hf_run.run("resume", ("zerolaunch",), tmp_path_factory.mktemp("hf_resume"))["zerolaunch"]


@pytest.mark.parametrize("stage", [2, 3])
def test_resumed_equals_unbroken(runs, stage):
    unbroken, resumed = runs[f"stage{stage}"]["unbroken"], runs[f"stage{stage}"]["resumed"]
    assert len(unbroken["loss"]) == 6
    assert resumed["loss"] == unbroken["loss"]
    assert resumed["learning_rate"] == unbroken["learning_rate"]
    for name, expected in unbroken["weights"].items():
        assert torch.equal(resumed["weights"][name], expected), name


@pytest.mark.parametrize("stage", [2, 3])
def test_save_total_limit_pruned(runs, stage):
    assert runs[f"stage{stage}"]["resumed"]["checkpoints"] == ["checkpoint-6"]
    assert runs[f"stage{stage}"]["unbroken"]["checkpoints"] == ["checkpoint-6"]


def test_load_best_model_at_end_stage3(runs):
    best = runs["best"]
    lowest = min(best["evals"], key=best["evals"].get)
    assert best["best"].endswith(f"checkpoint-{lowest}")
    # the test must tell the checkpoints apart: the best one is not simply the last
    assert lowest != max(best["evals"]), (
        "the last checkpoint is the best; change the lr to make the test bite"
    )
    expected = best["checkpoints"][f"checkpoint-{lowest}"]
    for name, tensor in expected.items():
        assert torch.equal(best["weights"][name], tensor), name


def test_save_only_model_stage3(runs):
    only = runs["only_model"]
    assert "zerolaunch" not in only["files"] and "model.safetensors" in only["files"]
    assert "trainer_state.json" in only["files"]
    for name, tensor in only["final"].items():
        assert torch.equal(only["checkpoint"][name], tensor), name
