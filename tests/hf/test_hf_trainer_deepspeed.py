"""`from zerolaunch.hf import Trainer, TrainingArguments` against transformers' Trainer + DeepSpeed 0.19.8: the
Hugging Face DeepSpeed guide's flow, the same script and ds_config ("auto" filled from the arguments).

Runs tests/hf/_hf_run.py `guide` under both (2 CPU gloo ranks each, fp32, tiny Llama, 5 optimizer steps with
accumulation 2, AdamW + WarmupLR from the config, clipping, masked labels so each rank's token count differs)
at ZeRO stages 1-3, then evaluate() and predict(); compares every logged loss and grad norm, the eval loss and
every weight save_model wrote, to 1e-5 relative. At stage 3 zerolaunch's model.generate runs with the ranks
stopping at different lengths and must give the tokens a plain model with the saved weights gives.
DeepSpeed's numbers are made in this run, not recorded. Not covered: bf16/fp16 (DeepSpeed's fp16 does not
run on CPU), offload, the logged learning rate (DeepSpeed logs the next step's, zerolaunch the step's own).
"""

from __future__ import annotations

import _hf_run
import pytest
import torch

pytest.importorskip("deepspeed")
pytest.importorskip("transformers", minversion="5.17")  # the Trainer hooks zerolaunch.hf replaces
pytest.importorskip("accelerate")


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    return _hf_run.run("guide", ("deepspeed", "zerolaunch"), tmp_path_factory.mktemp("hf_guide"))


def _close(ours, ref):
    torch.testing.assert_close(torch.tensor(ours), torch.tensor(ref), rtol=1e-5, atol=0)


@pytest.mark.parametrize("stage", [1, 2, 3])
def test_losses_and_grad_norms_equal_deepspeed(runs, stage):
    ours, ref = runs["zerolaunch"][f"stage{stage}"], runs["deepspeed"][f"stage{stage}"]
    assert len(ref["loss"]) == 5
    _close(ours["loss"], ref["loss"])
    _close(ours["grad_norm"], ref["grad_norm"])
    _close(ours["eval_loss"], ref["eval_loss"])
    assert ours["predict_shape"] == ref["predict_shape"]


@pytest.mark.parametrize("stage", [1, 2, 3])
def test_saved_weights_equal_deepspeed(runs, stage):
    ours, ref = runs["zerolaunch"][f"stage{stage}"]["weights"], runs["deepspeed"][f"stage{stage}"]["weights"]
    assert sorted(ours) == sorted(ref)
    for name, expected in ref.items():
        torch.testing.assert_close(ours[name], expected, rtol=1e-5, atol=1e-5 * expected.abs().max().item())


def test_training_moved_the_weights(runs):
    """Else equal weights would prove nothing: the run must move them away from the initial ones."""
    initial = _hf_run.tiny_llama().state_dict()
    moved = runs["deepspeed"]["stage1"]["weights"]
    assert max((moved[k] - initial[k]).abs().max().item() for k in moved) > 1e-3


def test_stage3_generate_with_ranks_stopping_apart(runs):
    from safetensors.torch import load_file  # noqa: F401 -- the weights came back as tensors already

    model = _hf_run.tiny_llama()
    model.load_state_dict(runs["zerolaunch"]["stage3"]["weights"])
    model.eval()
    per_rank = runs["zerolaunch"]["stage3"]["generate"]
    assert [n for _, n, _ in per_rank] == [3, 7]
    for prompt, new_tokens, tokens in per_rank:
        assert torch.equal(tokens, _hf_run.greedy(model, prompt, new_tokens))
