"""`prepare_data`: input files -> a tokenized folder that `zerolaunch.data.tokens:build` memory-maps.

The folder (format "zerolaunch-tokens", version 1):
- `tokens-00000.bin`, ...: the token stream, documents back to back, each ending in its EOD token; raw
  little-endian uint16 when the vocabulary fits, else uint32. Shards end at document boundaries.
- `loss_mask-00000.bin`, ...: (prompt-completion and chat modes) one uint8 per token, 1 where the token is a
  target that carries loss; same shard sizes as the tokens.
- `documents.idx`: int64 offsets of the documents in the global token stream, N + 1 values (0, ..., M).
- `manifest.json`: documents, tokens, dtype, EOD id, mode, the tokenizer's identity, the sources with sizes and
  document counts, the shards, and the crc32 of every file above (`checksums`, data/checksums.py). Written last.

The output appears complete or not at all: everything is written into a hidden `.<out>.partial-<pid>-<random>`
folder beside OUT, fsynced, and renamed to OUT at the end; a killed run leaves only that hidden folder, which
the next run deletes and redoes. One run at a time writes an OUT (a lock beside it); OUT is never an input,
never holds or lies inside one (the tokenizer folder included), and `--force` replaces only a folder an
earlier prepare-data wrote: out_folder.py owns those rules ([Note: what --force may replace]). Records are
tokenized in fixed-size chunks, in input order, by `num_proc` forked processes (ordered `imap`), so the bytes
do not depend on num_proc or on timing. This module owns writing the folder; its format's name and version,
and reading its manifest back, are manifest.py; reading inputs is readers.py, tokenizing encode.py.
"""

from __future__ import annotations

import hashlib
import json
import multiprocessing
import os
import shutil
import sys
import time
import zlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from zerolaunch.data.checksums import checksum_record
from zerolaunch.data.encode import encode, eod_id, load_tokenizer
from zerolaunch.data.manifest import FORMAT, VERSION
from zerolaunch.data.out_folder import check_apart, check_replaceable, lock_out, partial_name, replace_out
from zerolaunch.data.readers import (
    MAX_DOCUMENT_BYTES,
    MODES,
    DataError,
    Record,
    Source,
    find_sources,
    read_records,
)
from zerolaunch.util.atomic import fsync_path
from zerolaunch.util.disk_errors import disk_error, disk_errors, is_disk_error
from zerolaunch.util.sizes import EstimateError, parse_bytes

CHUNK_RECORDS = 512
"""Records per tokenization task: large enough for the fast tokenizer's batch call, small for the ordered queue."""
SHARD_TOKENS = 1 << 30
"""A new shard starts once one holds this many tokens (2 GiB at uint16)."""
_TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "vocab.json",
    "merges.txt",
    "tokenizer.model",
    "vocab.txt",
    "chat_template.jinja",
)


def tokenizer_files_sha256(path: Path) -> str:
    h = hashlib.sha256()
    for name in _TOKENIZER_FILES:
        f = path / name
        if f.is_file():
            h.update(name.encode() + b"\0" + f.read_bytes() + b"\0")
    return h.hexdigest()


def tokenizer_identity(tokenizer, path: Path) -> dict:
    """What identifies the tokenizer: its folder, class, size, special ids and a hash of its files."""
    return {
        "path": str(path.resolve()),
        "class": type(tokenizer).__name__,
        "vocab_size": len(tokenizer),
        "bos_token_id": tokenizer.bos_token_id,
        "eos_token_id": tokenizer.eos_token_id,
        "files_sha256": tokenizer_files_sha256(path),
    }


# the forked workers inherit these: the tokenizer is loaded once, before the fork
_WORKER: dict = {}


def _encode_chunk(records: list[Record]):
    w = _WORKER
    return encode(records, w["tokenizer"], w["mode"], w["eod"], w["dtype"])


def _chunks(
    sources: list[Source], mode: str, text_key: str, counts: dict, max_document_bytes: int | None
) -> Iterator[list[Record]]:
    chunk: list[Record] = []
    for src in sources:
        n = 0
        for record in read_records(src, mode, text_key, max_document_bytes):
            chunk.append(record)
            n += 1
            if len(chunk) == CHUNK_RECORDS:
                yield chunk
                chunk = []
        if n == 0:
            raise DataError(f"{src.path}: empty input (no documents)")
        src.read_bytes[0] = src.size_bytes  # readers other than jsonl say nothing until the file ends
        counts[src.path] = n
    if chunk:
        yield chunk


