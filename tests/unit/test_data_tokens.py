"""zerolaunch.data.tokens: batches from a prepared folder; document masks in the built-in GPT and in a Hugging
Face Llama; SFT labels; disjoint ranks, seeded epochs, exact resume (also at another world size); shards.

The per-document references run each document through the model alone, reading the document index with
numpy here (not through tokens.py). Leaves out: training runs (tests/e2e/test_data_train.py), speed and
memory (bench/data_loader.py).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from _tiny_tokenizer import make_tokenizer  # noqa: E402

from zerolaunch.data.prepare import prepare_data  # noqa: E402
from zerolaunch.data.tokens import build  # noqa: E402

WORDS = "the quick brown fox jumps over lazy dog hello world tiny corpus".split()


def _texts(n, seed=0):
    rng = np.random.default_rng(seed)
    return [" ".join(rng.choice(WORDS, size=int(rng.integers(1, 12)))) for _ in range(n)]


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("tokens")
    tok = make_tokenizer(root / "tok")
    (root / "a.jsonl").write_text("".join(json.dumps({"text": t}) + "\n" for t in _texts(300)))
    prepare_data([root / "a.jsonl"], tokenizer=tok, out=root / "text", progress=False)
    prepare_data([root / "a.jsonl"], tokenizer=tok, out=root / "sharded", progress=False, shard_tokens=500)
    rows = [{"prompt": p, "completion": " " + c} for p, c in zip(_texts(60, 1), _texts(60, 2), strict=True)]
    (root / "sft.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    prepare_data(
        [root / "sft.jsonl"], tokenizer=tok, out=root / "sft", mode="prompt-completion", progress=False
    )
    return root


def _stream(path, **kw):
    args = dict(rank=0, world_size=1, micro_batch_size=4, seed=3, path=str(path), seq_len=32)
    args.update(kw)
    return build(**args)


def _take(stream, n):
    it = iter(stream)
    return [next(it) for _ in range(n)]


def _raw(folder):
    m = json.loads((folder / "manifest.json").read_text())
    tokens = np.concatenate([np.fromfile(folder / s["file"], dtype=m["dtype"]) for s in m["shards"]]).astype(
        np.int64
    )
    offsets = np.fromfile(folder / "documents.idx", dtype="<i8")
    return tokens, offsets


def _find_window(tokens, row):
    """The start of `row` (input_ids) in the token stream (rows are distinct enough at seq 32)."""
    T = row.numel()
    for s in range(0, tokens.size - T, T):
        if np.array_equal(tokens[s : s + T], row.numpy()):
            return s
    raise AssertionError("row not found in the stream")


def _doc_pieces(offsets, start, T):
    """(first, stop) global positions of each document's part of the inputs [start, start+T), and its doc end."""
    pieces = []
    for d in range(len(offsets) - 1):
        a, b = max(offsets[d], start), min(offsets[d + 1], start + T)
        if a < b:
            pieces.append((int(a), int(b), int(offsets[d + 1])))
    return pieces


def test_gpt_packed_loss_equals_the_documents_one_by_one(folders):
    from zerolaunch.models.gpt import build as gpt

    torch.manual_seed(0)
    model = gpt(size="tiny", vocab_size=300, seq_len=32).eval()
    batch = _take(_stream(folders / "text"), 1)[0]
    tokens, offsets = _raw(folders / "text")
    with torch.no_grad():
        packed = model(**batch, num_items_in_batch=torch.tensor(1.0)).loss  # the sum of token losses
        want, n_docs = 0.0, 0
        for row in batch["input_ids"]:
            start = _find_window(tokens, row)
            for a, b, end in _doc_pieces(offsets, start, 32):
                ids = torch.from_numpy(tokens[a:b])[None]
                targets = torch.from_numpy(tokens[a + 1 : b + 1]).clone()
                if b + 1 > end:  # the document's last token: its successor is another document
                    targets[-1] = -100
                if (targets != -100).any():
                    out = model(input_ids=ids, labels=targets[None])
                    want += float(out.loss) * int((targets != -100).sum())
                n_docs += 1
        assert n_docs > 2 * batch["input_ids"].shape[0]  # rows really pack several documents
        assert float(packed) == pytest.approx(want, rel=1e-5)
        # without the document mask the same rows attend across documents: a different loss
        plain = _take(_stream(folders / "text", document_mask=False), 1)[0]
        assert "position_ids" not in plain
        assert float(model(**plain, num_items_in_batch=torch.tensor(1.0)).loss) != pytest.approx(
            want, rel=1e-3
        )


def test_hf_llama_packed_loss_equals_the_documents_one_by_one(folders):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(
        vocab_size=300,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
    )
    model = LlamaForCausalLM(cfg).eval()
    model.config._attn_implementation = "sdpa"
    batch = _take(_stream(folders / "text", label_shift="model"), 1)[0]
    tokens, offsets = _raw(folders / "text")
    with torch.no_grad():
        assert batch.pop("use_cache") is False  # else transformers ignores the packed position_ids
        packed = model(**batch, num_items_in_batch=1, use_cache=False).loss
        want = 0.0
        for row in batch["input_ids"]:
            start = _find_window(tokens, row)
            for a, b, _ in _doc_pieces(offsets, start, 32):
                if b - a > 1:
                    ids = torch.from_numpy(tokens[a:b])[None]
                    want += float(model(input_ids=ids, labels=ids).loss) * (b - a - 1)
        assert float(packed) == pytest.approx(want, rel=1e-4)


