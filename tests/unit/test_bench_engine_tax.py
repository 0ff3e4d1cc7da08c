"""bench/engine_tax.py on the CPU at a tiny size, eager, world size 1.

Covers: every row builds from the bench's own GPT (not zerolaunch.models.gpt) and from a tiny HF Llama, trains
two steps from the same weights on the same batches, and the zerolaunch rows hold the precision their name says
(pure bf16: a bf16 master; otherwise the fp32 master); a row and its torch twin agree on the losses (same
weights, same AdamW, same clip), to bf16's tolerance. Leaves out: CUDA timing, torch.compile, the profile.
"""

from __future__ import annotations

import argparse
import math

import pytest
import torch
from _helpers import load_bench_script

SEQ, MICRO = 16, 2


@pytest.fixture(scope="module")
def tax():
    return load_bench_script("engine_tax")


def _args(model: str) -> argparse.Namespace:
    return argparse.Namespace(model=model, size="1.3b", tiny=True, eager=True, seq_len=SEQ, micro_batch=MICRO)


def _losses(tax, row: str, model: str) -> list[float]:
    step, _, engine = tax.build_step(row, _args(model), torch.device("cpu"))
    if row == "zl-z3-resident":  # every param persistent: nothing gathered, no forward hook
        assert engine.engine.forward_hooks_free
    if engine is not None:  # [Note: bf16 master]: pure bf16 keeps a bf16 master, else fp32
        assert engine.engine.master_dtype == (torch.bfloat16 if row.endswith("-bf16") else torch.float32)
    g = torch.Generator().manual_seed(0)
    vocab = 512
    data = torch.randint(0, vocab, (3, MICRO, SEQ + 1), generator=g)
    return [float(step({"input_ids": d[:, :-1], "labels": d[:, 1:]}).detach().float()) for d in data]


@pytest.mark.parametrize("model", ["gpt", "hf-llama"])
def test_rows_train_alike(tax, group, torchrun_env, model):
    if model == "hf-llama":
        pytest.importorskip("transformers")
    losses = {
        row: _losses(tax, row, model)
        for row in ("torch-bf16", "zl-z2-bf16", "zl-z3-bf16", "torch-amp", "zl-z2", "zl-z3-resident")
    }
    for row, seq in losses.items():
        assert all(math.isfinite(x) for x in seq), row
        assert abs(seq[0] - math.log(512)) < 1.0, row  # random init over 512 ids
    # the same weights and update as the torch twin: only bf16 rounding apart
    twins = (("zl-z2-bf16", "torch-bf16"), ("zl-z3-bf16", "torch-bf16"), ("zl-z2", "torch-amp"))
    for row, twin in (*twins, ("zl-z3-resident", "torch-amp")):
        assert losses[row] == pytest.approx(losses[twin], abs=3e-2), row


def test_own_gpt_is_not_the_projects(tax):
    model, vocab = tax.build_model(_args("gpt"))
    assert type(model).__module__ != "zerolaunch.models.gpt"
    assert vocab == 512
    assert model.head.weight is model.wte.weight  # tied, as GPT-2
