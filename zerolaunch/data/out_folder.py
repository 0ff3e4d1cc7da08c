"""prepare-data's OUT folder, before and after the writing (prepare.py): OUT is apart from every input, what
`--force` may replace, the lock that keeps a second run out, the unique hidden names of a run's partial and
of the OUT it replaces, and the leftovers of killed runs.

A run holds a flock on `.<out>.lock` beside OUT (util/filelock.py) from before it looks at OUT until its
folder is in place; a second run into the same OUT is refused naming the holder. Under the lock, every
`.<out>.partial*` / `.<out>.old*` folder is a killed run's and is removed. It does not write the folder's
contents (prepare.py) nor read inputs (readers.py).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import uuid
from pathlib import Path

from zerolaunch.data.readers import DataError
from zerolaunch.util.filelock import FileLock, LockHeld, describe_holder
from zerolaunch.util.overlap import first_overlap, some_entries

# [Note: what --force may replace]
# OUT is replaced only when it is a folder prepare-data wrote: its manifest.json says so, and every entry is
# one of the names below (those prepare.py's format writes). Anything else there (a user's notes, a corpus, a file named OUT) is refused with
# its names listed, so `--force` can never delete what this command did not write.
_OWN_ENTRY = re.compile(r"manifest\.json|documents\.idx|(tokens|loss_mask)-\d{5}\.bin")


def partial_name(out: Path, role: str = "partial") -> str:
    """A unique hidden name beside OUT ("partial": the folder being written; "old": the replaced OUT on its
    way out): two runs never share (and so never delete) each other's."""
    return f".{out.name}.{role}-{os.getpid()}-{uuid.uuid4().hex[:8]}"


def _is_leftover(out: Path, name: str) -> bool:
    """A partial or moved-aside folder of OUT that a killed run left (the lock holder's own ones aside)."""
    stem = re.escape(f".{out.name}.")
    return re.fullmatch(rf"{stem}(partial|old)(-\d+-[0-9a-f]{{8}})?", name) is not None


def check_apart(out: Path, inputs: list[str | Path], tokenizer: str | Path) -> None:
    """OUT is not an input, does not hold one and does not lie inside one: writing or replacing it there
    would delete or mix into the data it reads."""
    found = first_overlap(out, [*inputs, tokenizer])
    if found is None:
        return
    other, how = found
    role = "the tokenizer folder" if Path(other) == Path(tokenizer) else "the input"
    sibling = other.resolve().parent / f"{other.name.split('.')[0] or 'data'}-tokens"
    example = "" if first_overlap(sibling, [*inputs, tokenizer]) else f", e.g. --out {sibling}"
    raise DataError(
        f"--out {out} {how} {role} {other}: writing or replacing it would destroy or mix into that input. "
        f"Give an --out that neither is, holds nor lies inside any input or the tokenizer folder{example}"
    )


def check_replaceable(out: Path, force: bool, fmt: str) -> None:
    """OUT is free, or (with --force) a folder an earlier prepare-data wrote, its manifest of format `fmt`
    ([Note: what --force may replace])."""
    if not out.exists() and not out.is_symlink():
        return
    fix = "choose another --out, or move it away yourself"
    if not out.is_dir():
        raise DataError(
            f"--out {out} is a file; prepare-data writes a folder there and --force replaces only a folder "
            f"an earlier prepare-data wrote, never a file: {fix}"
        )
    entries = list(out.iterdir())
    foreign = [p for p in entries if not _OWN_ENTRY.fullmatch(p.name) or p.is_dir()]
    if entries and not foreign and not _is_prepared(out, fmt):
        foreign = [out / "manifest.json"] if (out / "manifest.json").exists() else entries
    if foreign:
        raise DataError(
            f"--out {out} holds {some_entries(foreign)}, which prepare-data did not write (it is not a folder "
            f"an earlier prepare-data made); --force replaces only such a folder, so nothing there is "
            f"deleted: {fix}"
        )
    if not force:
        raise DataError(f"--out {out}: already exists; pass --force to replace it")


def _is_prepared(folder: Path, fmt: str) -> bool:
    try:
        manifest = json.loads((folder / "manifest.json").read_text())
    except (OSError, ValueError):
        return False
    return isinstance(manifest, dict) and manifest.get("format") == fmt


def lock_out(out: Path, force: bool, fmt: str) -> FileLock:
    """Hold OUT's lock (beside it, so it works before OUT exists), check OUT again under it (another run
    may have finished meanwhile), and clear what killed runs left. Raises DataError when another run holds it."""
    lock = FileLock(out.parent / f".{out.name}.lock", {"out": str(out.resolve())})
    try:
        lock.acquire()
    except LockHeld as held:
        raise DataError(
            f"--out {out} is being written by another prepare-data ({describe_holder(held.holder)}); "
            "wait for it to end or stop it, or choose another --out"
        ) from None
    try:
        check_replaceable(out, force, fmt)
        for child in out.parent.iterdir():
            if _is_leftover(out, child.name):  # ours cannot exist yet; the lock keeps other runs out
                shutil.rmtree(child, ignore_errors=True)
    except BaseException:
        lock.release()
        raise
    return lock


def replace_out(partial: Path, out: Path) -> None:
    if out.exists():  # --force: the old folder goes only once the new one is complete
        old = out.parent / partial_name(out, "old")
        os.rename(out, old)
        os.rename(partial, out)
        shutil.rmtree(old)
    else:
        os.rename(partial, out)
