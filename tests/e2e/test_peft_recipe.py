"""`zerolaunch train` with a `peft:` block over a local HF model folder, and `convert-checkpoint` of its run.

2 gloo CPU ranks at ZeRO-3, a tiny Llama base saved with save_pretrained, LoRA r=4 on q_proj/v_proj, byte
text. Checks: the run trains only the adapter; convert-checkpoint writes PEFT's adapter folder, which
AutoPeftModelForCausalLM loads over the untouched base; `--merge-adapter` writes a plain HF folder whose
weights are W + (alpha / r) B @ A (computed here from the adapter file and the base folder) and whose
logits equal the loaded PeftModel's; a target module the model lacks is refused before training (exit 2,
with a did-you-mean). Not covered: modules_to_save, bias training, GPUs.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch
from _helpers import run_zerolaunch, save_tiny_llama_base

pytest.importorskip("peft")
pytest.importorskip("transformers")

REPO = Path(__file__).resolve().parents[2]
STEPS = 4
R, ALPHA = 4, 8

pytestmark = pytest.mark.e2e

RECIPE = f"""
model:
  builder: zerolaunch.models.hf:build
  args: {{path: base}}
data:
  builder: zerolaunch.data.hf_text:build
  args: {{path: corpus.jsonl, seq_len: 32}}
train: {{steps: {STEPS}, micro_batch_size: 2, lr: 1.0e-2, warmup_steps: 0, log_every: 1, seed: 7}}
peft: {{r: {R}, lora_alpha: {ALPHA}, target_modules: [q_proj, v_proj]}}
deepspeed:
  zero_optimization: {{stage: 3}}
"""


def _cli(*args, cwd):
    return run_zerolaunch(*args, cwd=cwd, timeout=300)


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("peft_run")
    save_tiny_llama_base(tmp / "base", num_hidden_layers=2)
    lines = [json.dumps({"text": f"line {i}: a lazy dog sleeps under the tree."}) for i in range(200)]
    (tmp / "corpus.jsonl").write_text("\n".join(lines) + "\n")
    (tmp / "lora.yaml").write_text(RECIPE)
    proc = _cli("train", "lora.yaml", "--cpu", "2", "--run-dir", str(tmp / "run"), cwd=tmp)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    return tmp


def _x():
    text = b"line 7: a lazy dog sleeps under the tree. line 8: a"
    return torch.tensor([list(text[:32]), list(text[8:40])])


def test_adapter_folder_loads_with_peft(run, tmp_path):
    from peft import AutoPeftModelForCausalLM
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    out = tmp_path / "adapter"
    proc = _cli("convert-checkpoint", str(run / "run" / "checkpoints"), str(out), cwd=run)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert {"adapter_config.json", "adapter_model.safetensors"} <= set(os.listdir(out))
    assert "model.safetensors" not in os.listdir(out)
    config = json.loads((out / "adapter_config.json").read_text())
    assert (config["r"], config["lora_alpha"]) == (R, ALPHA)
    assert sorted(config["target_modules"]) == ["q_proj", "v_proj"]
    weights = load_file(out / "adapter_model.safetensors")
    assert len(weights) == 2 * 2 * 2  # 2 layers x (q, v) x (A, B)
    assert all("lora_" in k and ".default." not in k for k in weights)
    assert max(v.abs().max().item() for k, v in weights.items() if "lora_B" in k) > 1e-4  # trained
    loaded = AutoPeftModelForCausalLM.from_pretrained(out)
    base = AutoModelForCausalLM.from_pretrained(run / "base")
    for name, tensor in base.state_dict().items():
        path = name.replace("q_proj.", "q_proj.base_layer.").replace("v_proj.", "v_proj.base_layer.")
        assert torch.equal(loaded.get_base_model().state_dict()[path], tensor), name


def test_merged_folder_is_w_plus_scaled_ba(run, tmp_path):
    from peft import AutoPeftModelForCausalLM
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    adapter, merged = tmp_path / "adapter", tmp_path / "merged"
    ckpt = str(run / "run" / "checkpoints")
    for out, extra in ((adapter, ()), (merged, ("--merge-adapter",))):
        proc = _cli("convert-checkpoint", ckpt, str(out), *extra, cwd=run)
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    lora = load_file(adapter / "adapter_model.safetensors")
    base = load_file(run / "base" / "model.safetensors")
    out = load_file(merged / "model.safetensors")
    assert sorted(out) == sorted(base)
    for name, w in base.items():
        prefix = "base_model.model." + name.removesuffix(".weight")
        if f"{prefix}.lora_A.weight" in lora:
            a, b = lora[f"{prefix}.lora_A.weight"], lora[f"{prefix}.lora_B.weight"]
            expected = w + (b @ a) * (ALPHA / R)
        else:
            expected = w
        torch.testing.assert_close(out[name], expected, rtol=1e-6, atol=1e-6)
    x = _x()
    with torch.no_grad():
        want = AutoPeftModelForCausalLM.from_pretrained(adapter)(input_ids=x).logits
        got = AutoModelForCausalLM.from_pretrained(merged)(input_ids=x).logits
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_missing_target_module_refused_before_training(run, tmp_path):
    (run / "typo.yaml").write_text(RECIPE.replace("[q_proj, v_proj]", "[q_proj, v_projj]"))
    proc = _cli("train", "typo.yaml", "--cpu", "2", "--run-dir", str(tmp_path / "typo"), cwd=run)
    assert proc.returncode == 2, proc.stdout[-3000:] + proc.stderr[-3000:]
    text = proc.stdout + proc.stderr
    assert "v_projj" in text and "Did you mean `v_proj`" in text
    assert "Traceback" not in text


def test_merge_adapter_needs_a_folder_output(run, tmp_path):
    ckpt = str(run / "run" / "checkpoints")
    proc = _cli("convert-checkpoint", ckpt, str(tmp_path / "m.safetensors"), "--merge-adapter", cwd=run)
    assert proc.returncode == 2, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "--merge-adapter" in proc.stdout + proc.stderr and "folder" in proc.stdout + proc.stderr
    assert not (tmp_path / "m.safetensors").exists()
