"""`zerolaunch prepare-data`: readers of every input kind, the tokenization rules, the folder format, atomic
output, identical bytes on a re-run, and exit 2 with file and line for bad input.

References are computed here from the tokenizer directly, not through zerolaunch's encode.py. Leaves out:
training from the folder (test_data_tokens.py), speed (bench/prepare_data.py).
"""

from __future__ import annotations

import gzip
import json
import sys
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from _tiny_tokenizer import make_tokenizer  # noqa: E402

from zerolaunch.cli.app import app  # noqa: E402

TEXTS = [f"hello world number {i} the quick brown fox" * (1 + i % 3) for i in range(40)]


@pytest.fixture(scope="module")
def tok_dir(tmp_path_factory):
    return make_tokenizer(tmp_path_factory.mktemp("tok") / "tok")


@pytest.fixture(scope="module")
def tok(tok_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(tok_dir))


def _run(*args):
    result = CliRunner().invoke(app, ["prepare-data", *map(str, args), "--no-progress"])
    return result.exit_code, result.output + (result.stderr if result.stderr_bytes is not None else "")


def _partials(folder: Path, out: str) -> list[Path]:
    """The hidden partial folders of OUT `out` (each run's has its own unique name)."""
    return list(folder.glob(f".{out}.partial*"))


def _tokens(folder: Path) -> np.ndarray:
    m = json.loads((folder / "manifest.json").read_text())
    return np.concatenate([np.fromfile(folder / s["file"], dtype=m["dtype"]) for s in m["shards"]])


def _expected(tok, texts):
    out = []
    for t in texts:
        ids = tok(t)["input_ids"]  # the tokenizer's own rules: BOS in front here
        out.extend(ids + [tok.eos_token_id])
    return out


