"""The built-in loop normalizes the loss over the whole global batch ([Note: global loss normalization]).

Two ranks x two accumulated micro-batches whose labelled-token counts differ widely (2, 32, 7, 0): after one
SGD step (lr 1, no clipping, no weight decay) the weights equal those of one process taking the gradient of
sum(token losses) / (all labelled tokens) over the four micro-batches at once, and the reported loss is
that mean. The reference is plain torch (F.cross_entropy on the model's logits), and the test also checks
that the per-micro-batch mean would have given other weights, so it can fail. Leaves out: HF models (the
same num_items_in_batch path, tests/unit/test_data_tokens.py checks their loss sum).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from _spawn import run_ranks
from _uneven_data import SEQ, VOCAB, batch_for

pytestmark = pytest.mark.dist
DATA = str(Path(__file__).with_name("_uneven_data.py")) + ":build"
SEED = 7
MICRO = 2


def _recipe(run_dir, world_size):
    from zerolaunch.config import load_recipe

    return load_recipe(
        {
            "model": {
                "builder": "zerolaunch.models.gpt:build",
                "args": {"size": "tiny", "vocab_size": VOCAB, "seq_len": SEQ},
            },
            "data": {"builder": DATA},
            "train": {
                "steps": 1,
                "micro_batch_size": MICRO,
                "gradient_accumulation_steps": 2,
                "seed": SEED,
                "gradient_clipping": 0.0,
                "lr_schedule": "constant",
                "log_every": 100,
                "run_dir": str(run_dir),
            },
            "checkpoint": {"every": 0},
            "deepspeed": {
                "zero_optimization": {"stage": 2},
                "optimizer": {"type": "SGD", "params": {"lr": 1.0}},
            },
        },
        world_size=world_size,
    )


def _train(rank, world_size, run_dir):
    from zerolaunch.train.context import RunContext
    from zerolaunch.train.loop import Trainer

    ctx = RunContext(rank=rank, local_rank=rank, world_size=world_size, device=torch.device("cpu"))
    trainer = Trainer(_recipe(Path(run_dir), world_size), ctx)
    try:
        trainer.train_step(1)
        trainer._flush()
        weights = {n: p.detach().clone() for n, p in trainer.engine.module.named_parameters()}
    finally:
        trainer.close()
    return weights, trainer.losses


def _reference(per_micro_mean: bool):
    from zerolaunch.models.gpt import build
    from zerolaunch.train import seeding

    seeding.seed_all(SEED, torch.device("cpu"))
    model = build(size="tiny", vocab_size=VOCAB, seq_len=SEQ)
    batches = [batch_for(r, i, MICRO) for r in range(2) for i in range(2)]
    losses = []
    for b in batches:
        logits = model(input_ids=b["input_ids"]).logits.reshape(-1, VOCAB)
        losses.append(F.cross_entropy(logits, b["labels"].reshape(-1), ignore_index=-100, reduction="sum"))
    counts = [int((b["labels"] != -100).sum()) for b in batches]
    if per_micro_mean:  # what the loop did before: mean per micro-batch, averaged (0/0 micro-batches dropped)
        loss = sum(s / c for s, c in zip(losses, counts, strict=True) if c) / len(batches)
    else:
        loss = sum(losses) / sum(counts)
    loss.backward()
    with torch.no_grad():
        return {n: p - p.grad for n, p in model.named_parameters()}, float(loss)


def test_gradient_is_the_global_token_mean(tmp_path):
    results = run_ranks(_train, 2, str(tmp_path), timeout_s=300)
    want, want_loss = _reference(per_micro_mean=False)
    other, _ = _reference(per_micro_mean=True)
    for rank, (weights, losses) in enumerate(results):
        assert losses[0] == pytest.approx(want_loss, rel=1e-5)
        for n, w in want.items():
            torch.testing.assert_close(weights[n], w, rtol=1e-5, atol=1e-6, msg=f"rank {rank} {n}")
        assert any(not torch.allclose(weights[n], other[n], rtol=1e-4, atol=1e-5) for n in want)
