"""prepare-data inputs that used to end in a traceback are one paragraph, exit 2, with file and line (or row):
a lone surrogate from a JSON escape, JSON nested past the recursion limit, a damaged parquet page; and a
document longer than --max-document-bytes is refused by name before the tokenizer sees it (a 50 MB line
used to take 11 GB of memory).

Leaves out: the well-formed inputs (test_prepare_data.py) and OUT (test_prepare_data_out.py).
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from _tiny_tokenizer import make_tokenizer  # noqa: E402

from zerolaunch.cli.app import app  # noqa: E402

DEEP = 200_000


@pytest.fixture(scope="module")
def tok_dir(tmp_path_factory):
    return make_tokenizer(tmp_path_factory.mktemp("tok") / "tok")


def _run(*args):
    result = CliRunner().invoke(app, ["prepare-data", *map(str, args), "--no-progress"])
    return result.exit_code, result.output + (result.stderr if result.stderr_bytes is not None else "")


def _refused(code: int, output: str, *expected: str) -> None:
    assert code == 2, output
    assert "Traceback" not in output and not re.search(r"\b[A-Z]\w*(Error|Exception)\b", output), output
    flat = " ".join(output.split())
    for part in expected:
        assert part in flat, output


def _damaged_parquet(path: Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(
        pa.table({"text": [f"hello {i} " * 20 for i in range(3000)]}),
        path,
        row_group_size=500,
        compression="snappy",
    )
    raw = bytearray(path.read_bytes())
    middle = len(raw) // 2  # inside a data page of a later row group; the footer stays readable
    raw[middle : middle + 200] = bytes(b ^ 0x5A for b in raw[middle : middle + 200])
    path.write_bytes(bytes(raw))


@pytest.mark.parametrize(
    "name, content, mode, expected",
    [
        (
            "s.jsonl",
            '{"text": "ok"}\n{"text": "bad \\ud800 here"}\n',
            "text",
            ["s.jsonl:2", "lone surrogate"],
        ),
        ("s.json", '[{"text": "ok"}, {"text": "\\udfff"}]', "text", ["s.json item 1", "lone surrogate"]),
        (
            "c.jsonl",
            json.dumps(
                {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "x"}]}
            ).replace('"x"', '"\\ud83d"')
            + "\n",
            "chat",
            ["c.jsonl:1", "messages[1].content", "lone surrogate"],
        ),
        (
            "d.jsonl",
            '{"text": "ok"}\n' + "[" * DEEP + "]" * DEEP + "\n",
            "text",
            ["d.jsonl:2", "nested too deeply"],
        ),
        ("d.json", '[{"text": ' + "[" * DEEP + "]" * DEEP + "}]", "text", ["d.json", "nested too deeply"]),
        (
            "m.jsonl",
            json.dumps({"messages": [{"role": "user", "content": "a"}, "x"]}).replace(
                '"x"', "[" * 900 + "]" * 900
            )
            + "\n",
            "chat",
            ["m.jsonl:1", "messages[1] must be"],
        ),
    ],
    ids=["surrogate-jsonl", "surrogate-json", "surrogate-chat", "deep-jsonl", "deep-json", "deep-message"],
)
def test_bad_json_is_one_paragraph_with_file_and_line(tmp_path, tok_dir, name, content, mode, expected):
    (tmp_path / name).write_text(content)
    code, output = _run(tmp_path / name, "--tokenizer", tok_dir, "--out", tmp_path / "out", "--mode", mode)
    _refused(code, output, *expected)
    assert not (tmp_path / "out").exists()


def test_a_damaged_parquet_page_is_one_paragraph_with_file_and_row(tmp_path, tok_dir):
    _damaged_parquet(tmp_path / "d.parquet")
    code, output = _run(tmp_path / "d.parquet", "--tokenizer", tok_dir, "--out", tmp_path / "out")
    _refused(code, output, f"{tmp_path / 'd.parquet'} row ", "damaged")
    assert not (tmp_path / "out").exists()


def test_a_document_over_the_limit_is_refused_by_name_and_the_limit_can_be_raised(tmp_path, tok_dir):
    long_text = "the quick brown fox " * 400  # 8,000 bytes
    (tmp_path / "a.jsonl").write_text(
        json.dumps({"text": "short"}) + "\n" + json.dumps({"text": long_text}) + "\n"
    )
    (tmp_path / "b.txt").write_text(long_text)
    (tmp_path / "c.jsonl").write_text(
        json.dumps({"prompt": "q", "completion": "é" * 3000}) + "\n"
    )  # 6,001 bytes
    for name, mode in (("a.jsonl", "text"), ("b.txt", "text"), ("c.jsonl", "prompt-completion")):
        code, output = _run(
            tmp_path / name,
            "--tokenizer",
            tok_dir,
            "--out",
            tmp_path / "o",
            "--mode",
            mode,
            "--max-document-bytes",
            "5kB",
        )
        where = (
            f"{tmp_path / name}:{2 if name == 'a.jsonl' else 1}"
            if name.endswith("jsonl")
            else f"{tmp_path / name}"
        )
        _refused(code, output, where, "--max-document-bytes 4.88 KiB", "Split it")
        assert not (tmp_path / "o").exists()
    code, output = _run(
        tmp_path / "a.jsonl", "--tokenizer", tok_dir, "--out", tmp_path / "o", "--max-document-bytes", "8kB"
    )
    assert code == 0, output
    code, output = _run(
        tmp_path / "b.txt", "--tokenizer", tok_dir, "--out", tmp_path / "p", "--max-document-bytes", "none"
    )
    assert code == 0, output
    code, output = _run(
        tmp_path / "b.txt", "--tokenizer", tok_dir, "--out", tmp_path / "q", "--max-document-bytes", "5XB"
    )
    _refused(code, output, "--max-document-bytes", "5XB")
