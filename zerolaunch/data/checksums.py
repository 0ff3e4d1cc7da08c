"""crc32 of a prepared folder's files: taken by prepare-data while it writes them, recorded in manifest.json
under `checksums` ({"algorithm": "crc32", "files": {file name: crc32}}), checked by the training reader
(tokens.py, each file once, on its first read) and by `zerolaunch prepare-data --verify DIR` (every file).

A folder prepared before checksums existed has no `checksums`: it still trains, unchecked, and --verify says
"no checksums recorded". This module owns the checksum record and its checks; it writes no folder.
"""

from __future__ import annotations

import os
import zlib
from pathlib import Path

import numpy as np

from zerolaunch.data.manifest import read_manifest
from zerolaunch.data.readers import DataError

ALGORITHM = "crc32"
READ_BYTES = 16 << 20
"""A file is checked in pieces of this size, so checking a 2 GiB shard holds 16 MiB, not the shard."""
FIX = "Re-run `zerolaunch prepare-data INPUT... --tokenizer DIR --out DIR --force` to write the folder again"


def recorded_crcs(manifest: dict) -> dict[str, int] | None:
    """{file name: crc32} of a manifest, or None for a folder prepared before checksums existed."""
    record = manifest.get("checksums")
    if record is None:
        return None
    if (
        not isinstance(record, dict)
        or record.get("algorithm") != ALGORITHM
        or not isinstance(record.get("files"), dict)
    ):
        raise ValueError(
            f"manifest `checksums` must be {{'algorithm': 'crc32', 'files': {{...}}}}, got {record!r:.80}"
        )
    return {str(name): int(crc) for name, crc in record["files"].items()}


def checksum_record(crcs: dict[str, int]) -> dict:
    return {"algorithm": ALGORITHM, "files": dict(sorted(crcs.items()))}


def fd_crc32(fd: int, size: int) -> int:
    """crc32 of the first `size` bytes of an open file, read with pread (the descriptor's offset stays)."""
    crc, offset = 0, 0
    while offset < size:
        piece = os.pread(fd, min(READ_BYTES, size - offset), offset)
        if not piece:
            break
        crc = zlib.crc32(piece, crc)
        offset += len(piece)
    return crc


def file_crc32(path: Path) -> int:
    fd = os.open(path, os.O_RDONLY)
    try:
        return fd_crc32(fd, os.fstat(fd).st_size)
    finally:
        os.close(fd)


def mismatch_message(path: Path, expected: int, found: int) -> str:
    return (
        f"{path}: crc32 {found:#010x}, but prepare-data recorded {expected:#010x} in manifest.json: the file "
        f"changed or was damaged after it was written, and training on it would read other tokens. {FIX}."
    )


def folder_files(manifest: dict) -> dict[str, int]:
    """{file name: expected size in bytes} of every data file a manifest lists."""
    itemsize = np.dtype(manifest["dtype"]).itemsize
    files = {}
    for shard in manifest["shards"]:
        files[shard["file"]] = int(shard["tokens"]) * itemsize
        if manifest.get("loss_mask"):
            files[shard["file"].replace("tokens-", "loss_mask-")] = int(shard["tokens"])
    files["documents.idx"] = (int(manifest["documents"]) + 1) * 8
    return files


def verify_folder(path: str | Path) -> str:
    """Check every file of a prepared folder against its manifest (sizes, and crc32 where recorded).

    Returns the line to print; a DataError naming every bad file (expected and found) when any is bad."""
    folder = Path(path)
    manifest = read_manifest(folder)
    try:
        crcs = recorded_crcs(manifest)
        sizes = folder_files(manifest)
    except (KeyError, TypeError, ValueError) as e:
        raise DataError(
            f"{folder / 'manifest.json'}: corrupt manifest ({type(e).__name__}: {e}). {FIX}."
        ) from None
    problems = []
    for name, size in sizes.items():
        file = folder / name
        try:
            found_size = file.stat().st_size
        except FileNotFoundError:
            problems.append(f"{name} is missing")
            continue
        if found_size != size:
            problems.append(f"{name} has {found_size} bytes, the manifest implies {size}")
            continue
        if crcs is not None:
            expected = crcs.get(name)
            found = file_crc32(file)
            if expected is None:
                problems.append(f"{name} has no crc32 in the manifest")
            elif found != expected:
                problems.append(f"{name} has crc32 {found:#010x}, expected {expected:#010x}")
    counts = (
        f"{len(sizes)} files, {manifest['documents']:,} documents, {manifest['tokens']:,} tokens "
        f"in {len(manifest['shards'])} shard(s)"
    )
    if problems:
        raise DataError(
            f"prepare-data --verify {folder}: {len(problems)} of {len(sizes)} files are bad: "
            f"{'; '.join(problems)}. {FIX}."
        )
    if crcs is None:
        return (
            f"{folder}: no checksums recorded (prepared before prepare-data wrote them): {counts}, sizes match "
            "but the content is unchecked; re-run prepare-data to record checksums"
        )
    return f"ok: {folder}: {counts}, every size and crc32 matches"
