"""zerolaunch.models.hf and api.save_hf_pretrained in one process (world size 1).

Covers: from_config with strict keys, from a local directory, the errors for missing paths, the ZeRO-3 unit
classes, meta-device builds, and that save_hf_pretrained writes a directory `from_pretrained` loads with the
same logits (tied and untied embeddings, one file and sharded). Leaves out: several ranks (tests/e2e).
"""

import json

import pytest
import torch

pytest.importorskip("transformers")

from transformers import AutoModelForCausalLM  # noqa: E402

import zerolaunch  # noqa: E402
from zerolaunch.api import save_hf_pretrained  # noqa: E402
from zerolaunch.models import hf  # noqa: E402
from zerolaunch.zero import EngineOptions, OptimizerOptions  # noqa: E402

TINY_LLAMA = {
    "model_type": "llama",
    "vocab_size": 256,
    "hidden_size": 32,
    "intermediate_size": 48,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 64,
}


def test_from_config_builds_the_sizes_asked():
    model = hf.build(config=TINY_LLAMA)
    assert type(model).__name__ == "LlamaForCausalLM"
    assert model.config.hidden_size == 32 and len(model.model.layers) == 2
    assert model.config.use_cache is False
    assert hf.unit_class_names(model) == ("LlamaDecoderLayer",)
    x = torch.randint(0, 256, (2, 8))
    assert model(input_ids=x, labels=x).loss.isfinite()


def test_gpt2_config_and_bf16():
    model = hf.build(
        config={
            "model_type": "gpt2",
            "n_embd": 16,
            "n_layer": 1,
            "n_head": 2,
            "vocab_size": 64,
            "n_positions": 32,
            "bos_token_id": 0,
            "eos_token_id": 0,
        },
        dtype="bf16",
    )
    assert hf.unit_class_names(model) == ("GPT2Block",)
    assert next(model.parameters()).dtype == torch.bfloat16


def test_meta_build_allocates_nothing():
    model = hf.build(config=TINY_LLAMA, meta=True)
    assert all(p.is_meta for p in model.parameters())


def test_misspelled_config_key_and_model_type():
    with pytest.raises(
        ValueError,
        match=r"model.args.config.hiden_size: LlamaConfig has no such field; did you mean 'hidden_size'",
    ):
        hf.build(config={**TINY_LLAMA, "hiden_size": 8})
    with pytest.raises(ValueError, match="'lama' is not a model type.*did you mean llama"):
        hf.build(config={"model_type": "lama"})
    with pytest.raises(ValueError, match="needs a model_type"):
        hf.build(config={"hidden_size": 8})


def test_path_xor_config_and_missing_paths(tmp_path):
    with pytest.raises(ValueError, match="exactly one of path"):
        hf.build()
    with pytest.raises(ValueError, match="exactly one of path"):
        hf.build(path=str(tmp_path), config=TINY_LLAMA)
    with pytest.raises(FileNotFoundError, match="never downloads"):
        hf.build(path="meta-llama/Llama-3.2-1B")
    with pytest.raises(FileNotFoundError, match="has no config.json"):
        hf.build(path=str(tmp_path))


def _trained(tie: bool, steps: int = 3):
    torch.manual_seed(0)
    model = hf.build(config={**TINY_LLAMA, "tie_word_embeddings": tie})
    engine = zerolaunch.initialize(model, EngineOptions(optimizer=OptimizerOptions(lr=1e-2)))
    x = torch.randint(0, 256, (2, 12))
    losses = []
    for _ in range(steps):
        out = engine({"input_ids": x, "labels": x})
        engine.backward(out)
        assert engine.step().stepped
        losses.append(out.loss.item())
    assert steps == 1 or losses[-1] < losses[0]
    return engine, x


