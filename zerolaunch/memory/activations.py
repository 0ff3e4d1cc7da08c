"""Activation bytes of a GPT-style decoder for one micro-batch on one rank, with and without checkpointing.

Owns the count of what autograd keeps for backward in zerolaunch/models/gpt.py's forward (pre-LN blocks,
fused scaled-dot-product attention, GELU MLP, tied lm_head, fp32 cross-entropy in chunks of rows), and the
peak around the loss (chunked for the built-in GPT, unchunked for other models: `Arch.loss_chunk_rows`).
It ignores dropout masks (the built-in GPT defaults to dropout 0) and allocator fragmentation. Torch-free.
"""

from __future__ import annotations

from zerolaunch.memory.arch import Arch
from zerolaunch.memory.linear_loss import linear_loss_peak_bytes


def block_saved_bytes(arch: Arch, tokens: int, dtype_bytes: int, batch: int, seq_len: int) -> int:
    """What one transformer block keeps for backward.

    In units of tokens x width, compute dtype: ln_1 input (h), ln_1 output = qkv input (h), qkv output = q, k,
    v (3h), attention output (h) and its contiguous copy = proj input (h), ln_2 input (h), ln_2 output = fc
    input (h), fc output = gelu input (d_ff), gelu output = proj input (d_ff); a gated MLP keeps gate and up
    outputs, act(gate) and the product (4 d_ff). In fp32: the two norms' statistics (4 values per token) and
    the attention's log-sum-exp (one per head and token). Other models' extras (fp32 RMSNorm copies, RoPE,
    grouped-query heads) are not modelled: measured on a 1.1B Llama they are within a few percent.
    """
    h, f = arch.d_model, arch.d_ff
    mlp = (4 if arch.gated_mlp else 2) * f
    return dtype_bytes * tokens * (9 * h + mlp) + 4 * tokens * 4 + 4 * batch * arch.n_head * seq_len


def head_saved_bytes(arch: Arch, tokens: int, dtype_bytes: int) -> int:
    """What the final norm keeps for backward: its input and output (the lm_head input) + fp32 mean/rstd."""
    return dtype_bytes * tokens * 2 * arch.d_model + 8 * tokens


def loss_peak_bytes(tokens: int, vocab_size: int, dtype_bytes: int, chunk_rows: int | None) -> int:
    """Peak bytes of the cross-entropy over (tokens, vocab) logits, forward and backward, on top of the
    blocks' saved tensors.

    Unchunked (chunk_rows None, e.g. a Hugging Face model): the loss is computed on logits.float();
    log_softmax keeps its fp32 output, and its backward holds that, the incoming fp32 grad and the fp32 grad
    it produces at once -> 3 fp32 (tokens, V) tensors; the compute-dtype logits are freed after forward.

    Chunked (the built-in GPT, models/gpt.py chunked_cross_entropy): forward sums F.cross_entropy over one
    chunk at a time (its fp32 copy, unless the logits are fp32, and its log_softmax); backward writes the
    logits' gradient (one compute-dtype (tokens, V) tensor) chunk by chunk from the chunk's fp32 copy and its
    softmax, while the logits are still held: logits + gradient + 2 fp32 chunks at the peak (1 for fp32
    logits; per-row vectors are left out). Checked against live tensor bytes on the CPU
    (tests/unit/test_memory.py).
    """
    if chunk_rows is None:
        return 3 * 4 * tokens * vocab_size
    chunk = 4 * min(chunk_rows, tokens) * vocab_size  # one fp32 chunk
    logits = dtype_bytes * tokens * vocab_size
    return 2 * logits + (1 if dtype_bytes == 4 else 2) * chunk


def activation_bytes(arch: Arch | None, setup, *, checkpointing: bool) -> int | None:
    """Peak activation bytes of forward + backward on one rank; None when the model's sizes are unknown."""
    profile = activation_profile(arch, setup, checkpointing=checkpointing)
    return None if profile is None else profile[0]


def model_loss_peak_bytes(arch: Arch, tokens: int, dtype_bytes: int) -> int:
    """The loss's peak for `arch`: the chunked linear + cross-entropy's when the model computes it so
    (model.args.loss_chunk), else the cross-entropy over full logits (chunked rows or not)."""
    if arch.linear_loss_rows:
        return linear_loss_peak_bytes(
            tokens, arch.vocab_size, arch.d_model, dtype_bytes, arch.linear_loss_rows
        )
    return loss_peak_bytes(tokens, arch.vocab_size, dtype_bytes, arch.loss_chunk_rows)


def activation_profile(arch: Arch | None, setup, *, checkpointing: bool) -> tuple[int, int] | None:
    """(peak bytes, peak bytes once the loss's (tokens, vocab) tensors are freed) of one micro-batch.

    The second figure is what stays alive while the blocks run backward, when stage 3 also holds staging
    buffers; the first is the overall peak, at the loss, before any staging buffer exists.
    """
    if arch is None:
        return None
    b = setup.dtype_bytes
    tokens = setup.micro_batch * setup.seq_len
    h, L = arch.d_model, arch.n_layer
    block = block_saved_bytes(arch, tokens, b, setup.micro_batch, setup.seq_len)
    head_saved = head_saved_bytes(arch, tokens, b)
    loss_peak = model_loss_peak_bytes(arch, tokens, b)
    if not checkpointing:
        # The peak is at the start of backward: every block's saved tensors + the head + the loss tensors.
        saved = L * block + head_saved
        return saved + loss_peak, saved
    # Checkpointing keeps each block's input only; a block's backward first recomputes its saved tensors and
    # then holds a few gradient tensors of the same sizes (d_ff + 2h per token, the MLP's grads).
    kept = L * b * tokens * h
    recompute = block + b * tokens * (arch.d_ff + 2 * h)
    return kept + max(head_saved + loss_peak, recompute), kept + recompute
