"""Training from a prepared folder (`data.builder: zerolaunch.data.tokens:build`, `args: {path, seq_len}`).

This module owns reading a `zerolaunch prepare-data` folder (prepare.py) and cutting it into batches:
- Checksums: each file's crc32 (recorded by prepare-data) is checked on its first read, the whole file in
  pieces (data/checksums.py); a folder prepared before checksums existed is read unchecked.
- Read on demand: a batch reads only its windows (pread at their offsets, `_File`) and a block of the document
  index; nothing else of the corpus is loaded or stays mapped, so a worker's memory does not grow with the
  corpus or with how much of it a run has read (bench/data_loader.py).
- Packing: window w is tokens [w*T, w*T + T + 1) of the whole stream (T = seq_len; one token of overlap for the
  shifted target), documents back to back, so no token is padding.
- Ranks and epochs: one global order of the windows per epoch, shuffled by (seed, epoch); micro-batch i of
  rank r takes global samples (i * world_size + r) * B ... + B - 1, so the ranks' samples are disjoint and
  together consume the order front to back.
- Resume: batch i is a pure function of i (stream.BatchStream). The state records the global samples
  consumed; at another world size (or micro batch) the stream continues at that global sample, rounded down
  to a whole global batch of the new shape, so no window is skipped and at most one global batch's worth is
  seen twice.
- `document_mask` (default true): `position_ids` restart at 0 at every document start (and at each window's
  first token), which the built-in GPT turns into a block-diagonal causal mask and Hugging Face models into
  per-document attention (transformers builds the mask from packed position_ids; flash-attention models run
  varlen; these batches carry use_cache=False, without which transformers ignores packed position_ids);
  targets that cross a document boundary carry no loss. A packed row then computes what its
  documents would one by one. On by default because without it a window's later documents attend to
  unrelated text, and SFT examples see each other; the cost is a masked attention kernel instead of the
  plain causal one (set false for the fastest pre-training kernel).
- Loss masks: in prompt-completion / chat folders only completion / assistant tokens carry loss (labels
  -100 elsewhere).
- `holdout` (a fraction) keeps the stream's last windows out of training; `split: eval` reads only them
  (data.eval: {split: eval} in a recipe).
- `label_shift`: "data" (default) gives labels[t] = the target of position t (the built-in GPT, nanoGPT);
  "model" gives labels aligned with input_ids for models that shift them themselves (Hugging Face).
It knows nothing of models beyond those two conventions.
"""

from __future__ import annotations

import functools
import os
from pathlib import Path

import numpy as np
import torch

from zerolaunch.data.checksums import FIX, fd_crc32, mismatch_message, recorded_crcs
from zerolaunch.data.manifest import read_manifest
from zerolaunch.data.readers import DataError
from zerolaunch.data.stream import Batch, BatchStream, mix_seed

_EPOCH_SALT = 38
LABEL_SHIFTS = ("data", "model")
IGNORE = -100


INDEX_BLOCK = 512
"""Document offsets per block of documents.idx read at a time; every block's first offset stays in memory."""


class _File:
    """A file read with pread at absolute offsets: stateless, so a forked prefetch worker may share the
    descriptor, and unlike a memory map nothing read stays mapped into the process (a map's touched pages,
    and the kernel's fault-around neighbours, count in its RSS and grow with the corpus a run has read)."""

    def __init__(self, path: Path, dtype, count: int, crc32: int | None = None):
        self.path, self.dtype, self.count = path, np.dtype(dtype), count
        self.crc32 = crc32
        """The manifest's crc32 of the file, checked on the first read; None: not recorded (an older folder)."""
        self.fd = os.open(path, os.O_RDONLY)
        size = os.fstat(self.fd).st_size
        if size != count * self.dtype.itemsize:
            os.close(self.fd)
            raise DataError(
                f"{path}: {size} bytes, expected {count} x {self.dtype.itemsize} (a damaged folder?)"
            )

    def _check_crc(self) -> None:
        # the whole file once, before its first bytes are used: a rewrite of the same size is caught too,
        # which the size check above cannot see
        expected, self.crc32 = self.crc32, None
        found = fd_crc32(self.fd, self.count * self.dtype.itemsize)
        if found != expected:
            raise DataError(mismatch_message(self.path, expected, found))

    def read(self, first: int, n: int) -> np.ndarray:
        if self.crc32 is not None:
            self._check_crc()
        n = max(0, min(n, self.count - first))
        raw = os.pread(self.fd, n * self.dtype.itemsize, first * self.dtype.itemsize)
        return np.frombuffer(raw, dtype=self.dtype)

    def close(self) -> None:
        os.close(self.fd)


