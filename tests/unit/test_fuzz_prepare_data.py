"""Fuzz: 300 mutated prepare-data inputs and option sets end in exit 0 or exit 2 with one paragraph, each
within 5 s.

Each case runs the real command in-process (`zerolaunch prepare-data` through typer's CliRunner): exit 0 must
leave a folder with a manifest, exit 2 one paragraph naming no Python exception class and holding no
traceback, and no case may leave a partial folder behind. The inputs are jsonl (text, prompt-completion and
chat rows), JSON arrays, .txt, .jsonl.gz and parquet files, mutated as a user's files go wrong: flipped,
cut or inserted bytes, wrong field types, missing keys, nesting thousands deep, lone surrogates, documents over
--max-document-bytes, contents under the wrong extension; the options vary the mode, the text key, the
limit, --num-proc, --force and an OUT that already exists, is a file, or overlaps the input. Seeded, so every
run tries the same cases; the counts and the slowest case are printed.

Leaves out: a value typer itself parses and refuses (`--num-proc x`: typer's usage box), the exact token bytes (test_prepare_data.py) and two runs at once (test_prepare_data_out.py).
"""

from __future__ import annotations

import gzip
import io
import json
import random
import re
import shutil
import sys
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from _mutate import overwrite_bytes  # noqa: E402
from _tiny_tokenizer import make_tokenizer  # noqa: E402

from zerolaunch.cli.app import app  # noqa: E402

SEED = 20261206
CASES = 300
CASE_SECONDS = 5.0
RAW_CLASS = re.compile(r"\b[A-Z]\w*(Error|Exception)\b|Traceback|Errno")
WORDS = [
    "the",
    "quick",
    "brown",
    "fox",
    "héllo",
    "wörld",
    "日本",
    "🙂",
    "a\u0301",
    "\u202e",
    "\t",
    "\\n",
    '"',
]


def _text(rng: random.Random) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(rng.randint(0, 40)))


def _row(rng: random.Random, mode: str) -> dict:
    if mode == "prompt-completion":
        return {"prompt": _text(rng), "completion": _text(rng)}
    if mode == "chat":
        roles = ["system", "user", "assistant", "user", "assistant"][: rng.randint(1, 5)]
        return {"messages": [{"role": r, "content": _text(rng)} for r in roles]}
    return {"text": _text(rng), "id": rng.randint(0, 10**6)}


def _odd_value(rng: random.Random):
    return rng.choice(
        [None, 3, 2.5, True, [], ["x"], {}, {"a": 1}, "", "\ud800", "x" * rng.randint(1, 3000), "\x00"]
    )


def _mutate_row(rng: random.Random, row: dict) -> dict:
    row = json.loads(json.dumps(row))
    key = rng.choice(sorted(row))
    how = rng.choice(["value", "drop", "rename", "messages"])
    if how == "value":
        row[key] = _odd_value(rng)
    elif how == "drop":
        row.pop(key)
    elif how == "rename":
        row[key + "_"] = row.pop(key)
    elif "messages" in row and row["messages"]:
        i = rng.randrange(len(row["messages"]))
        row["messages"][i] = rng.choice(
            [_odd_value(rng), {"role": "assistant"}, {"role": 1, "content": "x"}, {"content": "x"}]
        )
    return row


def _nested(rng: random.Random) -> str:
    depth = rng.choice([50, 900, 1100, 5000, 200_000])
    inner = rng.choice(['"x"', "1", "{}"])
    if rng.random() < 0.5:
        return "[" * depth + inner + "]" * depth
    return '{"a": ' * depth + inner + "}" * depth


def _flip(rng: random.Random, raw: bytes) -> bytes:
    return overwrite_bytes(rng, raw, 20)


