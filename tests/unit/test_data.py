"""The built-in datasets (zerolaunch/data/synthetic.py, text.py) and their resumable stream.

Covers: batch shapes and shifted labels; determinism per (seed, rank); different ranks get different data;
resume by state_dict / skip gives exactly the batches an uninterrupted stream would; the synthetic chain is
learnable (entropy far below log V, successors follow the table); text windows are disjoint across ranks
and cover the file; missing / too-short files are clear errors. Leaves out: training on them (e2e tests).
"""

import itertools
import math

import pytest
import torch

from zerolaunch.data import synthetic, text


def _take(stream, n):
    return list(itertools.islice(iter(stream), n))


def _same(a, b):
    return all(
        torch.equal(x["input_ids"], y["input_ids"]) and torch.equal(x["labels"], y["labels"])
        for x, y in zip(a, b, strict=True)
    )


def test_synthetic_shapes_labels_shifted_and_deterministic():
    kw = dict(rank=0, world_size=2, micro_batch_size=3, seed=7, vocab_size=50, seq_len=10)
    a, b = _take(synthetic.build(**kw), 4), _take(synthetic.build(**kw), 4)
    assert a[0]["input_ids"].shape == (3, 10) and a[0]["input_ids"].dtype == torch.long
    assert torch.equal(a[0]["input_ids"][:, 1:], a[0]["labels"][:, :-1])
    assert _same(a, b)
    assert not torch.equal(a[0]["input_ids"], a[1]["input_ids"])


def test_synthetic_ranks_and_seeds_differ():
    base = dict(world_size=2, micro_batch_size=4, vocab_size=50, seq_len=10)
    r0 = _take(synthetic.build(rank=0, seed=1, **base), 1)[0]["input_ids"]
    r1 = _take(synthetic.build(rank=1, seed=1, **base), 1)[0]["input_ids"]
    s2 = _take(synthetic.build(rank=0, seed=2, **base), 1)[0]["input_ids"]
    assert not torch.equal(r0, r1) and not torch.equal(r0, s2)


def test_synthetic_follows_one_chain_on_every_rank_with_low_entropy():
    chain = synthetic.MarkovChain(vocab_size=64, branching=4, seed=3)
    assert chain.entropy_nats() < 0.5 * math.log(64)
    for rank in (0, 1):
        batch = _take(
            synthetic.build(rank=rank, world_size=2, micro_batch_size=2, seed=3, vocab_size=64, seq_len=20), 1
        )[0]
        x, y = batch["input_ids"].reshape(-1), batch["labels"].reshape(-1)
        assert all(int(t) in chain.successors[int(s)].tolist() for s, t in zip(x, y, strict=True))


@pytest.mark.parametrize("how", ["state_dict", "skip"])
def test_synthetic_resume_continues_exactly(how):
    kw = dict(rank=1, world_size=2, micro_batch_size=2, seed=5, vocab_size=30, seq_len=8)
    full = _take(synthetic.build(**kw), 7)
    first = synthetic.build(**kw)
    _take(first, 4)
    resumed = synthetic.build(**kw)
    if how == "state_dict":
        resumed.load_state_dict(first.state_dict())
    else:
        resumed.skip(4)
    assert _same(_take(resumed, 3), full[4:])


def test_stream_rejects_bad_state():
    stream = synthetic.build(rank=0, world_size=1, micro_batch_size=1, seed=0)
    with pytest.raises(ValueError, match="position"):
        stream.load_state_dict({"position": -1})


def test_synthetic_bad_arguments_are_clear():
    with pytest.raises(ValueError, match="seq_len"):
        synthetic.build(rank=0, world_size=1, micro_batch_size=1, seed=0, seq_len=0)
    with pytest.raises(ValueError, match="rank 2"):
        synthetic.build(rank=2, world_size=2, micro_batch_size=1, seed=0)


def _write(tmp_path, n_bytes):
    path = tmp_path / "input.txt"
    path.write_bytes(bytes((i * 7 + 3) % 256 for i in range(n_bytes)))
    return path


def test_text_windows_disjoint_across_ranks_and_cover_the_file(tmp_path):
    seq_len, world = 5, 3
    path = _write(tmp_path, 3 * 4 * seq_len + 1)  # 12 windows, 4 per rank
    data = torch.tensor(list(path.read_bytes()))
    starts = []
    for rank in range(world):
        stream = text.build(
            rank=rank, world_size=world, micro_batch_size=2, seed=0, path=str(path), seq_len=seq_len
        )
        for batch in _take(stream, 2):  # one epoch of this rank
            for row_x, row_y in zip(batch["input_ids"], batch["labels"], strict=True):
                start = next(
                    s
                    for s in range(0, data.numel() - seq_len, seq_len)
                    if torch.equal(data[s : s + seq_len], row_x)
                )
                assert torch.equal(data[start + 1 : start + seq_len + 1], row_y)
                starts.append(start)
    assert sorted(starts) == list(range(0, 12 * seq_len, seq_len))  # every window once, no rank overlaps


def test_text_is_deterministic_resumable_and_reshuffles_per_epoch(tmp_path):
    path = _write(tmp_path, 2 * 20 * 4 + 1)  # 40 windows of 4, 20 per rank
    kw = dict(rank=0, world_size=2, micro_batch_size=5, seed=9, path=str(path), seq_len=4)
    full = _take(text.build(**kw), 8)  # two epochs
    assert _same(full, _take(text.build(**kw), 8))
    resumed = text.build(**kw)
    resumed.skip(5)
    assert _same(_take(resumed, 3), full[5:])
    epoch0 = torch.cat([b["input_ids"] for b in full[:4]])
    epoch1 = torch.cat([b["input_ids"] for b in full[4:]])
    assert not torch.equal(epoch0, epoch1)
    assert sorted(map(tuple, epoch0.tolist())) == sorted(map(tuple, epoch1.tolist()))


def test_text_missing_or_short_file_is_a_clear_error(tmp_path):
    with pytest.raises(FileNotFoundError, match="data.args.path"):
        text.build(rank=0, world_size=1, micro_batch_size=1, seed=0, path=str(tmp_path / "nope.txt"))
    short = _write(tmp_path, 10)
    with pytest.raises(ValueError, match="need at least 17"):
        text.build(rank=0, world_size=2, micro_batch_size=1, seed=0, path=str(short), seq_len=8)
