"""zerolaunch.data.hf_text: text/JSONL reading, byte-level and local-tokenizer tokenization, rank splits.

Covers: documents from files, directories and JSONL; batch shapes and the HF label convention; disjoint rank
shares; reproducible and resumable streams; the errors for bad input. Leaves out: training (tests/e2e).
"""

import json

import numpy as np
import pytest
import torch

from zerolaunch.data import hf_text
from zerolaunch.data.encode import load_tokenizer
from zerolaunch.data.readers import DataError


def _write(tmp_path, name, text):
    p = tmp_path / name
    p.write_text(text, encoding="utf-8")
    return p


def test_byte_level_tokens_are_utf8_bytes_plus_newline_separator(tmp_path):
    f = _write(tmp_path, "a.txt", "hé")
    tokens = hf_text.tokenize(hf_text.read_documents(f))
    assert tokens.tolist() == [104, 0xC3, 0xA9, 10]


def test_jsonl_and_directory(tmp_path):
    d = tmp_path / "corpus"
    d.mkdir()
    _write(d, "b.jsonl", json.dumps({"body": "second"}) + "\n\n" + json.dumps({"body": "third"}) + "\n")
    _write(d, "a.txt", "first")
    _write(d, "ignored.bin", "xx")
    assert hf_text.read_documents(d, text_key="body") == ["first", "second", "third"]


def test_files_are_read_by_prepare_data_readers(tmp_path):
    """The byte-level path reads what prepare-data reads (a .jsonl.gz's records, not its compressed bytes)
    and, in a folder, source code too."""
    import gzip

    d = tmp_path / "corpus"
    d.mkdir()
    with gzip.open(d / "a.jsonl.gz", "wt", encoding="utf-8") as f:
        f.write(json.dumps({"text": "zipped"}) + "\n")
    _write(d, "b.py", "print(1)")
    assert hf_text.read_documents(d) == ["zipped", "print(1)"]


def test_batches_follow_hf_label_convention_and_ranks_are_disjoint(tmp_path):
    # increasing numbers: every 16-byte window of the text is distinct.
    f = _write(tmp_path, "t.txt", " ".join(f"{i:04d}" for i in range(200)))
    streams = [
        hf_text.build(rank=r, world_size=2, micro_batch_size=3, seed=5, path=str(f), seq_len=16)
        for r in range(2)
    ]
    seen = []
    for s in streams:
        it = iter(s)
        rows = []
        # 1000 tokens -> 62 windows -> 31 per rank: 10 batches of 3 stay inside the first epoch.
        for _ in range(10):
            b = next(it)
            assert b["input_ids"].shape == (3, 16) and b["input_ids"].dtype == torch.long
            assert torch.equal(b["input_ids"], b["labels"])
            rows.extend(tuple(r) for r in b["input_ids"].tolist())
        assert len(set(rows)) == 30  # no window twice within an epoch
        seen.append(set(rows))
    assert not seen[0] & seen[1]


def test_stream_is_reproducible_and_resumable(tmp_path):
    f = _write(tmp_path, "t.txt", "".join(chr(97 + (i * 7) % 26) for i in range(3000)))

    def make(seed):
        return hf_text.build(rank=0, world_size=1, micro_batch_size=4, seed=seed, path=str(f), seq_len=32)

    first = [b["input_ids"] for _, b in zip(range(30), make(1), strict=False)]
    again = [b["input_ids"] for _, b in zip(range(30), make(1), strict=False)]
    assert all(torch.equal(a, b) for a, b in zip(first, again, strict=True))
    other = next(iter(make(2)))["input_ids"]
    assert not torch.equal(first[0], other)
    resumed = make(1)
    resumed.load_state_dict({"position": 25})
    assert torch.equal(next(iter(resumed))["input_ids"], first[25])


def test_missing_path_is_a_clear_error(tmp_path):
    with pytest.raises(DataError, match=r"data.args.path: .*nope.txt: no such file"):
        hf_text.build(rank=0, world_size=1, micro_batch_size=1, seed=0, path=str(tmp_path / "nope.txt"))