class TokenFolder:
    """The token stream of a prepared folder, read on demand: `read(start, n)` -> (tokens, loss mask or None),
    `segments(start, n)` -> each token's document number within the range."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self.manifest = m = read_manifest(self.path)
        try:
            crcs = recorded_crcs(m) or {}
        except ValueError as e:
            raise DataError(f"{self.path / 'manifest.json'}: {e}. {FIX}.") from None
        dtype = np.dtype(m["dtype"]).newbyteorder("<")
        self._tokens, self._masks = [], []
        starts = [0]
        for shard in m["shards"]:
            self._tokens.append(
                _File(self.path / shard["file"], dtype, shard["tokens"], crcs.get(shard["file"]))
            )
            if m["loss_mask"]:
                mask_name = shard["file"].replace("tokens-", "loss_mask-")
                self._masks.append(
                    _File(self.path / mask_name, np.uint8, shard["tokens"], crcs.get(mask_name))
                )
            starts.append(starts[-1] + shard["tokens"])
        self._starts = np.asarray(starts, dtype=np.int64)
        self.tokens = int(starts[-1])
        if self.tokens != m["tokens"]:
            raise DataError(
                f"{self.path}: the shards hold {self.tokens} tokens, the manifest says {m['tokens']}"
            )
        self.documents = int(m["documents"])
        self._index = _File(self.path / "documents.idx", "<i8", self.documents + 1, crcs.get("documents.idx"))
        # the first offset of every block: 16 KiB per million documents
        self._sparse = np.concatenate(
            [self._index.read(i, 1) for i in range(0, self._index.count, INDEX_BLOCK)]
        )
        self.has_loss_mask = bool(m["loss_mask"])

    def _read(self, files: list[_File], start: int, n: int) -> np.ndarray:
        shard = int(np.searchsorted(self._starts, start, side="right")) - 1
        local = start - int(self._starts[shard])
        parts, got = [], 0
        while got < n:  # a window may cross into the next shard(s)
            piece = files[shard].read(local, n - got)
            parts.append(piece)
            got += piece.size
            shard, local = shard + 1, 0
        return parts[0] if len(parts) == 1 else np.concatenate(parts)

    def read(self, start: int, n: int) -> tuple[np.ndarray, np.ndarray | None]:
        tokens = self._read(self._tokens, start, n)
        return tokens, (self._read(self._masks, start, n) if self.has_loss_mask else None)

    def segments(self, start: int, n: int) -> np.ndarray:
        """Per token of [start, start+n): its document's number counted from the range (0, 0, 1, 1, 1, 2...)."""
        i = max(int(np.searchsorted(self._sparse, start, side="right")) - 1, 0) * INDEX_BLOCK
        seg = np.zeros(n, dtype=np.int64)
        while i < self._index.count:
            block = self._index.read(i, INDEX_BLOCK)
            inside = block[(block > start) & (block < start + n)]
            seg[inside - start] = 1
            if block[-1] >= start + n:
                break
            i += INDEX_BLOCK
        return np.cumsum(seg)


def _positive_int(name: str, value) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"data.args.{name} must be a positive integer, got {value!r}")
    return value


class _Windows:
    """Batch i of one rank: the windows, their labels, position_ids (see the module docstring)."""

    def __init__(
        self,
        folder: TokenFolder,
        *,
        seq_len,
        rank,
        world_size,
        micro_batch_size,
        seed,
        document_mask,
        label_shift,
        windows,
        first_window,
    ):
        self.folder, self.T, self.rank, self.world, self.B = (
            folder,
            seq_len,
            rank,
            world_size,
            micro_batch_size,
        )
        self.seed, self.document_mask, self.label_shift = seed, document_mask, label_shift
        self.windows, self.first_window = windows, first_window
        self._arange = np.arange(seq_len + 1)

    @functools.lru_cache(maxsize=2)  # a batch spans at most two epochs  # noqa: B019 (one per stream)
    def epoch_order(self, epoch: int) -> np.ndarray:
        rng = np.random.Generator(np.random.PCG64(mix_seed(self.seed, _EPOCH_SALT, epoch)))
        return rng.permutation(self.windows)

    def sample_ids(self, index: int) -> np.ndarray:
        first = (index * self.world + self.rank) * self.B
        out = np.empty(self.B, dtype=np.int64)
        for j in range(self.B):
            epoch, slot = divmod(first + j, self.windows)
            out[j] = self.epoch_order(epoch)[slot]
        return out + self.first_window

    def batch(self, index: int) -> Batch:
        T, span = self.T, self.T + 1
        x = np.empty((self.B, span), dtype=np.int64)
        mask = np.ones((self.B, span), dtype=bool) if self.folder.has_loss_mask else None
        seg = np.zeros((self.B, span), dtype=np.int64) if self.document_mask else None
        for row, w in enumerate(self.sample_ids(index)):
            start = int(w) * T
            tokens, loss_mask = self.folder.read(start, span)
            x[row] = tokens
            if mask is not None:
                mask[row] = loss_mask.astype(bool)
            if seg is not None:
                seg[row] = self.folder.segments(start, span)
        keep = mask.copy() if mask is not None else np.ones((self.B, span), dtype=bool)  # (B, T+1)
        if seg is not None:
            # the first token of each document is nobody's target: its predecessor belongs to another one
            keep[:, 1:] &= seg[:, 1:] == seg[:, :-1]
        batch: Batch = {"input_ids": torch.from_numpy(x[:, :T].copy())}
        if self.label_shift == "data":
            labels = np.where(keep[:, 1:], x[:, 1:], IGNORE)  # labels[t] = target of position t
        else:
            labels = np.where(
                keep[:, :T], x[:, :T], IGNORE
            )  # the model shifts: labels[t] is predicted at t-1
        batch["labels"] = torch.from_numpy(labels)
        if seg is not None:
            s = seg[:, :T]
            first = np.maximum.accumulate(
                np.where(np.diff(s, prepend=-1, axis=1) != 0, self._arange[:T], 0), axis=1
            )
            batch["position_ids"] = torch.from_numpy(self._arange[:T] - first)
            if self.label_shift == "model":
                # transformers builds the per-document mask from position_ids only without a KV cache, and
                # its models make one whenever use_cache is on (the config default), in training too
                batch["use_cache"] = False
        return batch


