"""data.tokens loader speed and memory: batches/s at seq 2048 x micro batch 8 on one core, and a worker's RSS
with a 10M-token folder against a 1B-token folder (synthetic tokens, uint16).

    OMP_NUM_THREADS=1 PYTHONPATH=$PWD python bench/data_loader.py [--dir /tmp/zl_bench] [--big 1000000000]

Writes the synthetic folders in the prepare-data format (random tokens; document lengths drawn around 1000
tokens, so a 1B folder has ~1M documents in its index), then measures each in a fresh process: build the
stream, draw `--batches` batches (document_mask on and off), report batches/s and RSS (VmRSS, and its
anonymous part RssAnon: the token pages a memory map reads are file-backed and the kernel drops them under
pressure). Prints a table; deletes the folders at the end unless --keep. Needs ~2 GB of disk per 1B tokens.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

CHUNK = 1 << 26


def write_folder(folder: Path, tokens: int, vocab: int = 50257, seed: int = 0) -> None:
    """A prepared folder of `tokens` random tokens in documents of ~1000 tokens (the prepare-data format)."""
    if (folder / "manifest.json").is_file():
        return
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    with open(folder / "tokens-00000.bin", "wb") as f:
        for start in range(0, tokens, CHUNK):
            f.write(rng.integers(0, vocab, size=min(CHUNK, tokens - start), dtype=np.uint16).tobytes())
    lengths = rng.integers(200, 1800, size=tokens // 200 + 1)
    ends = np.cumsum(lengths)
    ends = ends[ends < tokens]
    offsets = np.concatenate([[0], ends, [tokens]]).astype("<i8")
    offsets.tofile(folder / "documents.idx")
    manifest = {
        "format": "zerolaunch-tokens",
        "version": 1,
        "documents": int(offsets.size - 1),
        "tokens": tokens,
        "dtype": "uint16",
        "eod_token_id": 0,
        "mode": "text",
        "loss_mask": False,
        "tokenizer": {"synthetic": True, "vocab_size": vocab},
        "sources": [],
        "shards": [{"file": "tokens-00000.bin", "tokens": tokens}],
    }
    (folder / "manifest.json").write_text(json.dumps(manifest))


def _rss_kib() -> dict:
    out = {}
    for line in Path("/proc/self/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "RssAnon", "RssFile"):
            out[key] = int(value.split()[0])
    return out


def measure(folder: str, batches: int, document_mask: bool) -> dict:
    """In this process: build the stream, draw `batches` batches; batches/s and RSS."""
    import torch

    torch.set_num_threads(1)
    from zerolaunch.data.tokens import build

    before = _rss_kib()
    stream = build(
        rank=0,
        world_size=1,
        micro_batch_size=8,
        seed=0,
        path=folder,
        seq_len=2048,
        document_mask=document_mask,
    )
    it = iter(stream)
    next(it)  # the first batch builds the epoch's order
    t0 = time.perf_counter()
    for _ in range(batches):
        next(it)
    seconds = time.perf_counter() - t0
    after = _rss_kib()
    return {"batches_per_s": batches / seconds, "rss_before_kib": before, "rss_after_kib": after}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--dir", default="/tmp/zl_bench_tokens")
    p.add_argument("--small", type=int, default=10_000_000)
    p.add_argument("--big", type=int, default=1_000_000_000)
    p.add_argument("--batches", type=int, default=500)
    p.add_argument("--keep", action="store_true")
    p.add_argument("--child", nargs=3, metavar=("FOLDER", "BATCHES", "MASK"), help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        folder, n, mask = args.child
        print(json.dumps(measure(folder, int(n), mask == "1")))
        return
    root = Path(args.dir)
    rows = []
    try:
        for name, tokens in (("10M", args.small), ("1B", args.big)):
            t0 = time.perf_counter()
            write_folder(root / name, tokens)
            print(f"wrote {name} folder ({tokens:,} tokens) in {time.perf_counter() - t0:.0f} s", flush=True)
            for mask in (True, False):
                cmd = [
                    sys.executable,
                    __file__,
                    "--child",
                    str(root / name),
                    str(args.batches),
                    "1" if mask else "0",
                ]
                out = subprocess.run(
                    cmd, capture_output=True, text=True, check=True, env=dict(os.environ, OMP_NUM_THREADS="1")
                )
                rows.append((name, mask, json.loads(out.stdout.strip().splitlines()[-1])))
    finally:
        if not args.keep:
            shutil.rmtree(root, ignore_errors=True)
    print(f"\nseq 2048 x micro batch 8, one core, {args.batches} batches after the first")
    print(
        f"{'folder':>7} {'doc mask':>8} {'batches/s':>10} {'VmRSS MiB':>10} {'RssAnon MiB':>12} {'RssFile MiB':>12}"
    )
    for name, mask, r in rows:
        a = r["rss_after_kib"]
        print(
            f"{name:>7} {str(mask):>8} {r['batches_per_s']:>10.0f} {a['VmRSS'] / 1024:>10.1f} "
            f"{a['RssAnon'] / 1024:>12.1f} {a['RssFile'] / 1024:>12.1f}"
        )


if __name__ == "__main__":
    main()
