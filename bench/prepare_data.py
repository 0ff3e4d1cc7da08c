"""prepare-data tokens/s against `datasets.Dataset.map(tokenizer, batched=True, num_proc=N)` on the same files.

    OMP_NUM_THREADS=1 PYTHONPATH=$PWD python bench/prepare_data.py [--docs 60000] [--num-proc 2]

Makes a jsonl corpus of synthetic English-like documents (words drawn from a Zipf-like table, 50-1500 words
each), trains a byte-level BPE (vocab 16k, the `tokenizers` library) on part of it and saves it as a
PreTrainedTokenizerFast folder, then times, on the same files with the same tokenizer and the same number of
processes, best of `--repeat`:
- zerolaunch: `prepare_data(...)`: read, tokenize, write the shards, the index and the manifest;
- datasets: `load_dataset("json", ...)` into a fresh cache, then `.map(tok(batch["text"]), batched=True,
  num_proc=N)` (the tokens stay in datasets' arrow cache, not flattened into a token file).
Prints a table of seconds, tokens/s and CPU seconds (this process and its workers). The corpus lives in --dir and is deleted at the end unless --keep.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import tempfile
import time
from pathlib import Path

import numpy as np


def make_corpus(path: Path, docs: int, seed: int = 0) -> None:
    rng = np.random.default_rng(seed)
    letters = np.array(list("etaoinshrdlcumwfgypbvkjxqz"))
    vocab = ["".join(rng.choice(letters, size=int(rng.integers(1, 10)))) for _ in range(20000)]
    weights = 1.0 / np.arange(1, len(vocab) + 1)
    weights /= weights.sum()
    with open(path, "w") as f:
        for _ in range(docs):
            words = rng.choice(len(vocab), size=int(rng.integers(50, 1500)), p=weights)
            f.write(json.dumps({"text": " ".join(vocab[w] for w in words) + "."}) + "\n")


def make_tokenizer(corpus: Path, folder: Path, vocab_size: int = 16000) -> None:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=["<|endoftext|>"], show_progress=False
    )
    with open(corpus) as f:
        sample = [json.loads(line)["text"] for _, line in zip(range(2000), f, strict=False)]
    tok.train_from_iterator(sample, trainer)
    PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|endoftext|>").save_pretrained(folder)


def _cpu_seconds() -> float:
    """User + system CPU of this process and its reaped children (the worker processes of both pipelines)."""
    me, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime


def timed(fn, *args) -> tuple[float, int, float]:
    """(wall seconds, tokens, CPU seconds) of fn(*args) -> tokens."""
    cpu, t0 = _cpu_seconds(), time.perf_counter()
    tokens = fn(*args)
    return time.perf_counter() - t0, tokens, _cpu_seconds() - cpu


def run_zerolaunch(corpus: Path, tok: Path, out: Path, num_proc: int) -> int:
    from zerolaunch.data.prepare import prepare_data

    shutil.rmtree(out, ignore_errors=True)
    return prepare_data([corpus], tokenizer=tok, out=out, num_proc=num_proc, progress=False)["tokens"]


def run_datasets(corpus: Path, tok_dir: Path, cache: Path, num_proc: int) -> int:
    import datasets
    from transformers import AutoTokenizer

    datasets.disable_progress_bars()
    shutil.rmtree(cache, ignore_errors=True)
    tok = AutoTokenizer.from_pretrained(str(tok_dir))
    ds = datasets.load_dataset("json", data_files=str(corpus), split="train", cache_dir=str(cache))
    mapped = ds.map(lambda b: tok(b["text"]), batched=True, num_proc=num_proc, remove_columns=["text"])
    return int(sum(len(ids) for ids in mapped["input_ids"]))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--docs", type=int, default=60000)
    p.add_argument("--num-proc", type=int, default=2)
    p.add_argument("--repeat", type=int, default=2)
    p.add_argument("--dir", default=None)
    p.add_argument("--keep", action="store_true")
    args = p.parse_args()
    os.environ["TOKENIZERS_PARALLELISM"] = "false"  # both sides: the processes are the parallelism
    root = Path(args.dir or tempfile.mkdtemp(prefix="zl_bench_prep_"))
    root.mkdir(parents=True, exist_ok=True)
    try:
        corpus, tok = root / "corpus.jsonl", root / "tok"
        if not corpus.exists():
            make_corpus(corpus, args.docs)
        if not tok.exists():
            make_tokenizer(corpus, tok)
        mb = corpus.stat().st_size / 2**20
        # interleaved, so a change in the machine's load (it is shared) hits both sides alike
        zl_runs, ds_runs = [], []
        for _ in range(args.repeat):
            zl_runs.append(timed(run_zerolaunch, corpus, tok, root / "out", args.num_proc))
            ds_runs.append(timed(run_datasets, corpus, tok, root / "hf_cache", args.num_proc))
            print(f"zerolaunch {zl_runs[-1][0]:.1f} s, datasets {ds_runs[-1][0]:.1f} s", flush=True)
        zl, ds = min(zl_runs), min(ds_runs)
    finally:
        if not args.keep:
            shutil.rmtree(root, ignore_errors=True)
    print(
        f"\n{args.docs:,} docs, {mb:.0f} MiB jsonl, BPE vocab 16k, num_proc {args.num_proc}, best of {args.repeat}"
    )
    print(
        f"{'pipeline':<44} {'seconds':>8} {'tokens':>12} {'tokens/s':>11} {'CPU s':>7} {'tokens/CPU s':>13}"
    )
    rows = [
        ("zerolaunch prepare-data (read+tokenize+write)", *zl),
        ("datasets load_dataset + map(batched)", *ds),
    ]
    for name, seconds, tokens, cpu in rows:
        print(
            f"{name:<44} {seconds:>8.1f} {tokens:>12,} {tokens / seconds:>11,.0f} {cpu:>7.1f} {tokens / cpu:>13,.0f}"
        )
    print(f"ratio zerolaunch / datasets, tokens/s: {(zl[1] / zl[0]) / (ds[1] / ds[0]):.2f}x, ", end="")
    print(
        f"tokens per CPU second: {(zl[1] / zl[2]) / (ds[1] / ds[2]):.2f}x (the machine is shared: see both)"
    )


if __name__ == "__main__":
    main()
