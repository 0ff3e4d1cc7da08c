"""Whether an output path and an input path overlap on disk, for the commands that replace their output
with `--force` (prepare-data, convert-checkpoint): replacing an output that is, holds or lies inside an input
would delete that input, so they refuse it naming both paths. Symlinks are followed, so another spelling of
the same folder is caught too."""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path


def relation(out: str | os.PathLike[str], other: str | os.PathLike[str]) -> str | None:
    """How `out` sits relative to `other`: "is", "lies inside", "holds", or None when apart."""
    a, b = Path(out).resolve(), Path(other).resolve()
    if a == b:
        return "is"
    if b in a.parents:
        return "lies inside"
    if a in b.parents:
        return "holds"
    return None


def first_overlap(
    out: str | os.PathLike[str], inputs: Iterable[str | os.PathLike[str]]
) -> tuple[Path, str] | None:
    """The first of `inputs` that `out` overlaps, with the relation (see `relation`), or None."""
    for other in inputs:
        how = relation(out, other)
        if how is not None:
            return Path(other), how
    return None


def some_entries(paths: Iterable[Path], limit: int = 4) -> str:
    """A few of `paths` by name, for a message saying what a refusal protects: "a.txt, b/ and 3 more"."""
    names = sorted(p.name + ("/" if p.is_dir() else "") for p in paths)
    shown = ", ".join(names[:limit])
    return shown + (f" and {len(names) - limit} more" if len(names) > limit else "")