def _parquet(rows: list[dict], rng: random.Random) -> bytes:
    import pyarrow as pa
    import pyarrow.parquet as pq

    columns: dict = {}
    for r in rows:
        for k in r:
            columns.setdefault(k, [])
    for r in rows:
        for k in columns:
            columns[k].append(r.get(k))
    if rng.random() < 0.2 and "text" in columns:  # a column of another type
        columns["text"] = [rng.choice([None, 1, 2]) for _ in rows]
    try:
        table = pa.table(columns)
    except (pa.ArrowInvalid, pa.ArrowTypeError):  # mixed types in a column: store the JSON strings
        table = pa.table({k: [json.dumps(v) for v in vs] for k, vs in columns.items()})
    out = io.BytesIO()
    pq.write_table(table, out, row_group_size=rng.choice([3, 50]))
    return out.getvalue()


def make_case(rng: random.Random, folder: Path) -> tuple[str, list[str]]:
    """(the kind of mutation, the CLI arguments) of one case, its files written under `folder`."""
    mode = rng.choice(["text", "text", "prompt-completion", "chat"])
    kind_of_file = rng.choice(["jsonl", "jsonl", "json", "txt", "gz", "parquet"])
    rows = [_row(rng, mode) for _ in range(rng.randint(0, 30))]
    kind = rng.choice(["clean", "row", "bytes", "cut", "junk", "nested", "long", "swap", "options", "out"])
    if kind == "row" and rows:
        i = rng.randrange(len(rows))
        rows[i] = _mutate_row(rng, rows[i])
    if kind_of_file == "txt":
        raw = "\n".join(r.get("text", "") or "" for r in rows if isinstance(r.get("text", ""), str)).encode(
            "utf-8", "surrogatepass"
        )
    elif kind_of_file == "json":
        raw = json.dumps(rows).encode("utf-8", "surrogatepass")
    elif kind_of_file == "parquet":
        raw = _parquet(rows, rng)
    else:
        raw = "".join(json.dumps(r) + "\n" for r in rows).encode("utf-8", "surrogatepass")
    if kind == "nested":
        line = _nested(rng).encode()
        raw = raw + line + b"\n" if kind_of_file != "json" else b"[" + line + b"]"
    elif kind == "bytes":
        raw = _flip(rng, raw)
    elif kind == "cut" and raw:
        raw = raw[: rng.randrange(len(raw))]
    elif kind == "junk":
        at = rng.randint(0, len(raw))
        raw = raw[:at] + bytes(rng.randrange(256) for _ in range(rng.randint(1, 64))) + raw[at:]
    elif kind == "long":
        long_row = {"text": "word " * rng.randint(500, 5000)}
        raw += (json.dumps(long_row) + "\n").encode() if kind_of_file not in ("json", "parquet") else b""
    if kind_of_file == "gz":
        raw = gzip.compress(raw)
        if rng.random() < 0.3:
            raw = _flip(rng, raw) if rng.random() < 0.5 else raw[: rng.randrange(max(len(raw), 1))]
    suffix = {"jsonl": ".jsonl", "json": ".json", "txt": ".txt", "gz": ".jsonl.gz", "parquet": ".parquet"}
    name = f"in{suffix[kind_of_file]}"
    if kind == "swap":  # the contents of one kind under another kind's name
        name = "in" + rng.choice([s for s in suffix.values() if s != suffix[kind_of_file]])
    data = folder / name
    data.write_bytes(raw)
    out = folder / "out"
    args = [str(data), "--out", str(out), "--mode", mode]
    if kind == "long" or rng.random() < 0.1:
        args += [
            "--max-document-bytes",
            rng.choice(["2kB", "1MiB", "none", "0", "-5", "1.5KB", "lots", "1e3B"]),
        ]
    if kind == "options":
        args += rng.choice(
            [
                ["--mode", rng.choice(["text", "chat", "Chat", "completion", ""])],
                ["--text-key", rng.choice(["id", "missing", "", "text "])],
                ["--num-proc", rng.choice(["2", "0", "-1"])],
                ["--tokenizer", str(folder / "no-such-tokenizer")],
                ["--tokenizer", str(data)],
            ]
        )
    if kind == "out":
        where = rng.choice(["prepared", "file", "user-folder", "inside-input", "is-input", "empty"])
        if where == "prepared":
            shutil.copytree(folder.parent / "prepared", out)
        elif where == "file":
            out.write_text("a file")
        elif where == "user-folder":
            out.mkdir()
            (out / "notes.md").write_text("mine")
        elif where == "empty":
            out.mkdir()
        elif where == "inside-input":
            args[2] = str(folder)
            args[0] = str(folder)
        else:
            args[2] = str(data)
        if rng.random() < 0.7:
            args.append("--force")
    return kind, args