def test_every_input_kind_gives_the_same_tokens(tmp_path, tok_dir, tok):
    import datasets
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = [{"text": t, "other": 1} for t in TEXTS]
    (tmp_path / "a.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    with gzip.open(tmp_path / "a.jsonl.gz", "wt") as f:
        f.write("".join(json.dumps(r) + "\n" for r in rows))
    (tmp_path / "a.json").write_text(json.dumps(rows))
    pq.write_table(pa.table({"text": TEXTS}), tmp_path / "a.parquet", row_group_size=7)
    datasets.Dataset.from_dict({"text": TEXTS}).save_to_disk(str(tmp_path / "ds"))
    want = _expected(tok, TEXTS)
    for name in ("a.jsonl", "a.jsonl.gz", "a.json", "a.parquet", "ds"):
        code, output = _run(tmp_path / name, "--tokenizer", tok_dir, "--out", tmp_path / f"out-{name}")
        assert code == 0, output
        assert _tokens(tmp_path / f"out-{name}").tolist() == want, name
    m = json.loads((tmp_path / "out-a.jsonl" / "manifest.json").read_text())
    assert m["documents"] == len(TEXTS) and m["tokens"] == len(want) and m["dtype"] == "uint16"
    assert m["sources"][0]["bytes"] == (tmp_path / "a.jsonl").stat().st_size
    assert m["tokenizer"]["vocab_size"] == len(tok)
    offsets = np.fromfile(tmp_path / "out-a.jsonl" / "documents.idx", dtype="<i8")
    lengths = [len(tok(t)["input_ids"]) + 1 for t in TEXTS]
    assert offsets.tolist() == [0, *np.cumsum(lengths).tolist()]


def test_folder_of_text_files_is_one_document_per_file_sorted(tmp_path, tok_dir, tok):
    d = tmp_path / "corpus"
    (d / "sub").mkdir(parents=True)
    (d / "b.md").write_text("second file")
    (d / "sub" / "c.txt").write_text("third file")
    (d / "a.txt").write_text("first file")
    (d / "notes.bin").write_bytes(b"\xff")
    code, output = _run(d, "--tokenizer", tok_dir, "--out", tmp_path / "out")
    assert code == 0, output
    assert _tokens(tmp_path / "out").tolist() == _expected(tok, ["first file", "second file", "third file"])


def test_parallel_and_rerun_give_identical_bytes_and_a_killed_run_leaves_nothing_finished(tmp_path, tok_dir):
    (tmp_path / "a.jsonl").write_text("".join(json.dumps({"text": t}) + "\n" for t in TEXTS * 40))
    assert _run(tmp_path / "a.jsonl", "--tokenizer", tok_dir, "--out", tmp_path / "one")[0] == 0
    # a killed run's leftovers: the hidden partial folder, no manifest
    partial = tmp_path / ".two.partial-4242-0123abcd"
    partial.mkdir()
    (partial / "tokens-00000.bin").write_bytes(b"junk")
    code, output = _run(
        tmp_path / "a.jsonl", "--tokenizer", tok_dir, "--out", tmp_path / "two", "--num-proc", "2"
    )
    assert code == 0, output
    assert not partial.exists()
    for name in ("tokens-00000.bin", "documents.idx", "manifest.json"):
        assert (tmp_path / "one" / name).read_bytes() == (tmp_path / "two" / name).read_bytes(), name


def test_prompt_completion_masks_the_prompt(tmp_path, tok_dir, tok):
    rows = [{"prompt": f"question {i}?", "completion": f" answer {i} done"} for i in range(5)]
    (tmp_path / "sft.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    code, output = _run(
        tmp_path / "sft.jsonl",
        "--tokenizer",
        tok_dir,
        "--out",
        tmp_path / "out",
        "--mode",
        "prompt-completion",
    )
    assert code == 0, output
    tokens = _tokens(tmp_path / "out").tolist()
    mask = np.fromfile(tmp_path / "out" / "loss_mask-00000.bin", dtype=np.uint8).tolist()
    want_tokens, want_mask = [], []
    for r in rows:
        p = tok(r["prompt"])["input_ids"]
        c = tok(r["completion"], add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
        want_tokens += p + c
        want_mask += [0] * len(p) + [1] * len(c)
    assert tokens == want_tokens and mask == want_mask


def test_chat_loss_only_on_assistant_messages(tmp_path, tok_dir, tok):
    msgs = [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": "hello"},
        {"role": "assistant", "content": "world"},
        {"role": "user", "content": "again"},
        {"role": "assistant", "content": "fox"},
    ]
    (tmp_path / "chat.jsonl").write_text(json.dumps({"messages": msgs}) + "\n")
    code, output = _run(
        tmp_path / "chat.jsonl", "--tokenizer", tok_dir, "--out", tmp_path / "out", "--mode", "chat"
    )
    assert code == 0, output
    tokens = _tokens(tmp_path / "out")
    mask = np.fromfile(tmp_path / "out" / "loss_mask-00000.bin", dtype=np.uint8).astype(bool)
    # the template (tests/_tiny_tokenizer.py) wraps an assistant message as <|assistant|>CONTENT<|end|>
    assert tok.decode(tokens[mask]) == "world<|end|>fox<|end|>"
    assert tokens[-1] == tok.eos_token_id and not mask[-1]


@pytest.mark.parametrize(
    "name, content, where, what",
    [
        ("bad.jsonl", b'{"text": "ok"}\n{"text": broken\n', "bad.jsonl:2", "broken JSON"),
        ("key.jsonl", b'{"text": "ok"}\n{"body": "x"}\n', "key.jsonl:2", "no key 'text'"),
        ("enc.jsonl", b'{"text": "ok"}\n{"text": "caf\xe9"}\n', "enc.jsonl:2", "not UTF-8"),
        ("enc.txt", b"fine\nstill fine\nbad \xff here\n", "enc.txt:3", "not UTF-8"),
        ("empty.jsonl", b"", "empty.jsonl", "empty input"),
        ("arr.json", b'[{"text": "a"}, {"txt": "b"}]', "arr.json item 1", "no key 'text'"),
    ],
)
def test_bad_input_is_exit_2_with_file_and_line_and_no_output(tmp_path, tok_dir, name, content, where, what):
    (tmp_path / name).write_bytes(content)
    code, output = _run(tmp_path / name, "--tokenizer", tok_dir, "--out", tmp_path / "out")
    assert code == 2, output
    assert where in output and what in output, output
    assert "Traceback" not in output
    assert not (tmp_path / "out").exists() and not _partials(tmp_path, "out")


def test_bad_row_in_a_parallel_run_is_exit_2(tmp_path, tok_dir):
    lines = [json.dumps({"text": t}) for t in TEXTS * 30] + ['{"text": 3}']
    (tmp_path / "a.jsonl").write_text("\n".join(lines) + "\n")
    code, output = _run(
        tmp_path / "a.jsonl", "--tokenizer", tok_dir, "--out", tmp_path / "out", "--num-proc", "2"
    )
    assert code == 2 and f"a.jsonl:{len(lines)}" in output and "expected a string" in output, output
    assert not (tmp_path / "out").exists()


def test_existing_output_needs_force(tmp_path, tok_dir):
    (tmp_path / "a.txt").write_text("x")
    (tmp_path / "out").mkdir()
    code, output = _run(tmp_path / "a.txt", "--tokenizer", tok_dir, "--out", tmp_path / "out")
    assert code == 2 and "--force" in output
    code, output = _run(tmp_path / "a.txt", "--tokenizer", tok_dir, "--out", tmp_path / "out", "--force")
    assert code == 0 and (tmp_path / "out" / "manifest.json").is_file()


def test_progress_reports_rates_and_an_eta_within_a_file(tmp_path, tok_dir, capsys, monkeypatch):
    from zerolaunch.data import prepare

    (tmp_path / "a.jsonl").write_text("".join(json.dumps({"text": t}) + "\n" for t in TEXTS * 60))
    seen = []
    original = prepare._Progress.maybe

    def every_chunk(self, docs, tokens, bytes_done, final=False):
        seen.append(bytes_done)
        self.every_s = 0.0
        original(self, docs, tokens, bytes_done, final)

    monkeypatch.setattr(prepare._Progress, "maybe", every_chunk)
    prepare.prepare_data([tmp_path / "a.jsonl"], tokenizer=tok_dir, out=tmp_path / "out")
    size = (tmp_path / "a.jsonl").stat().st_size
    assert any(0 < b < size for b in seen[:-1]) and seen[-1] == size  # an ETA before the (only) file ends
    err = capsys.readouterr().err
    assert "docs/s" in err and "tokens/s" in err and "ETA" in err and "100% of input" in err


def test_a_killed_run_leaves_no_output_and_the_rerun_gives_the_same_bytes(tmp_path, tok_dir):
    import os
    import signal
    import subprocess
    import time

    (tmp_path / "a.jsonl").write_text("".join(json.dumps({"text": t}) + "\n" for t in TEXTS * 300))
    repo = Path(__file__).resolve().parents[2]
    cmd = [sys.executable, "-c", "from zerolaunch.cli.app import main; main()", "prepare-data", "a.jsonl"]
    cmd += ["--tokenizer", str(tok_dir), "--out", "out", "--num-proc", "2", "--no-progress"]
    env = dict(os.environ, PYTHONPATH=str(repo), OMP_NUM_THREADS="1")
    proc = subprocess.Popen(cmd, cwd=tmp_path, env=env, start_new_session=True)
    try:
        deadline = time.monotonic() + 60
        while not any((p / "documents.idx").exists() for p in _partials(tmp_path, "out")):
            assert proc.poll() is None and time.monotonic() < deadline, (
                "prepare-data ended before it was killed"
            )
            time.sleep(0.05)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)  # the run and its tokenizer processes, mid-write
        proc.wait(timeout=30)
    assert not (tmp_path / "out").exists()
    assert _run(tmp_path / "a.jsonl", "--tokenizer", tok_dir, "--out", tmp_path / "out")[0] == 0
    assert _run(tmp_path / "a.jsonl", "--tokenizer", tok_dir, "--out", tmp_path / "clean")[0] == 0
    assert not _partials(tmp_path, "out")
    for name in ("tokens-00000.bin", "documents.idx", "manifest.json"):
        assert (tmp_path / "out" / name).read_bytes() == (tmp_path / "clean" / name).read_bytes(), name


def test_the_folder_and_its_name_are_fsynced_with_the_shared_helper(tmp_path, tok_dir, monkeypatch):
    """The finished folder is fsynced before its rename and OUT's parent after it, through util/atomic.py's
    fsync_path, the one fsync helper (its crash-safety tests cover this path too)."""
    from zerolaunch.data import prepare
    from zerolaunch.util.atomic import fsync_path

    synced = []
    monkeypatch.setattr(prepare, "fsync_path", lambda p: (synced.append(Path(p)), fsync_path(p))[1])
    (tmp_path / "a.jsonl").write_text("".join(json.dumps({"text": t}) + "\n" for t in TEXTS))
    assert _run(tmp_path / "a.jsonl", "--tokenizer", tok_dir, "--out", tmp_path / "out")[0] == 0
    assert [p.name.startswith(".out.partial") for p in synced] == [True, False]
    assert synced[1] == tmp_path
