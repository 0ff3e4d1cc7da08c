"""crc32 of a prepared folder's files: recorded by prepare-data, checked lazily by the training reader
(tokens.py) and in full by `zerolaunch prepare-data --verify DIR`.

The damage is made here with numpy on the written files, at the same size (a size change is caught by the
reader's older size check). Crcs are recomputed here with zlib, independently of data/checksums.py. Leaves
out: training runs (the reader's error is what a worker and the launcher's data probe meet).
"""

from __future__ import annotations

import json
import sys
import zlib
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from _tiny_tokenizer import make_tokenizer  # noqa: E402

from zerolaunch.cli.app import app  # noqa: E402
from zerolaunch.data.prepare import prepare_data  # noqa: E402
from zerolaunch.data.readers import DataError  # noqa: E402
from zerolaunch.data.tokens import build  # noqa: E402

WORDS = "the quick brown fox jumps over lazy dog hello world tiny corpus".split()


@pytest.fixture(scope="module")
def source(tmp_path_factory):
    root = tmp_path_factory.mktemp("crc")
    tok = make_tokenizer(root / "tok")
    rng = np.random.default_rng(0)
    texts = [" ".join(rng.choice(WORDS, size=int(rng.integers(2, 12)))) for _ in range(300)]
    (root / "a.jsonl").write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))
    rows = [{"prompt": t, "completion": " " + t[::-1]} for t in texts[:80]]
    (root / "sft.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return root, tok


@pytest.fixture
def folder(source, tmp_path):
    root, tok = source
    out = tmp_path / "text"
    prepare_data([root / "a.jsonl"], tokenizer=tok, out=out, progress=False, shard_tokens=800)
    return out


def _first_batches(path, n=40):
    stream = build(rank=0, world_size=1, micro_batch_size=4, seed=3, path=str(path), seq_len=16)
    it = iter(stream)
    return [next(it) for _ in range(n)]


def _verify(path):
    result = CliRunner().invoke(app, ["prepare-data", "--verify", str(path)])
    return result.exit_code, result.output + (result.stderr if result.stderr_bytes is not None else "")


def test_manifest_records_the_crc32_of_every_file(source, tmp_path):
    root, tok = source
    out = tmp_path / "sft"
    prepare_data([root / "sft.jsonl"], tokenizer=tok, out=out, mode="prompt-completion", progress=False)
    m = json.loads((out / "manifest.json").read_text())
    names = sorted(p.name for p in out.iterdir() if p.name != "manifest.json")
    assert m["checksums"]["algorithm"] == "crc32"
    assert sorted(m["checksums"]["files"]) == names  # tokens, loss masks and documents.idx
    for name in names:
        assert m["checksums"]["files"][name] == zlib.crc32((out / name).read_bytes())


def test_rewritten_tokens_at_the_same_size_are_refused_on_first_read(folder):
    m = json.loads((folder / "manifest.json").read_text())
    shard = folder / m["shards"][0]["file"]
    tokens = np.fromfile(shard, dtype=m["dtype"])
    rng = np.random.default_rng(1)
    hit = rng.choice(tokens.size, size=max(1, tokens.size // 50), replace=False)  # 2% of the tokens
    tokens[hit] = (tokens[hit] + 1) % 256
    tokens.tofile(shard)
    with pytest.raises(DataError) as err:
        _first_batches(folder)
    message = str(err.value)
    expected = m["checksums"]["files"][shard.name]
    assert str(shard) in message and f"{expected:#010x}" in message
    assert f"{zlib.crc32(shard.read_bytes()):#010x}" in message and "prepare-data" in message


def test_scrambled_document_index_at_the_same_size_is_refused(folder):
    idx = folder / "documents.idx"
    offsets = np.fromfile(idx, dtype="<i8")
    offsets[1:-1] = np.random.default_rng(2).permutation(offsets[1:-1])
    offsets.tofile(idx)
    with pytest.raises(DataError, match="documents.idx"):
        _first_batches(folder, n=1)


def test_verify_says_ok_with_counts_and_names_each_bad_file(folder):
    m = json.loads((folder / "manifest.json").read_text())
    code, out = _verify(folder)
    assert code == 0, out
    assert (
        out.startswith("ok") and f"{m['documents']:,} documents" in out and f"{m['tokens']:,} tokens" in out
    )
    first, last = folder / m["shards"][0]["file"], folder / m["shards"][-1]["file"]
    assert first != last
    for shard in (first, last):
        data = bytearray(shard.read_bytes())
        data[len(data) // 2] ^= 0xFF
        shard.write_bytes(bytes(data))
    code, out = _verify(folder)
    assert code == 2 and "Traceback" not in out
    assert first.name in out and last.name in out and "documents.idx" not in out
    assert f"{m['checksums']['files'][first.name]:#010x}" in out


def test_a_folder_without_checksums_still_trains_and_verify_says_so(folder):
    path = folder / "manifest.json"
    m = json.loads(path.read_text())
    del m["checksums"]  # as prepare-data wrote it before checksums existed
    path.write_text(json.dumps(m))
    assert len(_first_batches(folder, n=3)) == 3
    code, out = _verify(folder)
    assert code == 0 and "no checksums recorded" in out


def test_verify_of_a_missing_folder_or_with_inputs_is_exit_2(folder, tmp_path):
    code, out = _verify(tmp_path / "nowhere")
    assert code == 2 and "manifest.json" in out
    result = CliRunner().invoke(app, ["prepare-data", "x.jsonl", "--verify", str(folder)])
    assert result.exit_code == 2