def test_fuzz_prepare_data(tmp_path, capsys):
    tok = make_tokenizer(tmp_path / "tok")
    rng = random.Random(SEED)
    runner = CliRunner()
    prepared = tmp_path / "prepared"
    (tmp_path / "warm.jsonl").write_text('{"text": "warm"}\n')
    # untimed: the first run pays one-off imports (seconds on a busy machine)
    warm = runner.invoke(
        app,
        [
            "prepare-data",
            str(tmp_path / "warm.jsonl"),
            "--tokenizer",
            str(tok),
            "--out",
            str(prepared),
            "--no-progress",
        ],
    )
    assert warm.exit_code == 0, warm.output
    counts = {"exit 0": 0, "exit 2": 0, "max_s": 0.0, "slowest": "", "kinds": {}}
    for case in range(CASES):
        folder = tmp_path / f"case{case}"
        folder.mkdir()
        kind, args = make_case(rng, folder)
        name = f"case {case} ({kind}: {' '.join(Path(a).name if '/' in a else a for a in args)})"
        if "--tokenizer" not in args:
            args += ["--tokenizer", str(tok)]
        start = time.perf_counter()
        result = runner.invoke(app, ["prepare-data", *args, "--no-progress"])
        seconds = time.perf_counter() - start
        output = result.output  # click 8.2+ mixes stderr in; older ones keep it apart
        if result.stderr_bytes is not None and result.stderr not in output:
            output += result.stderr
        if result.exception is not None and not isinstance(result.exception, SystemExit):
            pytest.fail(f"{name}: {type(result.exception).__name__}: {result.exception}")
        assert seconds < CASE_SECONDS, f"{name} took {seconds:.1f} s"
        assert result.exit_code in (0, 2), f"{name}: exit {result.exit_code}\n{output}"
        if result.exit_code == 2:
            message = output.strip()
            assert message.startswith("error: "), f"{name}: {output}"
            assert "\n\n" not in message and message.count("\n") == 0, f"{name}: not one paragraph:\n{output}"
            raw = RAW_CLASS.search(message)
            assert raw is None, f"{name}: the message names {raw.group(0)}:\n{output}"
        else:
            out = Path(args[args.index("--out") + 1])
            assert (out / "manifest.json").is_file(), name
        assert not list(folder.glob(".*.partial*")), f"{name}: a partial folder was left behind"
        counts[f"exit {result.exit_code}"] += 1
        counts["kinds"].setdefault(kind, [0, 0])[result.exit_code == 2] += 1
        if seconds > counts["max_s"]:
            counts["max_s"], counts["slowest"] = seconds, name
        shutil.rmtree(folder)
    with capsys.disabled():
        print(
            f"\nfuzz prepare-data: exit 0 {counts['exit 0']}, exit 2 {counts['exit 2']}, slowest "
            f"{counts['max_s']:.2f} s ({counts['slowest'][:160]}); "
            + ", ".join(f"{k} {ok}/{err}" for k, (ok, err) in sorted(counts["kinds"].items()))
        )
    assert counts["exit 0"] >= 30 and counts["exit 2"] >= 30  # both outcomes were reached
    assert len(counts["kinds"]) == 10, counts["kinds"]
