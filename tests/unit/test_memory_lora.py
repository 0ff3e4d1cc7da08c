"""estimate-memory's LoRA shapes (memory/lora.py): the adapter's count and the rows it gives, held to PEFT itself.

Tests: the adapter count r*(in+out) per targeted layer, written out here from the layers' sizes (the built-in
GPT's, the --params stand-in's); all-linear leaving out the output head; every row (GPU and host states,
gathered units, nvme, peak) of the torch-free adapter equal to the rows of PEFT's get_peft_model applied on
the meta device (a tiny HF Llama with all-linear, the tiny GPT with named targets) at 1 and 4 ranks; stage 3
holding 1/N of the frozen base; an unknown target refused with a did-you-mean. Leaves out: the engine's own
bytes (test_memory_engine.py) and the CLI (tests/e2e/test_estimate_lora.py).
"""

from __future__ import annotations

import dataclasses

import pytest
import torch
from _estimate_setup import bf16_setup

from zerolaunch.memory import EstimateError, estimate, synthetic_gpt
from zerolaunch.memory.lora import with_lora
from zerolaunch.memory.shape import from_gpt_size, from_module

peft = pytest.importorskip("peft")


def _tiny_gpt_meta():
    from zerolaunch.models.gpt import build

    with torch.device("meta"):
        return build(size="tiny", vocab_size=97, seq_len=19)


def _tiny_llama_meta():
    transformers = pytest.importorskip("transformers")
    config = transformers.LlamaConfig(
        vocab_size=97,
        hidden_size=32,
        intermediate_size=88,
        num_hidden_layers=3,
        num_attention_heads=4,
        num_key_value_heads=2,
        tie_word_embeddings=False,
    )
    with torch.device("meta"):
        return transformers.LlamaForCausalLM(config)


def _peft_on_meta(model, **lora):
    with torch.device("meta"):
        return peft.get_peft_model(model, peft.LoraConfig(**lora))


def test_adapter_count_is_rank_times_in_plus_out_of_every_targeted_layer():
    d, ff, r = (
        64,
        256,
        5,
    )  # the tiny GPT: 2 blocks of qkv (d -> 3d), attn.proj (d -> d), fc (d -> ff), proj (ff -> d)
    base = from_gpt_size("tiny", vocab_size=97, seq_len=19)
    every = with_lora(base, r)
    assert every.numel == 2 * r * ((d + 3 * d) + (d + d) + (d + ff) + (ff + d))
    assert every.frozen_numel == base.numel  # the whole base, lm_head tied to wte included once
    named = with_lora(base, r, ("qkv", "fc"))
    assert named.numel == 2 * r * ((d + 3 * d) + (d + ff))
    # the adapters sit in their block's unit: two per targeted layer, none in the root
    assert [sum(".lora_" in n for n in u.param_names) for u in named.units] == [0, 4, 4]


def test_params_stand_in_takes_an_adapter_on_its_blocks():
    shape = synthetic_gpt(7 * 10**9)
    d, layers, r = shape.arch.d_model, shape.arch.n_layer, 16
    lora = with_lora(shape, r)
    assert lora.numel == layers * r * ((d + 3 * d) + (d + d) + (d + 4 * d) + (4 * d + d))
    assert lora.frozen_numel == 7 * 10**9


def test_all_linear_leaves_out_the_output_head():
    shape = from_module(_tiny_llama_meta(), source="llama")
    heads = [lin.module for lin in shape.linears if lin.head]
    assert heads == ["lm_head"]
    adapted = {n.rsplit(".lora_", 1)[0] for n in (s.name for s in with_lora(shape, 2).specs)}
    assert "lm_head" not in adapted and len(adapted) == 3 * 7  # q, k, v, o, gate, up, down per layer


def _rows(shape, world: int):
    setup = bf16_setup(
        gpus_per_node=world,
        dtype="bf16",
        stage3_param_persistence_threshold=300,  # some adapters and norms stay resident
        reduce_bucket_size=2000,
        gpu_memory_bytes=2**30,
    )
    fields = ("gpu", "host", "nvme_bytes", "buffer_peak_bytes", "gpu_total_bytes", "gpu_total_ckpt_bytes")
    return [(r.label, *(getattr(r, f) for f in fields)) for r in estimate(shape, setup).rows]


@pytest.mark.parametrize("world", [1, 4])
@pytest.mark.parametrize("model", ["llama", "gpt"])
def test_rows_equal_those_of_peft_on_the_meta_model(model, world):
    if model == "llama":
        build, targets, peft_targets = _tiny_llama_meta, None, "all-linear"
    else:
        build, targets, peft_targets = _tiny_gpt_meta, ("qkv", "fc"), ["qkv", "fc"]
    ours = with_lora(from_module(build(), source=model), 3, targets)
    theirs = from_module(_peft_on_meta(build(), r=3, target_modules=peft_targets), source=model)
    assert ours.numel == theirs.numel and ours.frozen_numel == theirs.frozen_numel
    assert _rows(ours, world) == _rows(theirs, world)


def test_stage3_holds_a_quarter_of_the_frozen_base_on_four_ranks():
    shape = with_lora(from_gpt_size("tiny", vocab_size=97, seq_len=19), 2)
    setup = bf16_setup(dtype="bf16", stage3_param_persistence_threshold=0)
    one = estimate(shape, setup).row(3)
    four = estimate(shape, dataclasses.replace(setup, gpus_per_node=4)).row(3)
    # no offload: the trainable buckets gather from the master, so "params" is the frozen shard alone
    assert one.gpu["params"] == 2 * shape.frozen_numel
    assert four.gpu["params"] <= 2 * shape.frozen_numel / 4 + 2 * 4 * len(shape.units)  # + padding
    # stages 0-2 keep the frozen base whole in the compute dtype on every rank
    assert estimate(shape, dataclasses.replace(setup, gpus_per_node=4)).row(2).gpu["params"] >= (
        2 * shape.frozen_numel
    )


def test_unknown_target_is_refused_with_a_did_you_mean():
    shape = from_gpt_size("tiny", vocab_size=97, seq_len=19)
    with pytest.raises(EstimateError, match="Did you mean qkv"):
        with_lora(shape, 4, ("qvk",))
    with pytest.raises(EstimateError, match="--lora-rank"):
        with_lora(shape, 0)
