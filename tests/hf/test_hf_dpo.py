"""TRL's trainers with a frozen reference model under zero_trainer against the stock trainers' data-parallel
runs (accelerate's DDP, the reference model whole on every rank): DPO with an explicit reference model at
stages 3 and 2 and with the PEFT reference (ref_model=None, a LoRA adapter: the policy with the adapter
disabled) at stage 3; KTO with an explicit reference and GRPO with beta > 0 at stage 3.

Runs tests/hf/_hf_dpo.py under both (2 CPU gloo ranks, fp32, tiny Llamas with a character tokenizer built
offline) and compares every logged loss and grad norm (DPO: chosen rewards and the eval loss after training;
GRPO: the KL) to 1e-5 relative. Under zerolaunch the reference model goes through the accelerator's
prepare_model onto an inference engine (hf/reference.py): at stage 3 each rank holds at most 60% of its bytes,
at stage 2 all of them. DeepSpeed + TRL does not run on CPU (accelerate sees one process), so the reference
run is DDP.
"""

from __future__ import annotations

import _hf_dpo
import pytest
import torch

pytest.importorskip("trl")
pytest.importorskip("peft")
pytest.importorskip("transformers", minversion="5.17")  # the Trainer hooks zerolaunch.hf replaces


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    return _hf_dpo.run(tmp_path_factory.mktemp("hf_dpo"))


@pytest.mark.parametrize("case", sorted(_hf_dpo.CASES))
def test_losses_equal_ddp(runs, case):
    ours, ref = runs["zerolaunch"][case], runs["ddp"][case]
    compared = [k for k in ("loss", "grad_norm", "rewards_chosen", "kl") if k in ref]
    assert "loss" in compared and len(ref["loss"]) >= 2
    for key in compared:
        torch.testing.assert_close(torch.tensor(ours[key]), torch.tensor(ref[key]), rtol=1e-5, atol=0)
    assert ours["learning_rate"] == pytest.approx(ref["learning_rate"], rel=1e-12)
    if "eval_loss" in ref:
        assert ours["eval_loss"] == pytest.approx(ref["eval_loss"], rel=1e-5)
    assert len(set(ref["loss"])) == len(ref["loss"])  # the policy moved


@pytest.mark.parametrize("case", ["explicit", "explicit_stage2", "kto", "grpo"])
def test_reference_model_is_on_an_inference_engine(runs, case):
    ours = runs["zerolaunch"][case]
    assert ours["ref_type"] == "FrozenModel"
    assert ours["ref_requires_grad"] is False
    assert ours["ref_dtypes"] == ["torch.float32"]


@pytest.mark.parametrize("case", ["explicit", "kto", "grpo"])
def test_stage3_reference_model_is_sharded(runs, case):
    ours = runs["zerolaunch"][case]
    for held in ours["held"]:  # each rank's inference engine, all it holds
        assert 0 < held["engine"] <= 0.6 * ours["whole_bytes"], (held, ours["whole_bytes"])
        # between forwards no param of the reference keeps a whole copy alive
        assert held["storage"] <= 0.6 * ours["whole_bytes"], (held, ours["whole_bytes"])


def test_stage2_reference_model_is_whole_on_every_rank(runs):
    ours = runs["zerolaunch"]["explicit_stage2"]
    assert [held["storage"] for held in ours["held"]] == [ours["whole_bytes"]] * 2


def test_peft_reference_base_is_sharded(runs):
    ours = runs["zerolaunch"]["peft"]
    assert ours["ref_type"] == "NoneType"  # TRL runs the policy with its adapter disabled
    for held in ours["held"]:
        assert 0 < held["params"] <= 0.6 * ours["whole_bytes"], (held, ours["whole_bytes"])
