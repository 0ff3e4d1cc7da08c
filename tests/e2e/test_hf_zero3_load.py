"""A save_pretrained Llama loaded under ZeRO-3 on 2 CPU gloo ranks, unit by unit from its safetensors shards.

Covers: `zerolaunch.initialize` on a `hf.build(path=..., meta=True)` model gives the logits of plain
from_pretrained exactly (fp32) on every rank, and the largest transient init buffer is one unit, not the model.
Leaves out: GPUs, the CLI (test_hf_train.py runs the loop).
"""

import sys
from pathlib import Path

import pytest
import torch

pytest.importorskip("transformers")

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "dist"))
from _helpers import tiny_llama  # noqa: E402
from _spawn import run_ranks  # noqa: E402

LLAMA = tiny_llama()


def _load_and_forward(rank, world_size, path):
    import zerolaunch
    from zerolaunch.models import hf
    from zerolaunch.zero import EngineOptions
    from zerolaunch.zero.options import ZeroOptions

    model = hf.build(path=path, meta=True)
    options = EngineOptions(zero=ZeroOptions(stage=3, stage3_param_persistence_threshold=0))
    engine = zerolaunch.initialize(model, options, device="cpu")
    n_params = sum(p.numel() for p in {id(p): p for p in model.parameters()}.values())
    ids = torch.randint(0, 64, (2, 8), generator=torch.Generator().manual_seed(1))
    engine.module.eval()
    with torch.no_grad():
        logits = engine(input_ids=ids).logits
    return logits, engine.engine.sharding.init_peak_numel, n_params


def test_two_ranks_load_unit_by_unit_with_from_pretrained_logits(tmp_path):
    from transformers import AutoModelForCausalLM

    from zerolaunch.models import hf

    torch.manual_seed(0)
    out = tmp_path / "model"
    hf.build(config=LLAMA).save_pretrained(out, max_shard_size="20KB")
    assert (out / "model.safetensors.index.json").is_file()
    plain = AutoModelForCausalLM.from_pretrained(out, local_files_only=True).eval()
    ids = torch.randint(0, 64, (2, 8), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        want = plain(input_ids=ids).logits
    results = run_ranks(_load_and_forward, 2, str(out), timeout_s=120)
    layer = sum(p.numel() for p in plain.model.layers[0].parameters())
    root = sum(p.numel() for p in plain.parameters()) - 4 * layer
    for logits, peak_numel, n_params in results:
        assert torch.equal(logits, want)
        # one unit's fp32 init buffer at a time (padding to the world size aside), never the whole model.
        assert peak_numel <= max(layer, root) + 2 and peak_numel < n_params
