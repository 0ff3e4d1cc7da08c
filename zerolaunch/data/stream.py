"""`BatchStream`: the resumable, endless iterable of batches the built-in datasets share.

It owns the position bookkeeping only: batch i of a stream is a pure function `make_batch(i)` of the index
(the datasets derive every random choice from (seed, rank, i)), so resuming at batch n costs nothing and
two runs with one seed see identical batches. It knows nothing of models, ranks or files.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import torch

Batch = dict[str, torch.Tensor]


def mix_seed(*parts: int) -> int:
    """One 63-bit seed from several ints (splitmix64 steps): nearby inputs give unrelated streams."""
    x = 0x9E3779B97F4A7C15
    for p in parts:
        x = (x ^ (int(p) & 0xFFFFFFFFFFFFFFFF)) * 0xBF58476D1CE4E5B9 & 0xFFFFFFFFFFFFFFFF
        x ^= x >> 31
    return x & 0x7FFFFFFFFFFFFFFF


class BatchStream:
    """Endless batches `make_batch(0), make_batch(1), ...` from the current position on."""

    def __init__(self, make_batch: Callable[[int], Batch], *, description: str):
        self._make_batch = make_batch
        self.position = 0
        """Index of the next batch to hand out (= batches consumed so far)."""
        self.description = description

    def __iter__(self) -> Iterator[Batch]:
        while True:
            batch = self._make_batch(self.position)
            self.position += 1
            yield batch

    def skip(self, n_batches: int) -> None:
        if n_batches < 0:
            raise ValueError(f"skip takes a non-negative number of batches, got {n_batches}")
        self.position += n_batches

    def state_dict(self) -> dict[str, int]:
        return {"position": self.position}

    def load_state_dict(self, state: dict) -> None:
        position = state.get("position") if isinstance(state, dict) else None
        if isinstance(position, bool) or not isinstance(position, int) or position < 0:
            raise ValueError(f"data state must be {{'position': int >= 0}}, got {state!r}")
        self.position = position

    def __repr__(self) -> str:
        return f"BatchStream({self.description}, position={self.position})"
