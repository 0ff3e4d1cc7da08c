"""Text / JSONL files -> batches for Hugging Face causal LMs (`data.builder: zerolaunch.data.hf_text:build`).

With a `tokenizer` (a local directory) this is a thin path onto prepare-data and data.tokens: the files are
tokenized once by `prepare_data` into a cached folder (`cache`, default ~/.cache/zerolaunch/tokens/<key>, the key
a hash of the sources' paths, sizes and mtimes, the tokenizer's files and text_key; the first rank prepares
it under a file lock, the others wait and reuse it), and `zerolaunch.data.tokens:build` reads it with
`label_shift: model` (HF labels) and its defaults otherwise (document_mask on). The files are those
prepare-data reads (.txt/.md/.jsonl/.jsonl.gz/.json/.parquet; a folder means its files). For a corpus of any
size, run `zerolaunch prepare-data` yourself and use data.tokens directly (docs/data.md).

Without a tokenizer it is byte-level (ids 0..255): every rank reads the files through prepare-data's readers
(readers.py; plain text also .text/.py) into memory and cuts the bytes into fixed windows; batches follow the
Hugging Face convention `labels == input_ids` (the model shifts the labels itself). That is fine for the
corpora a launcher test uses, not for pre-training-size data. Batches are resumable (stream.BatchStream: batch i is a pure function of i).
"""

from __future__ import annotations

import fcntl
import functools
import hashlib
import json
import os
from pathlib import Path

import torch

from zerolaunch.data.manifest import FORMAT, VERSION
from zerolaunch.data.prepare import prepare_data, tokenizer_files_sha256
from zerolaunch.data.readers import TEXT_SUFFIXES, DataError, find_sources, read_records
from zerolaunch.data.stream import BatchStream, mix_seed
from zerolaunch.data.tokens import build as tokens_build

BYTE_TEXT_SUFFIXES = TEXT_SUFFIXES + (".text", ".py")
"""Plain text of the byte-level path: prepare-data's, and source code (recipes/hf-llama-1b.yaml trains on the
docs and the package's own files)."""
BYTE_VOCAB_SIZE = 256
"""Byte-level tokenization: one token per UTF-8 byte, so the model's vocab_size must be >= 256."""
_EPOCH_SALT = 11


def read_documents(path: str | os.PathLike | list, text_key: str = "text") -> list[str]:
    """One string per document, read as prepare-data reads its inputs (data/readers.py): a whole text file, or
    the `text_key` field of each JSONL line (or JSON item, or parquet/arrow row); a folder means its files."""
    paths = path if isinstance(path, list | tuple) else [path]
    if not paths:
        raise DataError("data.args.path is an empty list: give a text/JSONL file or a folder of them")
    try:
        sources = find_sources(paths, text_suffixes=BYTE_TEXT_SUFFIXES)
    except DataError as e:
        raise DataError(f"data.args.path: {e}") from None
    return [record.text for src in sources for record in read_records(src, "text", text_key)]


def tokenize(docs: list[str], tokenizer=None) -> torch.Tensor:
    """All documents as one 1-D long tensor, each followed by the end-of-text token (byte-level: a newline)."""
    ids: list[int] = []
    if tokenizer is None:
        for d in docs:
            ids.extend(d.encode("utf-8"))
            ids.append(ord("\n"))
    else:
        eos = tokenizer.eos_token_id
        for d in docs:
            ids.extend(tokenizer(d, add_special_tokens=False)["input_ids"])
            if eos is not None:
                ids.append(eos)
    return torch.tensor(ids, dtype=torch.long)


