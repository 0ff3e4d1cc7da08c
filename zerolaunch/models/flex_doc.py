"""Block-diagonal causal attention for packed documents through torch's flex_attention.

SDPA given a (B, 1, T, T) bool mask runs its masked (math or memory-efficient) kernel over every tile: on an H100
the document mask cost 2.33x plain causal attention (bench/attention_doc_mask.py), and the mask itself is
B x T^2 bytes (1 GiB at 32k tokens). flex_attention skips the tiles the mask empties and reads the mask as a
BlockMask (which 128 x 128 tiles are full, partial or empty), built once per batch from the document ids and
shared by every layer: 1.24x causal on the same bench.

On CUDA the kernel is torch.compile'd once per process (flex_attention without compile materializes the scores).
Flex has no backward on the CPU (torch 2.13) and no dropout, and torch before 2.5 has no flex: there
`flex_available(device)` is False and the model keeps the SDPA mask. Off CUDA flex runs eagerly, forward only
(the CPU tests check the BlockMask against the SDPA mask that way).
"""

from __future__ import annotations

import functools
import warnings

import torch

try:
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention
except ImportError:  # torch < 2.5
    create_block_mask = flex_attention = None


def flex_available(device: torch.device) -> bool:
    """Whether the model may take the flex path on `device` (training needs flex's backward: CUDA only)."""
    return flex_attention is not None and device.type == "cuda"


class DocumentBlockMask:
    """The BlockMask of one batch's documents (a document starts where position_ids is 0)."""

    def __init__(self, block_mask):
        self.block_mask = block_mask

    @classmethod
    def from_position_ids(cls, position_ids: torch.Tensor) -> DocumentBlockMask:
        doc = (position_ids == 0).cumsum(dim=1)  # (B, T): document number of each token
        B, T = doc.shape

        def same_document_causal(b, h, q_idx, kv_idx):
            return (kv_idx <= q_idx) & (doc[b, q_idx] == doc[b, kv_idx])

        # compiled on CUDA: eager create_block_mask evaluates the mask over all B x T x T pairs at once (16 GiB
        # of bools at 128k tokens); compiled, it evaluates tile by tile
        block_mask = create_block_mask(
            same_document_causal, B, None, T, T, device=position_ids.device, _compile=position_ids.is_cuda
        )
        return cls(block_mask)


@functools.cache
def _compiled_flex():
    return torch.compile(flex_attention, dynamic=False)


def flex_document_attention(q, k, v, mask: DocumentBlockMask) -> torch.Tensor:
    """(B, H, T, D) attention of q over k, v inside each document, causal."""
    if q.device.type == "cuda":
        return _compiled_flex()(q, k, v, block_mask=mask.block_mask)
    with warnings.catch_warnings():
        # eager flex warns that it is unfused; off CUDA that is the intended path (tests, CPU runs)
        warnings.simplefilter("ignore", UserWarning)
        return flex_attention(q, k, v, block_mask=mask.block_mask)