def test_sft_labels_only_on_completion_tokens(folders):
    tokens, offsets = _raw(folders / "sft")
    mask = np.fromfile(folders / "sft" / "loss_mask-00000.bin", dtype=np.uint8).astype(bool)
    for shift in ("data", "model"):
        for batch in _take(_stream(folders / "sft", label_shift=shift), 5):
            for row, labels in zip(batch["input_ids"], batch["labels"], strict=True):
                start = _find_window(tokens, row)
                for t in range(32):
                    target = start + t + 1 if shift == "data" else start + t
                    same_doc = np.searchsorted(offsets, target, "right") == np.searchsorted(
                        offsets, target - 1, "right"
                    )
                    carries = mask[target] and same_doc and (shift == "data" or t > 0)
                    want = tokens[target] if carries else -100
                    if shift == "model" and t == 0:
                        continue  # nobody's target (the model shifts); its value does not matter
                    assert int(labels[t]) == want, (shift, t)


def test_ranks_disjoint_epochs_shuffled_by_seed(folders):
    tokens, _ = _raw(folders / "text")
    windows = (tokens.size - 1) // 32
    per_step = 2 * 4
    steps = windows // per_step
    seen = []
    for rank in range(2):
        for b in _take(_stream(folders / "text", rank=rank, world_size=2), steps):
            seen += [_find_window(tokens, r) for r in b["input_ids"]]
    assert len(seen) == len(set(seen)) == steps * per_step  # one epoch: no window twice, on any rank
    a = torch.cat([b["input_ids"] for b in _take(_stream(folders / "text", seed=1), 3)])
    b = torch.cat([b["input_ids"] for b in _take(_stream(folders / "text", seed=2), 3)])
    assert not torch.equal(a, b)
    s = _stream(folders / "text", micro_batch_size=1)
    first_epoch = [_find_window(tokens, b["input_ids"][0]) for b in _take(s, windows)]
    second_epoch = [_find_window(tokens, b["input_ids"][0]) for b in _take(s, windows)]
    assert sorted(first_epoch) == sorted(second_epoch) and first_epoch != second_epoch


def test_resume_same_world_size_and_another(folders):
    full = _take(_stream(folders / "text"), 6)
    s = _stream(folders / "text")
    _take(s, 2)
    state = s.state_dict()
    resumed = _stream(folders / "text")
    resumed.load_state_dict(state)
    for a, b in zip(_take(resumed, 4), full[2:], strict=True):
        assert all(torch.equal(a[k], b[k]) for k in a)
    # world size 1 x micro batch 4 -> world size 2 x micro batch 2: the same global order goes on
    ranks = []
    for rank in range(2):
        r = _stream(folders / "text", rank=rank, world_size=2, micro_batch_size=2)
        r.load_state_dict(state)
        ranks.append(_take(r, 4))
    got = torch.cat([torch.cat([ranks[0][i]["input_ids"], ranks[1][i]["input_ids"]]) for i in range(4)])
    assert torch.equal(got, torch.cat([b["input_ids"] for b in full[2:]]))


def test_windows_across_shards_match_one_shard(folders):
    assert len(json.loads((folders / "sharded" / "manifest.json").read_text())["shards"]) > 3
    for a, b in zip(
        _take(_stream(folders / "sharded"), 20), _take(_stream(folders / "text"), 20), strict=True
    ):
        assert all(torch.equal(a[k], b[k]) for k in a)


def test_errors_name_the_key(folders, tmp_path):
    with pytest.raises(ValueError, match="label_shift"):
        _stream(folders / "text", label_shift="hf")
    with pytest.raises(ValueError, match="fewer than one global micro-batch"):
        _stream(folders / "text", seq_len=4096)
    with pytest.raises(Exception, match="no manifest.json"):
        _stream(tmp_path)


def test_label_shift_must_match_the_model(folders):
    from transformers import LlamaConfig, LlamaForCausalLM

    from zerolaunch.models.gpt import build as gpt
    from zerolaunch.train.batches import TrainError
    from zerolaunch.train.loss_norm import check_label_shift

    llama = LlamaForCausalLM(
        LlamaConfig(
            vocab_size=300, hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2
        )
    )
    tiny = gpt(size="tiny", vocab_size=300, seq_len=32)
    check_label_shift(_stream(folders / "text"), tiny, "b")
    check_label_shift(_stream(folders / "text", label_shift="model"), llama, "b")
    with pytest.raises(TrainError, match="label_shift: model"):
        check_label_shift(_stream(folders / "text"), llama, "b")
    with pytest.raises(TrainError, match="label_shift: data"):
        check_label_shift(_stream(folders / "text", label_shift="model"), tiny, "b")


def test_document_index_read_in_small_blocks_gives_the_same_batches(folders, monkeypatch):
    from zerolaunch.data import tokens

    want = _take(_stream(folders / "sft"), 10)
    monkeypatch.setattr(tokens, "INDEX_BLOCK", 3)  # a window's documents span several blocks
    got = _take(_stream(folders / "sft"), 10)
    for a, b in zip(got, want, strict=True):
        assert all(torch.equal(a[k], b[k]) for k in a)
