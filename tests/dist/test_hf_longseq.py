"""An HF causal LM under the engine with activation checkpointing and the chunked loss, at stages 0-3.

One spawn of 2 gloo ranks runs every case on a tiny random Llama (fp32, same init on both ranks, each rank its
own data, labels with -100 runs and the loop's global-batch divisor `num_items_in_batch`): with
`enable_activation_checkpointing()` (what `train.activation_checkpointing: true` calls), with
`model.args.loss_chunk`, and with both, the losses of 3 steps and the final weights equal the run with neither
at the same stage (to ~1e-6). At stage 3 the decoder layers are units and the tied-free lm_head sits in the root,
so the chunked loss reads the gathered weight through the lm_head's module call; also a case with the lm_head a
unit of its own, where reading its weight outside its forward would read a shard.
"""

from __future__ import annotations

import pytest
import torch
from _spawn import run_ranks

STAGES = (0, 1, 2, 3)
VARIANTS = ("ckpt", "chunk", "ckpt+chunk")
VOCAB, SEQ, MICRO, STEPS = 61, 12, 2, 3
CONFIG = dict(
    model_type="llama",
    vocab_size=VOCAB,
    hidden_size=16,
    intermediate_size=24,
    num_hidden_layers=2,
    num_attention_heads=2,
    num_key_value_heads=1,
    max_position_embeddings=32,
    tie_word_embeddings=False,
)


def _batches(world_size):
    """Every rank's batches for every step (all ranks draw the same, each uses its own)."""
    g = torch.Generator().manual_seed(7)
    steps = []
    for _ in range(STEPS):
        ids = torch.randint(0, VOCAB, (world_size, MICRO, SEQ), generator=g)
        labels = ids.clone()
        labels[:, 0, :5] = -100  # a prompt: no loss on it
        labels[1 % world_size, 1, 3:] = -100
        total = (labels[..., 1:] != -100).sum()  # HF shifts: labels[..., 0] is nobody's target
        steps.append((ids, labels, total.float() / world_size))
    return steps


def _train(rank, world_size, stage, variant, units):
    import zerolaunch
    from zerolaunch.models.hf import build
    from zerolaunch.zero import EngineOptions, OptimizerOptions, ZeroOptions

    torch.manual_seed(0)
    model = build(config=dict(CONFIG), loss_chunk=5 if "chunk" in variant else 0)
    if "ckpt" in variant:
        model.enable_activation_checkpointing()
    zero = ZeroOptions(stage=stage, stage3_param_persistence_threshold=0, stage3_units=units)
    options = EngineOptions(zero=zero, optimizer=OptimizerOptions(lr=1e-2))
    engine = zerolaunch.initialize(model, options, device="cpu")
    losses = []
    for ids, labels, items in _batches(world_size):
        out = engine(input_ids=ids[rank], labels=labels[rank], num_items_in_batch=items)
        engine.backward(out.loss)
        engine.step()
        losses.append(out.loss.detach().clone())
    weights = engine.consolidated_state_dict()
    engine.close()
    return torch.stack(losses), weights


def _run(rank, world_size):
    out = {}
    for stage in STAGES:
        for variant in ("plain", *VARIANTS):
            out[(stage, variant)] = _train(rank, world_size, stage, variant, ("LlamaDecoderLayer",))
    for variant in ("plain", "chunk"):
        out[(3, variant, "head unit")] = _train(
            rank, world_size, 3, variant, ("LlamaDecoderLayer", "lm_head")
        )
    return out


@pytest.fixture(scope="module")
def ranks():
    return run_ranks(_run, 2, timeout_s=600)


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("stage", STAGES)
def test_losses_and_weights_equal_the_plain_run(ranks, stage, variant):
    for rank in (0, 1):
        losses, _ = ranks[rank][(stage, variant)]
        want, _ = ranks[rank][(stage, "plain")]
        torch.testing.assert_close(losses, want, rtol=1e-6, atol=1e-6)
    weights, want = ranks[0][(stage, variant)][1], ranks[0][(stage, "plain")][1]
    assert list(weights) == list(want) and weights
    for name, tensor in want.items():
        torch.testing.assert_close(weights[name], tensor, rtol=1e-5, atol=1e-6, msg=name)


def test_chunked_loss_with_the_lm_head_its_own_stage3_unit(ranks):
    losses, weights = ranks[0][(3, "chunk", "head unit")]
    want_losses, want = ranks[0][(3, "plain", "head unit")]
    torch.testing.assert_close(losses, want_losses, rtol=1e-6, atol=1e-6)
    for name, tensor in want.items():
        torch.testing.assert_close(weights[name], tensor, rtol=1e-5, atol=1e-6, msg=name)


def test_the_runs_train(ranks):
    # the comparisons above would pass between two runs that never moved: the weights and losses change
    losses, weights = ranks[0][(3, "plain")]
    assert not torch.allclose(losses[0], losses[-1])
    torch.manual_seed(0)
    from zerolaunch.models.hf import build

    start = build(config=dict(CONFIG)).state_dict()
    assert not torch.allclose(weights["lm_head.weight"], start["lm_head.weight"])
