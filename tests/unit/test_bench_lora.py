"""bench/lora.py on the CPU at its tiny Llama shape, world size 1 (gloo).

Covers: the zl-z3 row (zerolaunch.initialize at stage 3 on a meta-built PeftModel), the fsdp2 row (FSDP2 +
PEFT as accelerate prepares it), fsdp2-offp (the same with CPUOffloadPolicy, each group built and sharded in
turn) and the ds-z3 row (DeepSpeed ZeRO-3, built under zero.Init; when deepspeed is
installed) build the same LoRA model, count the adapter's params as LoRA's formula does, train three steps with
finite losses, step only the adapter (every base weight keeps its value, the adapter's move), and agree on the
first loss and the base's weights (name-seeded, whichever engine draws them; LoRA's B = 0: the first loss is
the base's). Leaves out: the zl/ds -offp rows, CUDA timing and memory peaks, the driver's subprocesses.
"""

from __future__ import annotations

import argparse
import importlib.util
import math
import sys

import pytest
import torch
from _helpers import ONE_RANK_TORCHRUN_ENV, load_bench_script, one_rank_group

pytest.importorskip("peft")
pytest.importorskip("transformers")

SEQ, STEPS = 32, 3
HAS_DS = importlib.util.find_spec("deepspeed") is not None
ROWS = ("zl-z3", "fsdp2", "fsdp2-offp", *(("ds-z3",) if HAS_DS else ()))


@pytest.fixture(scope="module")
def lora():
    return load_bench_script("lora")


def _lora_params_expected(lora) -> int:
    """LoRA's count, from the shape alone: r * (in + out) for each adapted linear layer of each decoder layer."""
    c = lora.SIZES["tiny"]
    h, i = c["hidden_size"], c["intermediate_size"]
    kv = c["num_key_value_heads"] * h // c["num_attention_heads"]
    shapes = [(h, h), (h, kv), (h, kv), (h, h), (h, i), (h, i), (i, h)]  # q k v o gate up down
    return c["num_hidden_layers"] * sum(lora.LORA["r"] * (a + b) for a, b in shapes)


def _train(lora, row: str):
    args = argparse.Namespace(size="tiny", seq_len=SEQ, micro_batch=1)
    step, state, info = lora.build_row(row, args, torch.device("cpu"))
    before = state()
    g = torch.Generator().manual_seed(0)
    data = torch.randint(0, lora.SIZES["tiny"]["vocab_size"], (STEPS, 1, SEQ), generator=g)
    losses = [float(step({"input_ids": d, "labels": d}).detach()) for d in data]
    return losses, before, state(), info


@pytest.fixture(scope="module")
def runs(lora, tmp_path_factory):
    with one_rank_group(tmp_path_factory.mktemp("store")), pytest.MonkeyPatch.context() as mp:
        for k, v in ONE_RANK_TORCHRUN_ENV.items():
            mp.setenv(k, v)
        if HAS_DS:
            mp.setenv("DS_ACCELERATOR", "cpu")
            import deepspeed.comm.torch  # noqa: F401  (the attribute path is shadowed by `torch`)

            # as tests/dist/_ds_ranks.py: no JIT-built shared-memory all-reduce; gloo is all one rank needs
            mp.setattr(sys.modules["deepspeed.comm.torch"], "build_shm_op", lambda: None)
        yield {row: _train(lora, row) for row in ROWS}


@pytest.mark.parametrize("row", ["zl-z3", "fsdp2", "fsdp2-offp", "ds-z3"])
def test_row_trains_the_adapter_only(lora, runs, row):
    if row not in runs:
        pytest.skip("deepspeed is not installed")
    losses, before, after, info = runs[row]
    assert all(math.isfinite(x) for x in losses), losses
    assert abs(losses[0] - math.log(lora.SIZES["tiny"]["vocab_size"])) < 0.5  # random init over 512 ids
    assert info["trainable_params"] == _lora_params_expected(lora)
    assert info["total_params"] > 4 * info["trainable_params"]
    adapter = [k for k in before if "lora_" in k]
    base = [k for k in before if "lora_" not in k]
    assert len(adapter) == 2 * 7 * lora.SIZES["tiny"]["num_hidden_layers"] and base
    assert all(torch.equal(before[k], after[k]) for k in base), "a frozen base weight changed"
    assert all(not before[k].any() for k in adapter if "lora_B" in k), "LoRA's B starts at zero"
    assert any(not torch.equal(before[k], after[k]) for k in adapter if "lora_B" in k)
    assert any(not torch.equal(before[k], after[k]) for k in adapter if "lora_A" in k)


def test_rows_agree_on_the_base(runs):
    """Same base weights (seeded by name, whichever engine initializes them), LoRA's B = 0: one first loss."""
    zl = runs["zl-z3"]
    for row in ROWS[1:]:
        assert runs[row][0][0] == pytest.approx(zl[0][0], abs=2e-3), row

    def base(state):
        return {
            k.replace("base_model.model.", "").replace(".base_layer", ""): v
            for k, v in state.items()
            if "lora_" not in k
        }

    zb = base(zl[1])
    for row in ROWS[1:]:
        other = base(runs[row][1])
        assert other.keys() == zb.keys(), row
        assert all(torch.equal(zb[k], other[k]) for k in zb), row
