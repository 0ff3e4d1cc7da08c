"""`zero_trainer(trl.SFTTrainer)` + `zero_args(trl.SFTConfig)` at ZeRO stage 3 against stock SFTTrainer's
data-parallel run (DDP through accelerate), on prompt/completion data with completion-only loss.

Runs tests/hf/_hf_run.py `sft` under both (2 CPU gloo ranks, fp32, tiny Llama with a character tokenizer built
offline, 5 steps with accumulation 2, the Trainer's linear schedule with warmup, clipping, TRL's fused LM head
and token-weighted loss over the window and the ranks) and compares every logged loss and grad norm and every
saved weight to 1e-5 relative. DeepSpeed + SFTTrainer does not run on CPU (accelerate sees one process), so
the reference is DDP, which stage 3 must equal. Not covered: packing, padding-free batches, PEFT.
"""

from __future__ import annotations

import _hf_run
import pytest
import torch

pytest.importorskip("trl")
pytest.importorskip("transformers", minversion="5.17")  # the Trainer hooks zerolaunch.hf replaces


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    return _hf_run.run("sft", ("ddp", "zerolaunch"), tmp_path_factory.mktemp("hf_sft"))


def test_losses_and_grad_norms_equal_ddp(runs):
    ours, ref = runs["zerolaunch"], runs["ddp"]
    assert len(ref["loss"]) == 5
    torch.testing.assert_close(torch.tensor(ours["loss"]), torch.tensor(ref["loss"]), rtol=1e-5, atol=0)
    torch.testing.assert_close(
        torch.tensor(ours["grad_norm"]), torch.tensor(ref["grad_norm"]), rtol=1e-5, atol=0
    )
    assert ours["learning_rate"] == pytest.approx(ref["learning_rate"], rel=1e-12)


def test_saved_weights_equal_ddp(runs):
    ours, ref = runs["zerolaunch"]["weights"], runs["ddp"]["weights"]
    assert sorted(ours) == sorted(ref)
    for name, expected in ref.items():
        torch.testing.assert_close(ours[name], expected, rtol=1e-5, atol=1e-5 * expected.abs().max().item())
    initial = _hf_run.tiny_llama().state_dict()
    assert max((ref[k] - initial[k]).abs().max().item() for k in ref) > 1e-3  # training moved them
