"""Reading prepare-data's inputs: records from jsonl, jsonl.gz, JSON arrays, parquet, txt/md and
`datasets.save_to_disk` folders, each with the place it came from (file and line, item or row).

This module owns finding the input files (a folder means its files, sorted) and turning each into a stream of
records (`Record`: the text, or prompt/completion, or chat messages, as the mode asks). It does not tokenize
or write anything (prepare.py). Every problem in the input is a `DataError` naming the file and the line.
"""

from __future__ import annotations

import gzip
import json
import re
import reprlib
import zlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from zerolaunch.util.errors import UserError
from zerolaunch.util.sizes import fmt_bytes

MODES = ("text", "prompt-completion", "chat")
TEXT_SUFFIXES = (".txt", ".md")
JSONL_SUFFIXES = (".jsonl", ".jsonl.gz", ".ndjson")
JSON_SUFFIXES = (".json",)
PARQUET_SUFFIXES = (".parquet",)
ARROW_SUFFIXES = (".arrow",)
RECORD_SUFFIXES = JSONL_SUFFIXES + JSON_SUFFIXES + PARQUET_SUFFIXES + ARROW_SUFFIXES
ALL_SUFFIXES = TEXT_SUFFIXES + RECORD_SUFFIXES
_DATASETS_MARKERS = ("state.json", "dataset_info.json")
_ARROW_ROWS = 1024


class DataError(UserError, ValueError):
    """Input that prepare-data cannot use; the message names the file and the line (or item, or row). A
    ValueError too, so a data builder that meets it in a worker is reported as the builder's error."""


@dataclass(frozen=True)
class Source:
    """One input file: its path and kind ("text", "jsonl", "json", "parquet", "arrow")."""

    path: Path
    kind: str
    read_bytes: list = field(default_factory=lambda: [0], compare=False)
    """[bytes of the file read so far] (of the compressed file for .gz): the reader updates it, for the ETA."""

    @property
    def size_bytes(self) -> int:
        return self.path.stat().st_size


def _kind(path: Path, text_suffixes: tuple[str, ...] = TEXT_SUFFIXES) -> str | None:
    name = path.name.lower()
    if name.endswith(text_suffixes):
        return "text"
    if name.endswith(JSONL_SUFFIXES):
        return "jsonl"
    if name.endswith(JSON_SUFFIXES):
        return "json"
    if name.endswith(PARQUET_SUFFIXES):
        return "parquet"
    if name.endswith(ARROW_SUFFIXES):
        return "arrow"
    return None


def _is_datasets_folder(path: Path) -> bool:
    return all((path / m).is_file() for m in _DATASETS_MARKERS)


def find_sources(inputs: list[str | Path], text_suffixes: tuple[str, ...] = TEXT_SUFFIXES) -> list[Source]:
    """The input files in order: each file as given, each folder's files sorted by path.

    A `datasets.save_to_disk` folder (state.json + dataset_info.json) stands for its .arrow files in the
    order its state.json lists them; other folders are searched recursively for the known suffixes, plain
    text being `text_suffixes` (hf_text's byte-level path reads source code too).
    """
    suffixes = text_suffixes + RECORD_SUFFIXES
    if not inputs:
        raise DataError(
            "prepare-data: no INPUT given; name .jsonl/.jsonl.gz/.json/.parquet/.txt/.md files or folders"
        )
    found: list[Source] = []
    for p in map(Path, inputs):
        if not p.exists():
            raise DataError(f"{p}: no such file or folder")
        if p.is_dir():
            if (p / "dataset_dict.json").is_file():
                splits = json.loads((p / "dataset_dict.json").read_text()).get("splits", [])
                raise DataError(
                    f"{p}: a datasets DatasetDict ({', '.join(splits)}); give one split's folder, e.g. {p / 'train'}"
                )
            if _is_datasets_folder(p):
                state = json.loads((p / "state.json").read_text())
                files = [p / f["filename"] for f in state.get("_data_files", [])]
                found.extend(Source(f, "arrow") for f in files)
                continue
            inside = sorted(f for f in p.rglob("*") if f.is_file() and _kind(f, text_suffixes) is not None)
            # a datasets folder inside a folder: its .json metadata files are not data
            inside = [
                f for f in inside if not (f.name in _DATASETS_MARKERS and _is_datasets_folder(f.parent))
            ]
            if not inside:
                raise DataError(f"{p}: the folder holds no {'/'.join(suffixes)} files")
            found.extend(Source(f, _kind(f, text_suffixes)) for f in inside)
        else:
            kind = _kind(p, text_suffixes)
            if kind is None:
                raise DataError(f"{p}: unknown file type; expected one of {', '.join(suffixes)}")
            found.append(Source(p, kind))
    return found


