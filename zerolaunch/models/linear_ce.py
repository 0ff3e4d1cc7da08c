"""A chunked linear + cross-entropy: the loss of `hidden @ weight.T` against labels without the (N, V) logits.

At long sequences the logits are the largest tensors of a step: 32k tokens x a 128k vocabulary is 8 GiB in bf16,
and the fp32 loss over them needs two or three times that. Here the rows go through the output projection and
the cross-entropy a chunk at a time; forward keeps only the hidden states, the weight and the labels, and
backward recomputes each chunk's logits (one more matmul a chunk, as torchtune's and torchtitan's chunked losses
do under checkpoint). At no time are more than one chunk's logits (compute dtype) and two fp32 chunk tensors alive.

Gradients: each chunk's d(logits) = (softmax - one_hot) * grad / count in fp32, rounded once to the compute
dtype, then d(hidden) = d(logits) @ weight and d(weight) += d(logits).T @ hidden, the weight's gradient summed in
fp32 over the chunks and rounded once. The value and the gradients equal F.cross_entropy on the full fp32 logits
to fp32 rounding (tests/unit/test_linear_ce.py).

`head_loss` calls this through the output projection's own module call, so a ZeRO-3 engine whose unit holds
that module gathers the weight around the use exactly as for the module's plain forward.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

IGNORE_INDEX = -100


class _LinearCrossEntropy(torch.autograd.Function):
    @staticmethod
    def forward(ctx, hidden, weight, labels, rows: int, divisor):
        total = hidden.new_zeros((), dtype=torch.float32)
        for start in range(0, hidden.shape[0], rows):
            logits = (hidden[start : start + rows] @ weight.t()).float()
            total += F.cross_entropy(
                logits, labels[start : start + rows], ignore_index=IGNORE_INDEX, reduction="sum"
            )
            del logits  # before the next chunk's exist
        count = (labels != IGNORE_INDEX).sum() if divisor is None else divisor.to(torch.float32)
        ctx.save_for_backward(hidden, weight, labels, count)
        ctx.rows = rows
        # 0 labelled rows give 0/0 = nan, as F.cross_entropy(reduction="mean") does
        return total / count

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad_out):
        hidden, weight, labels, count = ctx.saved_tensors
        rows = ctx.rows
        valid = labels != IGNORE_INDEX
        safe = labels.masked_fill(~valid, 0)  # ignored rows index class 0; their weight is 0
        scale = valid.to(torch.float32).mul_(grad_out.float() / count)[:, None]
        minus_one = torch.full((rows, 1), -1.0, dtype=torch.float32, device=hidden.device)
        grad_hidden = torch.empty_like(hidden) if ctx.needs_input_grad[0] else None
        grad_weight = torch.zeros(weight.shape, dtype=torch.float32, device=weight.device)
        for start in range(0, hidden.shape[0], rows):
            stop = start + rows
            chunk = hidden[start:stop]
            probs = torch.softmax((chunk @ weight.t()).float(), dim=1)
            probs.scatter_add_(1, safe[start:stop, None], minus_one[: probs.shape[0]])  # - one_hot
            grad_logits = probs.mul_(scale[start:stop]).to(hidden.dtype)
            del probs
            if grad_hidden is not None:
                torch.matmul(grad_logits, weight, out=grad_hidden[start:stop])
            grad_weight.addmm_(grad_logits.t().float(), chunk.float())
            del grad_logits
        return grad_hidden, grad_weight.to(weight.dtype), None, None, None


def linear_cross_entropy(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    labels: torch.Tensor,
    *,
    chunk_rows: int,
    divisor: torch.Tensor | float | None = None,
) -> torch.Tensor:
    """Cross-entropy of `hidden @ weight.T` ((N, d) x (V, d)) against labels (N,), -100 ignored: the mean over
    the labelled rows, or their sum / `divisor` when given (the loop's global-batch normalization)."""
    if chunk_rows < 1:
        raise ValueError(f"chunk_rows must be >= 1, got {chunk_rows}")
    if divisor is not None and not torch.is_tensor(divisor):
        divisor = torch.tensor(float(divisor), device=hidden.device)
    return _LinearCrossEntropy.apply(hidden, weight, labels, chunk_rows, divisor)


def _loss_forward(head: nn.Linear, hidden, labels, chunk_rows, divisor):
    return linear_cross_entropy(hidden, head.weight, labels, chunk_rows=chunk_rows, divisor=divisor)


def head_loss(
    head: nn.Module,
    hidden: torch.Tensor,
    labels: torch.Tensor,
    *,
    chunk_rows: int,
    divisor: torch.Tensor | float | None = None,
) -> torch.Tensor:
    """`linear_cross_entropy(hidden, head.weight, labels)` run as `head`'s own forward: the module's hooks
    (a ZeRO-3 unit's gather before, release after and re-gather for backward) fire around the use."""
    if not isinstance(head, nn.Linear) or head.bias is not None:
        raise ValueError(
            f"a chunked loss needs the output projection to be a Linear without bias, got {type(head).__name__}"
            + (" with a bias" if isinstance(head, nn.Linear) else "")
        )
    if torch.compiler.is_compiling():
        # dynamo cannot trace the forward swap below; a whole-forward compile (train.compile_scope: model) runs
        # only where no hook gathers weights (stages 0-2), so the weight is the head's own
        return linear_cross_entropy(hidden, head.weight, labels, chunk_rows=chunk_rows, divisor=divisor)
    original = head.__dict__.get("forward")
    head.forward = lambda h, y, r, d: _loss_forward(head, h, y, r, d)
    try:
        return head(hidden, labels, chunk_rows, divisor)
    finally:
        if original is None:
            del head.forward
        else:
            head.forward = original