class TokenStream(BatchStream):
    """A BatchStream whose state is also the global sample position, so it resumes at another world size."""

    def __init__(self, windows: _Windows, description: str):
        super().__init__(windows.batch, description=description)
        self._w = windows
        self.label_shift = windows.label_shift
        """How labels align with input_ids ("data": shifted already; "model": the model shifts them)."""

    def state_dict(self) -> dict[str, int]:
        w = self._w
        return {
            "position": self.position,
            "samples": self.position * w.world * w.B,
            "world_size": w.world,
            "micro_batch_size": w.B,
        }

    def load_state_dict(self, state: dict) -> None:
        w = self._w
        if isinstance(state, dict) and (state.get("world_size"), state.get("micro_batch_size")) not in (
            (None, None),
            (w.world, w.B),
        ):
            samples = state.get("samples")
            if isinstance(samples, bool) or not isinstance(samples, int) or samples < 0:
                raise ValueError(f"data state must hold 'samples': int >= 0, got {state!r}")
            self.position = samples // (w.world * w.B)
            return
        super().load_state_dict({"position": state.get("position") if isinstance(state, dict) else None})


def build(
    *,
    rank: int,
    world_size: int,
    micro_batch_size: int,
    seed: int,
    path: str,
    seq_len: int,
    document_mask: bool = True,
    label_shift: str = "data",
    holdout: float = 0.0,
    split: str = "train",
) -> TokenStream:
    """Endless batches {input_ids, labels[, position_ids]} (micro_batch_size, seq_len) of a prepared folder."""
    _positive_int("seq_len", seq_len)
    _positive_int("micro_batch_size", micro_batch_size)
    _positive_int("world_size", world_size)
    if not isinstance(document_mask, bool):
        raise ValueError(f"data.args.document_mask must be true or false, got {document_mask!r}")
    if label_shift not in LABEL_SHIFTS:
        raise ValueError(
            f"data.args.label_shift must be one of {', '.join(LABEL_SHIFTS)} (data: labels already shifted, "
            f"the built-in GPT; model: the model shifts them, Hugging Face), got {label_shift!r}"
        )
    if not 0 <= rank < world_size:
        raise ValueError(f"tokens data: rank {rank} is outside world_size {world_size}")
    if isinstance(holdout, bool) or not isinstance(holdout, int | float) or not 0 <= holdout < 1:
        raise ValueError(f"data.args.holdout must be a fraction in [0, 1), got {holdout!r}")
    if split not in ("train", "eval"):
        raise ValueError(f"data split must be train or eval, got {split!r}")
    if split == "eval" and not holdout:
        raise ValueError(
            "data.eval: {split: eval} reads the held-out windows, but data.args.holdout is 0; set "
            "data.args.holdout (e.g. 0.01), or give data.eval: {path: DIR} for a second prepared folder"
        )
    folder = TokenFolder(path)
    total = (folder.tokens - 1) // seq_len
    # the held-out windows are the stream's last ones (a document they cut is shared at that one boundary)
    held = max(1, round(holdout * total)) if holdout else 0
    first, count = (0, total - held) if split == "train" else (total - held, held)
    windows = _Windows(
        folder,
        seq_len=seq_len,
        rank=rank,
        world_size=world_size,
        micro_batch_size=micro_batch_size,
        seed=seed,
        document_mask=document_mask,
        label_shift=label_shift,
        windows=count,
        first_window=first,
    )
    if windows.windows < world_size * micro_batch_size:
        raise ValueError(
            f"data.args.path {path}: {folder.tokens} tokens make {windows.windows} {split} windows of seq_len {seq_len}, "
            f"fewer than one global micro-batch ({world_size} ranks x {micro_batch_size}); give more data or "
            "lower data.args.seq_len"
        )
    m = folder.manifest
    return TokenStream(
        windows,
        description=f"tokens {path} {m['documents']} docs {m['tokens']} tokens {split} windows={count} T={seq_len}",
    )