@dataclass(frozen=True)
class Record:
    """One document as the mode needs it, and where it came from ("file:line", "file item 3", "file row 7")."""

    where: str
    text: str | None = None
    prompt: str | None = None
    completion: str | None = None
    messages: list | None = None


def _field(row, key: str, where: str, hint: str) -> str:
    if not isinstance(row, dict):
        raise DataError(f"{where}: expected a JSON object, got {type(row).__name__}")
    if key not in row:
        raise DataError(
            f"{where}: no key {key!r} (keys: {', '.join(sorted(map(str, row))) or 'none'}); {hint}"
        )
    value = row[key]
    if not isinstance(value, str):
        raise DataError(f"{where}: {key!r} is {type(value).__name__}, expected a string")
    return _valid_text(value, where, repr(key))


def _valid_text(value: str, where: str, what: str) -> str:
    """`value`, checked to be encodable text: a JSON escape like "\\ud800" decodes to a lone surrogate, which
    no tokenizer accepts."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as e:
        raise DataError(
            f"{where}: {what} holds a lone surrogate ({value[e.start]!a} at character {e.start}), which is not "
            "text; fix or drop that \\u escape in the file"
        ) from None
    return value


def to_record(row, where: str, mode: str, text_key: str) -> Record:
    """The record of one JSON object / table row in `mode`."""
    if mode == "text":
        return Record(
            where,
            text=_field(
                row,
                text_key,
                where,
                "pass --text-key (data.args.text_key in a recipe) with the field that holds the text",
            ),
        )
    if mode == "prompt-completion":
        hint = "prompt-completion rows need string fields 'prompt' and 'completion'"
        return Record(
            where,
            prompt=_field(row, "prompt", where, hint),
            completion=_field(row, "completion", where, hint),
        )
    if not isinstance(row, dict) or "messages" not in row:
        keys = ", ".join(sorted(map(str, row))) if isinstance(row, dict) else type(row).__name__
        raise DataError(
            f"{where}: no key 'messages' (found {keys}); chat rows are {{'messages': [{{'role', 'content'}}, ...]}}"
        )
    messages = row["messages"]
    if not isinstance(messages, list) or not messages:
        raise DataError(f"{where}: 'messages' must be a non-empty list of {{'role', 'content'}} objects")
    for i, m in enumerate(messages):
        if (
            not isinstance(m, dict)
            or not isinstance(m.get("role"), str)
            or not isinstance(m.get("content"), str)
        ):
            raise DataError(
                f"{where}: messages[{i}] must be {{'role': str, 'content': str}}, got {reprlib.repr(m)}"
            )
        _valid_text(m["role"], where, f"messages[{i}].role")
        _valid_text(m["content"], where, f"messages[{i}].content")
    return Record(where, messages=messages)


def said(err: BaseException) -> str:
    """A library's own words for `err` on one line, for inside a one-paragraph message (pyarrow's and
    OSError's messages can hold newlines, the errno and exception class names)."""
    text = err.strerror if isinstance(err, OSError) and err.strerror else str(err)
    # pyarrow's words name C++ exception classes ("TProtocolException: Invalid data"): keep the words only
    text = re.sub(r"\b[A-Z]\w*(Error|Exception):\s*|\[Errno \d+\]\s*", "", text)
    return " ".join(text.split()) or "unreadable"