@dataclass
class _Shards:
    """Appends token (and loss mask) arrays to shard files, starting a new shard past SHARD_TOKENS."""

    folder: Path
    with_mask: bool
    shard_tokens: int = SHARD_TOKENS
    shards: list[dict] = field(default_factory=list)
    crcs: dict[str, int] = field(default_factory=dict)
    """crc32 of every file written, by name, taken as the bytes go out (data/checksums.py)."""
    _files: tuple | None = None

    def _open(self) -> None:
        self.close()
        i = len(self.shards)
        tok = open(self.folder / f"tokens-{i:05d}.bin", "wb")
        mask = open(self.folder / f"loss_mask-{i:05d}.bin", "wb") if self.with_mask else None
        self.shards.append({"file": tok.name.rsplit("/", 1)[-1], "tokens": 0})
        self._files = (tok, mask)

    def write(self, tokens: np.ndarray, mask: np.ndarray | None, lengths: np.ndarray) -> None:
        """Append whole documents (`lengths` tokens each); a shard past `shard_tokens` ends at a document end."""
        ends = np.cumsum(lengths)
        done, doc = 0, 0
        while doc < lengths.size:
            if self._files is None or self.shards[-1]["tokens"] >= self.shard_tokens:
                self._open()
            room = self.shard_tokens - self.shards[-1]["tokens"]
            # documents that still fit, at least one (a document longer than a shard is a shard of its own)
            last = max(int(np.searchsorted(ends, done + room, side="right")), doc + 1)
            stop = int(ends[last - 1])
            tok, mask_file = self._files
            self.write_bytes(
                tok, tokens[done:stop].astype(tokens.dtype.newbyteorder("<"), copy=False).tobytes()
            )
            if mask_file is not None:
                self.write_bytes(mask_file, mask[done:stop].tobytes())
            self.shards[-1]["tokens"] += stop - done
            done, doc = stop, last

    def write_bytes(self, file, data: bytes) -> None:
        file.write(data)
        name = Path(file.name).name
        self.crcs[name] = zlib.crc32(data, self.crcs.get(name, 0))

    def close(self) -> None:
        if self._files is not None:
            for f in self._files:
                if f is not None:
                    f.flush()
                    os.fsync(f.fileno())
                    f.close()
            self._files = None


class _Progress:
    """documents/s, tokens/s and an ETA from the input bytes read, on stderr every `every_s` seconds."""

    def __init__(self, total_bytes: int, enabled: bool, every_s: float = 2.0):
        self.total_bytes, self.enabled, self.every_s = total_bytes, enabled, every_s
        self.start = self.last = time.perf_counter()

    def line(self, docs: int, tokens: int, bytes_done: int) -> str:
        elapsed = max(time.perf_counter() - self.start, 1e-9)
        frac = min(bytes_done / self.total_bytes, 1.0) if self.total_bytes else 0.0
        eta = elapsed * (1 - frac) / frac if frac > 0 else float("nan")
        eta_s = f"{eta:.0f}s" if eta == eta else "?"
        return (
            f"prepare-data: {docs:,} docs {tokens:,} tokens | {docs / elapsed:,.0f} docs/s "
            f"{tokens / elapsed:,.0f} tokens/s | {100 * frac:.0f}% of input, ETA {eta_s}"
        )

    def maybe(self, docs: int, tokens: int, bytes_done: int, final: bool = False) -> None:
        now = time.perf_counter()
        if self.enabled and (final or now - self.last >= self.every_s):
            self.last = now
            print(self.line(docs, tokens, bytes_done), file=sys.stderr, flush=True)


def parse_document_limit(text: str) -> int | None:
    """--max-document-bytes: a size ("8MiB", "50MB") or "none"."""
    if text.strip().lower() == "none":
        return None
    try:
        return parse_bytes(text, "--max-document-bytes", example="64MiB")
    except EstimateError as e:
        raise DataError(f"{e} (or none for no limit)") from None


