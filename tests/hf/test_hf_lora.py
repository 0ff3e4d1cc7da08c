"""`zero_trainer(trl.SFTTrainer)` with a LoRA `peft_config` at ZeRO stages 2 and 3 against stock SFTTrainer's
data-parallel run (DDP through accelerate), and the adapter folders it writes.

Runs tests/hf/_hf_run.py `sft_lora` under both (2 CPU gloo ranks, fp32, a tiny Llama saved as the base folder,
LoRA r=4 on every linear layer, 5 steps with accumulation 2, a checkpoint every 3 steps). Checks: every logged
loss and grad norm to 1e-5 relative; `save_model` and `checkpoint-3/` hold what PEFT's save_pretrained writes
(adapter_config.json + adapter_model.safetensors, adapter keys only, the stock run's names and values to
1e-5); AutoPeftModelForCausalLM loads the folder with those adapter weights over the unchanged base; and a
stage-3 run stopped after checkpoint-3 and resumed from it ends bit-equal to the unbroken one.
Not covered: other PEFT methods than LoRA, several adapters, dropout (its RNG draws differ by design).
"""

from __future__ import annotations

import _hf_run
import pytest
import torch

pytest.importorskip("trl")
pytest.importorskip("peft")
pytest.importorskip("transformers", minversion="5.17")  # the Trainer hooks zerolaunch.hf replaces

STAGES = [2, 3, 0]  # 0: a PeftModel handed to the trainer


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    out = _hf_run.run("sft_lora", ("ddp", "zerolaunch"), tmp_path_factory.mktemp("hf_lora"))
    return {"ddp": out["ddp"]["ddp"], **out["zerolaunch"]}


def _close(ours: dict, ref: dict) -> None:
    assert sorted(ours) == sorted(ref)
    for name, expected in ref.items():
        torch.testing.assert_close(ours[name], expected, rtol=1e-5, atol=1e-5 * expected.abs().max().item())


@pytest.mark.parametrize("stage", STAGES)
def test_losses_and_grad_norms_equal_ddp(runs, stage):
    ours, ref = runs[f"stage{stage}"], runs["ddp"]
    assert len(ref["loss"]) == 5
    torch.testing.assert_close(torch.tensor(ours["loss"]), torch.tensor(ref["loss"]), rtol=1e-5, atol=0)
    torch.testing.assert_close(
        torch.tensor(ours["grad_norm"]), torch.tensor(ref["grad_norm"]), rtol=1e-5, atol=0
    )


@pytest.mark.parametrize("folder", ["final", "checkpoint"])
@pytest.mark.parametrize("stage", STAGES)
def test_adapter_folder_as_peft_writes_it(runs, stage, folder):
    ours, ref = runs[f"stage{stage}"][folder], runs["ddp"][folder]
    assert "adapter_config.json" in ours["files"] and "adapter_model.safetensors" in ours["files"]
    assert "model.safetensors" not in ours["files"]
    # the optimizer state is in the engine's checkpoint (zerolaunch/), not in optimizer.pt
    assert set(ref["files"]) - {"optimizer.pt"} <= set(ours["files"])
    assert ref["weights"], "the stock run saved no adapter weights"
    assert all("lora_" in k and ".default." not in k for k in ref["weights"])
    _close(ours["weights"], ref["weights"])
    assert _config(ours["config"]) == _config(ref["config"])


def _config(config: dict) -> dict:
    """adapter_config.json less the base folder's path (each run's own temp folder); target_modules is a set
    PEFT writes in hash order."""
    out = {k: v for k, v in config.items() if k != "base_model_name_or_path"}
    if isinstance(out.get("target_modules"), list):
        out["target_modules"] = sorted(out["target_modules"])
    return out


@pytest.mark.parametrize("stage", STAGES)
def test_engine_checkpoint_beside_the_adapter(runs, stage):
    assert "zerolaunch" in runs[f"stage{stage}"]["checkpoint_files"]


@pytest.mark.parametrize("stage", STAGES)
def test_peft_loads_the_folder(runs, stage):
    final = runs[f"stage{stage}"]["final"]
    _close(final["loaded"], final["weights"])
    # B starts at zero: a loaded B that is not zero came from the file
    assert max(v.abs().max().item() for k, v in final["loaded"].items() if "lora_B" in k) > 1e-4
    initial = _hf_run.tiny_llama().state_dict()
    base = {k.replace(".base_layer", ""): v for k, v in final["loaded_base"].items()}
    for name, expected in initial.items():
        assert torch.equal(base[name], expected), name


def test_resumed_equals_unbroken_stage3(runs):
    unbroken, resumed = runs["stage3"], runs["resumed"]
    assert resumed["loss"][-2:] == unbroken["loss"][-2:]
    for name, expected in unbroken["final"]["weights"].items():
        assert torch.equal(resumed["final"]["weights"][name], expected), name
