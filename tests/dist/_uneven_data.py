"""A data builder for test_global_loss_norm.py: fixed random tokens whose labelled positions differ widely
between micro-batches and ranks (one micro-batch has none at all)."""

from __future__ import annotations

import torch

from zerolaunch.data.stream import BatchStream

VOCAB = 64
SEQ = 16
# labelled positions per (rank, micro-batch index): uneven on purpose
LABELLED = {(0, 0): 2, (0, 1): 2 * SEQ, (1, 0): 7, (1, 1): 0}


def batch_for(rank: int, index: int, micro_batch_size: int) -> dict:
    g = torch.Generator().manual_seed(1000 * rank + index)
    ids = torch.randint(0, VOCAB, (micro_batch_size, SEQ + 1), generator=g)
    labels = ids[:, 1:].clone().reshape(-1)
    labels[LABELLED[(rank, index % 2)] :] = -100
    return {"input_ids": ids[:, :-1].contiguous(), "labels": labels.view(micro_batch_size, SEQ)}


def build(rank, world_size, micro_batch_size, seed):
    return BatchStream(lambda i: batch_for(rank, i, micro_batch_size), description="uneven labels")
