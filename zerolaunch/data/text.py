"""Byte-level plain-text data (vocab 256): contiguous windows of a file, each rank a disjoint stride.

The file is cut into `seq_len + 1`-byte windows that overlap by one byte (input and shifted label). Window w
belongs to rank `w % world_size`, so ranks never share a window; each epoch visits a rank's windows in an
order shuffled by (seed, epoch) (the same permutation on every rank, so the strides stay disjoint). Batches
are a pure function of the batch index (stream.py): resumable and reproducible.

Recipe: `data: {builder: zerolaunch.data.text:build, args: {path: data/input.txt, seq_len: 128}}`; a relative
path starts at the recipe's folder (config/paths.py resolves it at load).
"""

from __future__ import annotations

import functools
from pathlib import Path

import torch

from zerolaunch.data.stream import Batch, BatchStream, mix_seed

VOCAB_SIZE = 256
_EPOCH_SALT = 3


def _read_bytes(path: Path) -> torch.Tensor:
    if not path.exists():
        raise FileNotFoundError(
            f"text data: file {str(path)!r} does not exist; set data.args.path to a text file"
        )
    if not path.is_file():
        raise ValueError(f"text data: {str(path)!r} is not a file; set data.args.path to a text file")
    raw = path.read_bytes()
    return (
        torch.frombuffer(bytearray(raw), dtype=torch.uint8).long()
        if raw
        else torch.empty(0, dtype=torch.long)
    )


def build(
    rank: int,
    world_size: int,
    micro_batch_size: int,
    seed: int,
    path: str,
    seq_len: int = 128,
) -> BatchStream:
    """Endless `{"input_ids", "labels"}` batches (micro_batch_size, seq_len) of this rank's windows."""
    for name, value in (
        ("seq_len", seq_len),
        ("micro_batch_size", micro_batch_size),
        ("world_size", world_size),
    ):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"text data: {name} must be a positive int, got {value!r}")
    if not 0 <= rank < world_size:
        raise ValueError(f"text data: rank {rank} is outside world_size {world_size}")
    data = _read_bytes(Path(path))
    n_windows_total = max(0, (data.numel() - 1) // seq_len)
    if n_windows_total < world_size:
        need = world_size * seq_len + 1
        raise ValueError(
            f"text data: {path!r} has {data.numel()} bytes, too few for {world_size} rank(s) of seq_len "
            f"{seq_len} (need at least {need}); use a longer file or a smaller data.args.seq_len"
        )
    # Every rank gets the same number of windows, so all ranks' epochs end together.
    windows_per_rank = n_windows_total // world_size
    mine = torch.arange(windows_per_rank) * world_size + rank  # window ids of this rank, (W,)
    offsets = torch.arange(seq_len + 1)  # (T+1,)

    @functools.lru_cache(maxsize=2)  # a batch spans at most two epochs; each permutation is O(W)
    def epoch_order(epoch: int) -> torch.Tensor:
        g = torch.Generator().manual_seed(mix_seed(seed, _EPOCH_SALT, epoch))
        return torch.randperm(windows_per_rank, generator=g)

    def make_batch(index: int) -> Batch:
        first = index * micro_batch_size
        rows = []
        for k in range(first, first + micro_batch_size):
            epoch, slot = divmod(k, windows_per_rank)
            rows.append(int(mine[epoch_order(epoch)[slot]]) * seq_len)
        starts = torch.tensor(rows)  # (B,)
        tokens = data[starts[:, None] + offsets[None, :]]  # (B, T+1)
        return {"input_ids": tokens[:, :-1].contiguous(), "labels": tokens[:, 1:].contiguous()}

    return BatchStream(
        make_batch,
        description=f"text {path} bytes={data.numel()} windows/rank={windows_per_rank} T={seq_len}",
    )