def _decode(raw: bytes, where: str) -> str:
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise DataError(
            f"{where}: not UTF-8 (byte {e.start}: {raw[e.start : e.start + 1]!r}); re-encode the file as UTF-8"
        ) from None


def _read_jsonl(src: Source, mode: str, text_key: str) -> Iterator[Record]:
    gz = src.path.name.lower().endswith(".gz")
    try:
        with open(src.path, "rb") as raw_file:
            f = gzip.open(raw_file, "rb") if gz else raw_file
            seekable = raw_file.seekable()  # a named pipe is read as it comes, with no position for the ETA
            for line_no, raw in enumerate(f, start=1):
                if seekable:
                    src.read_bytes[0] = raw_file.tell()
                where = f"{src.path}:{line_no}"
                line = _decode(raw, where)
                if not line.strip():
                    continue
                try:
                    row = json.loads(line)
                except json.JSONDecodeError as e:
                    raise DataError(
                        f"{where}: broken JSON ({e.msg} at column {e.colno}); each line must be one JSON object"
                    ) from None
                except RecursionError:
                    raise DataError(f"{where}: {_TOO_DEEP}") from None
                yield to_record(row, where, mode, text_key)
    except (OSError, EOFError, zlib.error) as e:  # a truncated or corrupt .gz
        raise DataError(f"{src.path}: cannot be read ({said(e)})") from None


_TOO_DEEP = (
    "JSON nested too deeply to read (arrays or objects inside each other past Python's recursion limit); "
    "a record is an object whose text is a string field"
)


def _line_of(raw: bytes, byte_offset: int) -> int:
    return raw.count(b"\n", 0, byte_offset) + 1


def _read_text(src: Source, mode: str) -> Iterator[Record]:
    if mode != "text":
        raise DataError(
            f"{src.path}: a plain-text file has no {mode} fields; use .jsonl/.parquet for --mode {mode}"
        )
    raw = src.path.read_bytes()
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise DataError(
            f"{src.path}:{_line_of(raw, e.start)}: not UTF-8 (byte {e.start}); re-encode the file as UTF-8"
        ) from None
    yield Record(f"{src.path}", text=text)


def _read_json(src: Source, mode: str, text_key: str) -> Iterator[Record]:
    raw = src.path.read_bytes()
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise DataError(
            f"{src.path}:{_line_of(raw, e.start)}: not UTF-8 (byte {e.start}); re-encode the file as UTF-8"
        ) from None
    try:
        rows = json.loads(text)
    except json.JSONDecodeError as e:
        raise DataError(f"{src.path}:{e.lineno}: broken JSON ({e.msg} at column {e.colno})") from None
    except RecursionError:
        raise DataError(f"{src.path}: {_TOO_DEEP}") from None
    if not isinstance(rows, list):
        raise DataError(f"{src.path}: a .json input must be an array of objects, got a {type(rows).__name__}")
    for i, row in enumerate(rows):
        yield to_record(row, f"{src.path} item {i}", mode, text_key)


def _table_columns(mode: str, text_key: str) -> list[str]:
    return {"text": [text_key], "prompt-completion": ["prompt", "completion"], "chat": ["messages"]}[mode]


def _read_batches(
    src: Source, batches, schema_names: list[str], mode: str, text_key: str
) -> Iterator[Record]:
    wanted = _table_columns(mode, text_key)
    missing = [c for c in wanted if c not in schema_names]
    if missing:
        hint = " (pass --text-key)" if mode == "text" else ""
        raise DataError(f"{src.path}: no column {missing[0]!r}{hint}; columns: {', '.join(schema_names)}")
    row_no = 0
    batches = iter(batches)
    while True:
        try:
            batch = next(batches)
            columns = {c: batch.column(c).to_pylist() for c in wanted}
        except StopIteration:
            return
        # pyarrow: OSError or ArrowInvalid for a damaged page, UnicodeDecodeError for damaged string bytes
        except Exception as e:
            raise DataError(
                f"{src.path} row {row_no}: cannot be read past here, the file is damaged ({said(e)}); write it again"
            ) from None
        for i in range(batch.num_rows):
            yield to_record({c: columns[c][i] for c in wanted}, f"{src.path} row {row_no}", mode, text_key)
            row_no += 1