@pytest.mark.parametrize("tie", [True, False])
def test_save_hf_pretrained_reloads_with_identical_logits(tmp_path, tie):
    engine, x = _trained(tie)
    out = save_hf_pretrained(engine, tmp_path / "hf")
    assert sorted(p.name for p in out.iterdir()) == [
        "config.json",
        "generation_config.json",
        "model.safetensors",
    ]
    reloaded = AutoModelForCausalLM.from_pretrained(out)
    assert (reloaded.lm_head.weight is reloaded.model.embed_tokens.weight) == tie
    with torch.no_grad():
        want = engine.module(input_ids=x).logits
        got = reloaded(input_ids=x).logits
    assert torch.equal(want, got)
    # the directory also loads through the builder, as a recipe's model.args.path
    rebuilt = hf.build(path=str(out))
    with torch.no_grad():
        assert torch.equal(rebuilt(input_ids=x).logits, want)


def test_save_hf_pretrained_shards_with_an_index(tmp_path):
    engine, x = _trained(tie=False, steps=1)
    out = save_hf_pretrained(engine, tmp_path / "hf", max_shard_bytes=20_000)
    index = json.loads((out / "model.safetensors.index.json").read_text())
    files = sorted(set(index["weight_map"].values()))
    assert len(files) > 2 and not (out / "model.safetensors").exists()
    assert all((out / f).is_file() for f in files)
    reloaded = AutoModelForCausalLM.from_pretrained(out)
    with torch.no_grad():
        assert torch.equal(reloaded(input_ids=x).logits, engine.module(input_ids=x).logits)


def test_save_hf_pretrained_bf16_writes_bf16_and_config_dtype(tmp_path):
    engine, x = _trained(tie=True, steps=1)
    out = save_hf_pretrained(engine, tmp_path / "hf", dtype=torch.bfloat16)
    config = json.loads((out / "config.json").read_text())
    assert config.get("dtype", config.get("torch_dtype")) == "bfloat16"
    reloaded = AutoModelForCausalLM.from_pretrained(out, dtype=torch.bfloat16)
    assert next(reloaded.parameters()).dtype == torch.bfloat16


def test_save_hf_pretrained_rejects_other_models(tmp_path):
    engine = zerolaunch.initialize(torch.nn.Linear(3, 4), EngineOptions())
    with pytest.raises(ValueError, match="needs a transformers PreTrainedModel"):
        save_hf_pretrained(engine, tmp_path)


def test_meta_model_under_zero3_gets_hf_init_and_saves_exactly(tmp_path):
    from zerolaunch.zero import ZeroOptions

    torch.manual_seed(0)
    model = hf.build(config={**TINY_LLAMA, "tie_word_embeddings": True}, meta=True)
    options = EngineOptions(
        zero=ZeroOptions(stage=3, stage3_param_persistence_threshold=0), optimizer=OptimizerOptions(lr=1e-2)
    )
    engine = zerolaunch.initialize(model, options)
    assert engine.options.zero.stage3_units == ("LlamaDecoderLayer",)
    full = dict(engine.engine.iter_full_state())
    # HF's init, not torch's defaults: normal(0, 0.02) weights, RMSNorm gains at 1, rotary table computed
    assert abs(full["model.layers.0.mlp.up_proj.weight"].std().item() - 0.02) < 0.004
    assert torch.equal(full["model.norm.weight"], torch.ones(32))
    assert torch.equal(
        engine.module.model.rotary_emb.inv_freq, hf.build(config=TINY_LLAMA).model.rotary_emb.inv_freq
    )
    x = torch.randint(0, 256, (2, 12))
    losses = []
    for _ in range(3):
        out = engine({"input_ids": x, "labels": x})
        engine.backward(out)
        engine.step()
        losses.append(out.loss.item())
    assert losses[-1] < losses[0]
    reloaded = AutoModelForCausalLM.from_pretrained(save_hf_pretrained(engine, tmp_path / "hf"))
    # stage 3 forward runs with grad enabled here (its gather under torch.no_grad is the engine's business)
    want = engine({"input_ids": x}).logits.detach()
    with torch.no_grad():
        assert torch.equal(reloaded(input_ids=x).logits, want)
