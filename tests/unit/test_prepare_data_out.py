"""prepare-data's OUT: never an input (nor holding or inside one, the tokenizer folder included), `--force`
replaces only a folder an earlier prepare-data wrote, two runs into one OUT cannot mix or replace each other
(unique partial names, a lock on OUT: tested with two real processes), and a full or read-only disk is one
paragraph with nothing left behind.

Every refusal is checked to leave every file where it was. Leaves out: the input formats and the token
bytes (test_prepare_data.py).
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from _helpers import tmpfs  # noqa: E402
from _tiny_tokenizer import make_tokenizer  # noqa: E402

from zerolaunch.cli.app import app  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
TEXTS = [f"hello world number {i} the quick brown fox" for i in range(30)]


@pytest.fixture(scope="module")
def tok_dir(tmp_path_factory):
    return make_tokenizer(tmp_path_factory.mktemp("tok") / "tok")


def _run(*args):
    result = CliRunner().invoke(app, ["prepare-data", *map(str, args), "--no-progress"])
    return result.exit_code, result.output + (result.stderr if result.stderr_bytes is not None else "")


def _tree(folder: Path) -> dict[str, str]:
    """Every file under `folder` (hidden ones too) with a hash of its bytes."""
    return {
        str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(folder.rglob("*"))
        if p.is_file()
    }


def _jsonl(path: Path, texts=TEXTS) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))
    return path


def _one_paragraph(code: int, output: str) -> None:
    assert code == 2, output
    assert "Traceback" not in output and not re.search(r"\b[A-Z]\w*(Error|Exception)\b", output), output


@pytest.mark.parametrize(
    "inputs, out, named",
    [
        (["corpusA"], "corpusA", "corpusA"),  # OUT is the input folder
        (["data/raw"], "data", "data/raw"),  # OUT holds the input folder (and an unrelated notes.md)
        (["data/raw/a.jsonl"], "data/raw", "data/raw/a.jsonl"),  # OUT holds the input file
        (["corpusA"], "corpusA/tokens", "corpusA"),  # OUT lies inside the input
        (["corpusA/a.jsonl"], "corpusA/a.jsonl", "corpusA/a.jsonl"),  # OUT is the input file
    ],
)
def test_out_that_is_holds_or_lies_inside_an_input_is_refused_and_deletes_nothing(
    tmp_path, tok_dir, inputs, out, named
):
    _jsonl(tmp_path / "corpusA" / "a.jsonl")
    _jsonl(tmp_path / "data" / "raw" / "a.jsonl")
    (tmp_path / "data" / "notes.md").write_text("my notes")
    before = _tree(tmp_path)
    code, output = _run(
        *(tmp_path / i for i in inputs), "--tokenizer", tok_dir, "--out", tmp_path / out, "--force"
    )
    _one_paragraph(code, output)
    flat = " ".join(output.split())
    assert f"--out {tmp_path / out} " in flat and str(tmp_path / named) in flat, output
    assert _tree(tmp_path) == before


def test_out_that_is_holds_or_lies_inside_the_tokenizer_folder_is_refused(tmp_path, tok_dir):
    import shutil

    tok = tmp_path / "models" / "tok"
    shutil.copytree(tok_dir, tok)
    data = _jsonl(tmp_path / "a.jsonl")
    before = _tree(tmp_path)
    for out in (tok, tok.parent, tok / "data"):
        code, output = _run(data, "--tokenizer", tok, "--out", out, "--force")
        _one_paragraph(code, output)
        assert "tokenizer folder" in output and str(tok) in " ".join(output.split()), output
    assert _tree(tmp_path) == before


def test_force_replaces_only_a_folder_prepare_data_wrote(tmp_path, tok_dir):
    data = _jsonl(tmp_path / "a.jsonl")
    out = tmp_path / "out"
    # a folder of the user's: refused with its names, whatever --force says
    out.mkdir()
    (out / "notes.md").write_text("mine")
    (out / "sub").mkdir()
    before = _tree(tmp_path)
    for force in ([], ["--force"]):
        code, output = _run(data, "--tokenizer", tok_dir, "--out", out, *force)
        _one_paragraph(code, output)
        assert "notes.md" in output and "sub/" in output, output
    assert _tree(tmp_path) == before and (out / "sub").is_dir()
    # a prepared folder is replaced with --force, refused without
    (out / "notes.md").unlink()
    (out / "sub").rmdir()
    assert _run(data, "--tokenizer", tok_dir, "--out", out, "--force")[0] == 0
    code, output = _run(data, "--tokenizer", tok_dir, "--out", out)
    _one_paragraph(code, output)
    assert "--force" in output
    # ... unless the user put something of theirs into it
    (out / "notes.md").write_text("mine too")
    before = _tree(tmp_path)
    code, output = _run(data, "--tokenizer", tok_dir, "--out", out, "--force")
    _one_paragraph(code, output)
    assert "notes.md" in output and _tree(tmp_path) == before
    # ... or its manifest is not prepare-data's
    (out / "notes.md").unlink()
    (out / "manifest.json").write_text('{"format": "something-else"}')
    code, output = _run(data, "--tokenizer", tok_dir, "--out", out, "--force")
    _one_paragraph(code, output)
    assert "manifest.json" in output


def test_out_that_is_a_file_is_refused_with_force_and_left_as_it_was(tmp_path, tok_dir):
    data = _jsonl(tmp_path / "a.jsonl")
    (tmp_path / "outfile").write_text("important")
    code, output = _run(data, "--tokenizer", tok_dir, "--out", tmp_path / "outfile", "--force")
    _one_paragraph(code, output)
    assert "is a file" in output
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.jsonl", "outfile"]
    assert (tmp_path / "outfile").read_text() == "important"
    code, output = _run(data, "--tokenizer", tok_dir, "--out", tmp_path / "outfile" / "sub")
    _one_paragraph(code, output)
    assert str(tmp_path / "outfile") in output


def test_leftovers_of_killed_runs_are_removed_but_other_outs_partials_are_not(tmp_path, tok_dir):
    data = _jsonl(tmp_path / "a.jsonl")
    mine = [
        tmp_path / ".out.partial",
        tmp_path / ".out.partial-123-0123abcd",
        tmp_path / ".out.old-9-deadbeef",
    ]
    others = [tmp_path / ".out.partial.partial-1-0123abcd", tmp_path / ".out2.partial-1-0123abcd"]
    for folder in mine + others:
        folder.mkdir()
        (folder / "tokens-00000.bin").write_bytes(b"junk")
    assert _run(data, "--tokenizer", tok_dir, "--out", tmp_path / "out")[0] == 0
    assert [p.exists() for p in mine + others] == [False] * len(mine) + [True] * len(others)


def _start(tmp_path: Path, tok_dir: Path, data: str, out: str, *extra: str) -> subprocess.Popen:
    cmd = [sys.executable, "-c", "from zerolaunch.cli.app import main; main()", "prepare-data", data]
    cmd += ["--tokenizer", str(tok_dir), "--out", out, "--no-progress", *extra]
    env = dict(os.environ, PYTHONPATH=str(REPO), OMP_NUM_THREADS="1")
    return subprocess.Popen(
        cmd,
        cwd=tmp_path,
        env=env,
        start_new_session=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _open_writer(fifo: Path, proc: subprocess.Popen, timeout_s: float = 120) -> int:
    """The write end of `fifo`, once `proc` has opened it for reading (it then holds OUT's lock)."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            return os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)
        except OSError as err:  # ENXIO: no reader yet
            if err.errno != errno.ENXIO:
                raise
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
        time.sleep(0.05)


def test_a_second_run_into_the_same_out_is_refused_naming_the_first_and_they_never_mix(tmp_path, tok_dir):
    lines = "".join(json.dumps({"text": t}) + "\n" for t in TEXTS * 20).encode()
    (tmp_path / "whole.jsonl").write_bytes(lines)
    _jsonl(tmp_path / "small.jsonl")
    assert _run(tmp_path / "small.jsonl", "--tokenizer", tok_dir, "--out", tmp_path / "out")[0] == 0
    # the first run reads a pipe: it holds OUT's lock, mid-read, for as long as the test keeps the pipe open
    os.mkfifo(tmp_path / "pipe.jsonl")
    first = _start(tmp_path, tok_dir, "pipe.jsonl", "out", "--force")
    writer = None
    try:
        writer = _open_writer(tmp_path / "pipe.jsonl", first)
        os.write(writer, lines[: len(lines) // 2])
        partials = list(tmp_path.glob(".out.partial-*"))
        assert len(partials) == 1
        partial_before = _tree(partials[0])
        second = _start(tmp_path, tok_dir, "small.jsonl", "out", "--force")
        stdout, stderr = second.communicate(timeout=120)
        _one_paragraph(second.returncode, stdout + stderr)
        assert f"pid {first.pid}" in " ".join(stderr.split()) and "another prepare-data" in stderr, stderr
        # the refused run touched neither the first run's partial nor the finished OUT
        assert list(tmp_path.glob(".out.partial-*")) == partials and _tree(partials[0]) == partial_before
        assert json.loads((tmp_path / "out" / "manifest.json").read_text())["documents"] == len(TEXTS)
        os.set_blocking(writer, True)
        os.write(writer, lines[len(lines) // 2 :])
    finally:
        if writer is not None:
            os.close(writer)
        if first.poll() is None and writer is None:
            os.killpg(first.pid, signal.SIGKILL)
    stdout, stderr = first.communicate(timeout=300)
    assert first.returncode == 0, stderr
    # the first run's result alone: the tokens of a lone run over the same lines
    assert _run(tmp_path / "whole.jsonl", "--tokenizer", tok_dir, "--out", tmp_path / "alone")[0] == 0
    for name in ("tokens-00000.bin", "documents.idx"):
        assert (tmp_path / "out" / name).read_bytes() == (tmp_path / "alone" / name).read_bytes(), name
    assert not list(tmp_path.glob(".out.partial*")) and not list(tmp_path.glob(".out.old*"))


@pytest.fixture
def small_disk(tmp_path):
    """A 1 MiB tmpfs, or (folder, False) where mounting is not allowed."""
    disk = tmp_path / "disk"
    disk.mkdir()
    with tmpfs(disk, "1m") as real:
        yield disk, real


def test_a_full_disk_is_one_paragraph_and_leaves_nothing(small_disk, tmp_path, tok_dir, monkeypatch):
    disk, real = small_disk
    data = _jsonl(tmp_path / "big.jsonl", TEXTS * 400)  # about 0.6 MB of tokens
    if real:
        stat = os.statvfs(disk)
        with open(disk / "filler", "wb") as f:
            f.write(b"\0" * max(0, stat.f_bavail * stat.f_frsize - (64 << 10)))
    else:

        def no_space(self, *args):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(self.folder / "tokens-00000.bin"))

        monkeypatch.setattr("zerolaunch.data.prepare._Shards.write", no_space)
    code, output = _run(data, "--tokenizer", tok_dir, "--out", disk / "out")
    _one_paragraph(code, output)
    flat = " ".join(output.split())
    assert f"cannot write the prepared data {disk / 'out'}: no space left on the device" in flat, output
    assert "Errno" not in output
    assert sorted(p.name for p in disk.iterdir() if p.name not in ("filler", ".out.lock")) == []


def test_a_read_only_disk_is_one_paragraph(tmp_path, tok_dir, monkeypatch):
    data = _jsonl(tmp_path / "a.jsonl")
    disk = tmp_path / "ro"
    disk.mkdir()
    mounted = (
        subprocess.run(["mount", "-t", "tmpfs", "-o", "ro,size=1m", "tmpfs", str(disk)], capture_output=True)
        if os.geteuid() == 0
        else None
    )
    if mounted is None or mounted.returncode != 0:

        def read_only(self):
            raise OSError(errno.EROFS, os.strerror(errno.EROFS), str(self.path))

        monkeypatch.setattr("zerolaunch.data.out_folder.FileLock.acquire", read_only)
    try:
        code, output = _run(data, "--tokenizer", tok_dir, "--out", disk / "out")
    finally:
        if mounted is not None and mounted.returncode == 0:
            subprocess.run(["umount", "-l", str(disk)], capture_output=True)
    _one_paragraph(code, output)
    assert f"{disk / 'out'}: the filesystem is read-only" in " ".join(output.split()), output