def _read_parquet(src: Source, mode: str, text_key: str) -> Iterator[Record]:
    import pyarrow.parquet as pq

    try:
        f = pq.ParquetFile(src.path)
    except Exception as e:  # pyarrow raises ArrowInvalid / OSError for a non-parquet file
        raise DataError(f"{src.path}: not a readable parquet file ({said(e)})") from None
    names = f.schema_arrow.names
    cols = [c for c in _table_columns(mode, text_key) if c in names]
    yield from _read_batches(src, f.iter_batches(batch_size=_ARROW_ROWS, columns=cols), names, mode, text_key)


def _read_arrow(src: Source, mode: str, text_key: str) -> Iterator[Record]:
    import pyarrow as pa

    try:
        reader = pa.ipc.open_stream(pa.memory_map(str(src.path)))  # datasets writes the streaming format
    except Exception:
        try:
            reader = pa.ipc.open_file(pa.memory_map(str(src.path)))
            batches = (reader.get_batch(i) for i in range(reader.num_record_batches))
            yield from _read_batches(src, batches, reader.schema.names, mode, text_key)
            return
        except Exception as e:
            raise DataError(f"{src.path}: not a readable arrow file ({said(e)})") from None
    yield from _read_batches(src, reader, reader.schema.names, mode, text_key)


def read_records(
    src: Source, mode: str, text_key: str = "text", max_document_bytes: int | None = None
) -> Iterator[Record]:
    """The records of one input file, in file order; a document over `max_document_bytes` (None: no limit)
    is a DataError naming it (see MAX_DOCUMENT_BYTES)."""
    if mode not in MODES:
        raise DataError(f"--mode {mode!r} is unknown; choose one of {', '.join(MODES)}")
    if src.kind == "text":
        if max_document_bytes is not None and src.size_bytes > max_document_bytes:
            # the whole file is one document: refuse before reading it
            raise too_long(f"{src.path}", src.size_bytes, max_document_bytes)
        return _read_text(src, mode)
    if src.kind == "jsonl":
        records = _read_jsonl(src, mode, text_key)
    elif src.kind == "json":
        records = _read_json(src, mode, text_key)
    elif src.kind == "parquet":
        records = _read_parquet(src, mode, text_key)
    else:
        records = _read_arrow(src, mode, text_key)
    return records if max_document_bytes is None else _within(records, max_document_bytes)


MAX_DOCUMENT_BYTES = 8 << 20
"""The default --max-document-bytes. A fast tokenizer holds about 250 bytes per byte of a document's text
while it encodes it (offsets, token strings; measured 1.4 GB RSS and 33 s for one 5 MB line), so a single
huge document (a 50 MB line took 11 GB) is refused by name rather than exhausting memory."""


def _within(records: Iterator[Record], limit: int) -> Iterator[Record]:
    for record in records:
        texts = [
            record.text,
            record.prompt,
            record.completion,
            *(m["content"] for m in record.messages or []),
        ]
        chars = sum(len(t) for t in texts if t is not None)
        # a character is 1 to 4 UTF-8 bytes: count the bytes only where the limit could be passed
        if chars * 4 > limit:
            nbytes = sum(len(t.encode("utf-8")) for t in texts if t is not None)
            if nbytes > limit:
                raise too_long(record.where, nbytes, limit)
        yield record


def too_long(where: str, nbytes: int, limit: int) -> DataError:
    return DataError(
        f"{where}: a document of {fmt_bytes(nbytes)}, over --max-document-bytes {fmt_bytes(limit)}; the "
        f"tokenizer would hold about {fmt_bytes(250 * nbytes)} of memory for it at once. Split it into "
        f"smaller documents, or raise the limit (--max-document-bytes {-(-nbytes // (1 << 20))}MiB)"
    )