def test_bad_jsonl_lines_name_file_and_line(tmp_path):
    bad = _write(tmp_path, "bad.jsonl", '{"text": "ok"}\n{not json\n')
    with pytest.raises(DataError, match=r"bad.jsonl:2: broken JSON"):
        hf_text.read_documents(bad)
    nokey = _write(tmp_path, "nokey.jsonl", '{"content": "x"}\n')
    with pytest.raises(DataError, match=r"nokey.jsonl:1: no key 'text'.*data.args.text_key"):
        hf_text.read_documents(nokey)


def test_too_little_text_and_bad_sizes(tmp_path):
    f = _write(tmp_path, "short.txt", "abc")
    with pytest.raises(ValueError, match="fewer than world_size 2"):
        hf_text.build(rank=0, world_size=2, micro_batch_size=1, seed=0, path=str(f), seq_len=4)
    with pytest.raises(ValueError, match="seq_len must be a positive integer"):
        hf_text.build(rank=0, world_size=1, micro_batch_size=1, seed=0, path=str(f), seq_len=0)


def test_tokenizer_must_be_a_local_directory(tmp_path):
    with pytest.raises(DataError, match="never downloads"):
        load_tokenizer("gpt2")


def test_local_tokenizer_directory(tmp_path):
    pytest.importorskip("transformers")
    tokenizers = pytest.importorskip("tokenizers")
    from transformers import PreTrainedTokenizerFast

    vocab = {"<eos>": 0, "[UNK]": 1, "hello": 2, "world": 3}
    tok = tokenizers.Tokenizer(tokenizers.models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = tokenizers.pre_tokenizers.Whitespace()
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<eos>", unk_token="[UNK]")
    fast.save_pretrained(tmp_path / "tok")
    f = _write(tmp_path, "t.jsonl", "\n".join(json.dumps({"text": "hello world hello"}) for _ in range(8)))
    stream = hf_text.build(
        rank=0,
        world_size=1,
        micro_batch_size=2,
        seed=0,
        path=str(f),
        seq_len=4,
        tokenizer=str(tmp_path / "tok"),
    )
    batch = next(iter(stream))
    assert batch["input_ids"].shape == (2, 4)
    # each document is "hello world hello" + eos, so the stream is the period-4 sequence 2 3 2 0.
    assert sorted(set(batch["input_ids"].flatten().tolist())) == [0, 2, 3]
    assert batch["input_ids"][0].tolist() == [2, 3, 2, 0]


def test_with_a_tokenizer_it_prepares_once_and_reads_through_data_tokens(tmp_path):
    pytest.importorskip("transformers")
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from _tiny_tokenizer import make_tokenizer
    from transformers import AutoTokenizer

    tok_dir = make_tokenizer(tmp_path / "tok")
    tok = AutoTokenizer.from_pretrained(str(tok_dir))
    texts = [f"hello world {i}" for i in range(30)]
    f = _write(tmp_path, "t.jsonl", "\n".join(json.dumps({"text": t}) for t in texts) + "\n")
    kw = dict(
        rank=0, world_size=1, micro_batch_size=2, seed=0, path=str(f), seq_len=8, tokenizer=str(tok_dir)
    )
    a = hf_text.build(**kw, cache=str(tmp_path / "cache"))
    folders = [p for p in (tmp_path / "cache").iterdir() if p.is_dir()]
    assert len(folders) == 1
    stream = np.fromfile(folders[0] / "tokens-00000.bin", dtype=np.uint16).tolist()
    want = [t for text in texts for t in tok(text)["input_ids"] + [tok.eos_token_id]]  # BOS rule + EOS
    assert stream == want
    mtime = (folders[0] / "manifest.json").stat().st_mtime_ns
    b = hf_text.build(**kw, cache=str(tmp_path / "cache"))  # the second call reuses the folder
    assert (folders[0] / "manifest.json").stat().st_mtime_ns == mtime
    x, y = next(iter(a)), next(iter(b))
    assert torch.equal(x["input_ids"], y["input_ids"])
    kept = x["labels"] != -100  # HF labels: the inputs themselves, -100 where a document starts
    assert torch.equal(x["labels"][kept], x["input_ids"][kept]) and kept.float().mean() > 0.5
