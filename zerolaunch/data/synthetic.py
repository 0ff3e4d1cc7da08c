"""A learnable synthetic token stream: sequences from a fixed random order-1 Markov chain.

Every token has `branching` random successors, taken with skewed fixed probabilities, so the next-token
entropy (the loss floor, `entropy_nats()`) is far below log(vocab_size) and a model's loss visibly falls. The
chain depends on `seed` only (all ranks learn the same chain); the sequences depend on (seed, rank, batch
index), so ranks see different data and a run is reproducible and resumable (stream.py).

Recipe: `data: {builder: zerolaunch.data.synthetic:build, args: {vocab_size: 256, seq_len: 64}}`.
"""

from __future__ import annotations

import math

import torch

from zerolaunch.data.stream import Batch, BatchStream, mix_seed

_CHAIN_SALT = 1
_SEQUENCE_SALT = 2


class MarkovChain:
    """Successor table (V, branching) and the probability of each successor slot (shared by all tokens)."""

    def __init__(self, vocab_size: int, branching: int, seed: int):
        g = torch.Generator().manual_seed(mix_seed(seed, _CHAIN_SALT))
        self.successors = torch.randint(0, vocab_size, (vocab_size, branching), generator=g)  # (V, K)
        # Geometric slot weights 1, 1/2, 1/4...: one successor dominates, the others still matter.
        weights = torch.tensor([0.5**k for k in range(branching)], dtype=torch.float64)
        self.slot_probs = weights / weights.sum()  # (K,)
        self.vocab_size = vocab_size
        self._branching = branching
        self._flat_successors = self.successors.reshape(-1).tolist()  # (V*K,) ints, row-major: v*K + slot

    def entropy_nats(self) -> float:
        """Next-token entropy if successors were distinct: the best loss a model can reach (about)."""
        return float(-(self.slot_probs * self.slot_probs.log()).sum())

    def sample(self, n_seqs: int, n_tokens: int, generator: torch.Generator) -> torch.Tensor:
        start = torch.randint(0, self.vocab_size, (n_seqs,), generator=generator)
        slots = torch.multinomial(
            self.slot_probs.float(), n_seqs * n_tokens, replacement=True, generator=generator
        )
        slots = slots.view(n_seqs, n_tokens)  # (B, T+1), i.i.d. because slot probs are shared
        # The walk is sequential by nature (token t needs token t-1), so its per-position cost is what
        # matters (2048 positions a batch). Plain Python ints indexing a flat successor list cost ~6x less
        # than one torch indexing op per position, need no numpy, and the random draws above are unchanged,
        # so the token stream is identical to the per-position torch walk this replaces.
        flat = self._flat_successors
        k = self._branching
        rows = []
        for x, row_slots in zip(start.tolist(), slots.tolist(), strict=True):
            row = [x]
            for s in row_slots[1:]:
                x = flat[x * k + s]
                row.append(x)
            rows.append(row)
        return torch.tensor(rows, dtype=torch.long)  # (B, T+1)


def _positive_int(name: str, value) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"synthetic data: {name} must be a positive int, got {value!r}")
    return value


def build(
    rank: int,
    world_size: int,
    micro_batch_size: int,
    seed: int,
    vocab_size: int = 256,
    seq_len: int = 128,
    branching: int = 4,
) -> BatchStream:
    """Endless `{"input_ids", "labels"}` batches of shape (micro_batch_size, seq_len) for `rank`."""
    for name, value in (
        ("vocab_size", vocab_size),
        ("seq_len", seq_len),
        ("micro_batch_size", micro_batch_size),
        ("world_size", world_size),
        ("branching", branching),
    ):
        _positive_int(name, value)
    if not 0 <= rank < world_size:
        raise ValueError(f"synthetic data: rank {rank} is outside world_size {world_size}")
    chain = MarkovChain(vocab_size, branching, seed)

    def make_batch(index: int) -> Batch:
        g = torch.Generator().manual_seed(mix_seed(seed, _SEQUENCE_SALT, rank, index))
        tokens = chain.sample(micro_batch_size, seq_len + 1, g)  # (B, T+1)
        return {"input_ids": tokens[:, :-1].contiguous(), "labels": tokens[:, 1:].contiguous()}

    floor = chain.entropy_nats()
    return BatchStream(
        make_batch,
        description=f"synthetic markov V={vocab_size} T={seq_len} floor~{floor:.2f} of {math.log(vocab_size):.2f} nats",
    )