def prepare_data(
    inputs: list[str | Path],
    *,
    tokenizer: str | Path,
    out: str | Path,
    text_key: str = "text",
    num_proc: int = 1,
    mode: str = "text",
    force: bool = False,
    progress: bool = True,
    shard_tokens: int = SHARD_TOKENS,
    max_document_bytes: int | None = MAX_DOCUMENT_BYTES,
) -> dict:
    """Tokenize `inputs` into the folder `out`; returns its manifest. A document over `max_document_bytes`
    of text (None: no limit) is refused by name: tokenizing it would need ~250x its size in memory."""
    if mode not in MODES:
        raise DataError(f"--mode {mode!r} is unknown; choose one of {', '.join(MODES)}")
    if isinstance(num_proc, bool) or not isinstance(num_proc, int) or num_proc < 1:
        raise DataError(f"--num-proc must be an integer >= 1, got {num_proc!r}")
    out = Path(out)
    check_apart(out, inputs, tokenizer)
    check_replaceable(out, force, FORMAT)  # early, before the tokenizer loads; again under the lock below
    sources = find_sources(inputs)
    tok_path = Path(tokenizer)
    tok = load_tokenizer(tok_path)
    vocab = len(tok)
    dtype = np.dtype(np.uint16 if vocab <= 1 << 16 else np.uint32)
    eod = eod_id(tok)
    partial = out.parent / partial_name(out)
    # the workers are the parallelism; the Rust tokenizer's own threads would oversubscribe the cores
    os.environ["TOKENIZERS_PARALLELISM"] = "false"
    _WORKER.update(tokenizer=tok, mode=mode, eod=eod, dtype=dtype)
    counts: dict = {}
    shards = _Shards(partial, with_mask=mode != "text", shard_tokens=shard_tokens)
    report = _Progress(sum(s.size_bytes for s in sources), progress)
    docs = tokens = 0
    where = {"path": out, "what": "the prepared data", "fix": "choose another --out"}
    with disk_errors(**where):
        try:
            out.parent.mkdir(parents=True, exist_ok=True)
        except (FileExistsError, NotADirectoryError):
            raise DataError(f"--out {out}: a file stands where its folder {out.parent} would go") from None
        lock = lock_out(out, force, FORMAT)
    pool = None
    try:
        partial.mkdir()
        chunks = _chunks(sources, mode, text_key, counts, max_document_bytes)
        if num_proc > 1:
            pool = multiprocessing.get_context("fork").Pool(num_proc)
            encoded = pool.imap(_encode_chunk, chunks)
        else:
            encoded = map(_encode_chunk, chunks)
        with open(partial / "documents.idx", "wb") as idx:
            shards.write_bytes(idx, np.zeros(1, dtype="<i8").tobytes())
            for enc in encoded:
                shards.write(enc.tokens, enc.loss_mask, enc.lengths)
                shards.write_bytes(idx, (tokens + np.cumsum(enc.lengths)).astype("<i8").tobytes())
                docs += int(enc.lengths.size)
                tokens += int(enc.tokens.size)
                report.maybe(docs, tokens, sum(src.read_bytes[0] for src in sources))
            idx.flush()
            os.fsync(idx.fileno())
        shards.close()
        if docs == 0:
            raise DataError("prepare-data: the inputs hold no documents")
        manifest = {
            "format": FORMAT,
            "version": VERSION,
            "documents": docs,
            "tokens": tokens,
            "dtype": dtype.name,
            "eod_token_id": eod,
            "mode": mode,
            "text_key": text_key if mode == "text" else None,
            "loss_mask": mode != "text",
            "tokenizer": tokenizer_identity(tok, tok_path),
            "sources": [
                {"path": str(s.path.resolve()), "bytes": s.size_bytes, "documents": counts[s.path]}
                for s in sources
            ],
            "shards": shards.shards,
            "checksums": checksum_record(shards.crcs),
        }
        with open(partial / "manifest.json", "w") as f:
            json.dump(manifest, f, indent=2)
            f.write("\n")
            f.flush()
            os.fsync(f.fileno())
        fsync_path(partial)
        replace_out(partial, out)
        fsync_path(out.parent)
        report.maybe(docs, tokens, report.total_bytes, final=True)
        return manifest
    except BaseException as err:
        try:
            shards.close()
        except OSError:
            pass  # the disk that refused a write may refuse the flush too; the folder goes anyway
        if pool is not None:
            pool.terminate()
            pool = None
        shutil.rmtree(partial, ignore_errors=True)
        if isinstance(err, OSError) and is_disk_error(err):
            after = f"{out} is as it was." if out.exists() else "Nothing was left behind."
            raise disk_error(err, **where, after=after) from None
        raise
    finally:
        if pool is not None:
            pool.close()
            pool.join()
        _WORKER.clear()
        lock.release()