def prepared_folder(path, tokenizer, text_key: str, cache: str | None) -> Path:
    """The prepare-data folder of these files and this tokenizer, made once (under a lock) and then reused."""
    paths = path if isinstance(path, list | tuple) else [path]
    sources = find_sources(paths)
    key = json.dumps(
        {
            "format": [FORMAT, VERSION],
            "sources": [[str(s.path.resolve()), s.size_bytes, s.path.stat().st_mtime_ns] for s in sources],
            "tokenizer": tokenizer_files_sha256(Path(tokenizer)),
            "text_key": text_key,
        },
        sort_keys=True,
    )
    root = Path(cache) if cache is not None else Path.home() / ".cache" / "zerolaunch" / "tokens"
    root.mkdir(parents=True, exist_ok=True)
    folder = root / hashlib.sha256(key.encode()).hexdigest()[:20]
    with open(root / f"{folder.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # one rank prepares; the others wait for it, then reuse the folder
        if not (folder / "manifest.json").is_file():
            prepare_data(
                paths, tokenizer=tokenizer, out=folder, text_key=text_key, progress=False, force=True
            )
    return folder


def windows_stream(
    tokens: torch.Tensor,
    *,
    seq_len: int,
    rank: int,
    world_size: int,
    micro_batch_size: int,
    seed: int,
    description: str,
) -> BatchStream:
    """Endless batches of this rank's non-overlapping `seq_len` windows of `tokens`.

    Window w belongs to rank `w % world_size` (disjoint across ranks, the same count on each); each epoch
    visits a rank's windows in an order shuffled by (seed, epoch). Batch i is a pure function of i
    (stream.BatchStream), so a resumed run sees the batches it would have seen.
    """
    window_count = tokens.numel() // seq_len
    windows_per_rank = window_count // world_size
    if windows_per_rank < 1:
        raise ValueError(
            f"the text holds {tokens.numel()} tokens = {window_count} windows of seq_len {seq_len}, fewer than "
            f"world_size {world_size}; give more text or lower data.args.seq_len"
        )
    windows = tokens[: window_count * seq_len].view(window_count, seq_len)  # (W, T)
    mine = torch.arange(windows_per_rank) * world_size + rank  # this rank's window ids, (W_r,)

    @functools.lru_cache(maxsize=2)  # a batch spans at most two epochs
    def epoch_order(epoch: int) -> torch.Tensor:
        g = torch.Generator().manual_seed(mix_seed(seed, _EPOCH_SALT, epoch))
        return mine[torch.randperm(windows_per_rank, generator=g)]

    def make_batch(index: int) -> dict[str, torch.Tensor]:
        ids = []
        for k in range(index * micro_batch_size, (index + 1) * micro_batch_size):
            epoch, slot = divmod(k, windows_per_rank)
            ids.append(int(epoch_order(epoch)[slot]))
        x = windows[torch.tensor(ids)]  # (B, T)
        # HF convention: labels are the inputs; the model shifts them by one itself.
        return {"input_ids": x, "labels": x.clone()}

    return BatchStream(make_batch, description=f"{description} windows/rank={windows_per_rank} T={seq_len}")


def build(
    *,
    rank: int,
    world_size: int,
    micro_batch_size: int,
    seed: int,
    path,
    seq_len: int = 256,
    tokenizer: str | None = None,
    text_key: str = "text",
    cache: str | None = None,
) -> BatchStream:
    """The data builder: `path` (file, directory or list), `seq_len`, optional local `tokenizer` directory
    (then the files are prepared once into `cache` and read by data.tokens)."""
    for name, value in (
        ("seq_len", seq_len),
        ("micro_batch_size", micro_batch_size),
        ("world_size", world_size),
    ):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"data.args.{name} must be a positive integer, got {value!r}")
    if seq_len < 2:
        raise ValueError(f"data.args.seq_len must be >= 2 (one token predicts the next), got {seq_len}")
    if tokenizer is not None:
        folder = prepared_folder(path, tokenizer, text_key, cache)
        return tokens_build(
            rank=rank,
            world_size=world_size,
            micro_batch_size=micro_batch_size,
            seed=seed,
            path=str(folder),
            seq_len=seq_len,
            label_shift="model",
        )
    docs = read_documents(path, text_key=text_key)
    tokens = tokenize(docs)
    kind = "byte-level"
    return windows_stream(
        tokens,
        seq_len=seq_len,
        rank=rank,
        world_size=world_size,
        micro_batch_size=micro_batch_size,
        seed=seed,
        description=f"hf_text {len(docs)} docs {tokens.numel()} tokens {kind}",
    )
