"""Peak bytes of the chunked linear + cross-entropy (models/linear_ce.py, `model.args.loss_chunk`). Torch-free.

Nothing of size (tokens, vocab) exists: forward keeps the hidden states (counted with the head's saved tensors)
and one chunk's logits at a time. The peak is in backward, which holds for the whole loop the hidden states'
gradient (tokens x d_model, compute dtype) and the weight's gradient summed in fp32 (vocab x d_model), and per
chunk two fp32 (rows, vocab) tensors: the recomputed logits' fp32 copy (a compute-dtype product is freed as soon
as it is copied) and their softmax, then the softmax and its rounded copy; forward holds the same two (the fp32
logits and their log-softmax). At the end the fp32 weight gradient is rounded to the compute dtype while alive.
Checked against live tensor bytes on the CPU (tests/unit/test_linear_ce_memory.py).
"""

from __future__ import annotations


def linear_loss_peak_bytes(
    tokens: int, vocab_size: int, d_model: int, dtype_bytes: int, chunk_rows: int
) -> int:
    rows = min(chunk_rows, tokens)
    per_chunk = 2 * 4 * rows * vocab_size
    rounding = 0 if dtype_bytes == 4 else dtype_bytes * vocab_size * d_model
    return dtype_bytes * tokens * d_model + 4 * vocab_size * d_model + max(per_chunk, rounding)
