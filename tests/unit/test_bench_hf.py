"""bench/run.py's Hugging Face rows (--model hf-llama-1b) on the CPU at a tiny Llama size, world size 1.

Covers: build_step for an HF model (the plain torch row in bf16, FSDP2 per decoder layer, zerolaunch stage 2,
and stage 3 built on meta with the decoder layers as units and HF's own init), two steps each with the model's own loss (labels =
input_ids), the batches the bench feeds it, the FLOPs per token the table uses (hf_flops_per_token of the
config) and the size column's label. Leaves out: CUDA timing, the compiled rows (bench/run.py on
the GPU), the 1B size itself.
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

pytest.importorskip("transformers")

from _helpers import tiny_llama  # noqa: E402

from zerolaunch.report.mfu import hf_flops_per_token  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
TINY = tiny_llama(vocab_size=256, num_hidden_layers=2, max_position_embeddings=64, tie_word_embeddings=False)
SEQ = 16


def test_hf_llama_1b_is_the_recipe_shape(bench):
    import yaml

    recipe = yaml.safe_load((ROOT / "recipes" / "hf-llama-1b.yaml").read_text())
    label, config = bench.HF_MODELS["hf-llama-1b"]
    assert label == "llama-1b"
    assert config == recipe["model"]["args"]["config"]
    assert recipe["model"]["args"]["attn_implementation"] == "sdpa"


@pytest.mark.parametrize(
    "engine", ["torch", "fsdp2", "zl-z2", "zl-z3", "zl-z2-fused", "zl-z3-fused", "zl-z3-purebf16"]
)
def test_hf_rows_build_and_step_on_cpu(bench, group, torchrun_env, monkeypatch, engine):
    monkeypatch.setitem(bench.HF_MODELS, "hf-tiny", ("llama-tiny", TINY))
    step, make, parts = bench.build_step(engine, "llama-tiny", SEQ, model_name="hf-tiny", device="cpu")
    if engine.startswith("zl-"):
        assert parts["engine"].shards.fused_step is engine.endswith("-fused")
        pure = engine.endswith("-purebf16")  # [Note: bf16 master]
        assert parts["engine"].master_dtype == (torch.bfloat16 if pure else torch.float32)
    if engine == "zl-z3":
        eng = parts["engine"]
        assert eng.options.zero.stage3_units == ("LlamaDecoderLayer",)
        # HF's init unit by unit (normal(0, 0.02)), not torch's defaults on the meta-built model
        up = dict(eng.iter_full_state())["model.layers.0.mlp.up_proj.weight"]
        assert abs(up.float().std().item() - 0.02) < 0.006
    elif engine == "fsdp2":
        from torch.distributed.fsdp import FSDPModule

        # fully_shard per decoder layer, then the root
        assert all(isinstance(m, FSDPModule) for m in [*parts["module"].model.layers, parts["module"]])
    elif engine == "torch":
        assert next(parts["module"].parameters()).dtype == torch.bfloat16
    batches = bench._batches(TINY["vocab_size"], SEQ, 2, 2, torch.device("cpu"), hf=True)
    assert torch.equal(batches[0]["labels"], batches[0]["input_ids"])
    assert batches[0]["input_ids"].shape == (2, SEQ)
    losses = [float(step(b).detach().float()) for b in batches]
    assert all(math.isfinite(x) for x in losses)
    # random init over 256 ids: the first loss is near ln(256)
    assert abs(losses[0] - math.log(256)) < 1.0
    flops, n_params = bench._reference(make, "hf-tiny", SEQ)
    assert flops == hf_flops_per_token(TINY, SEQ)
    assert n_params == sum(p.numel() for p in make().parameters())
