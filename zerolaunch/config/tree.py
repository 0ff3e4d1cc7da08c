"""The raw (unresolved) recipe tree, with where every value came from.

`RawTree` holds the nested dict built from the recipe file, a separate DeepSpeed file and --set overrides,
and for every path its origin (file / --set) and a human "where" (`recipe.yaml line 12`, `--set train.lr=1`)
that error messages quote. It does no validation and no resolution.
"""

from __future__ import annotations

from typing import Any

from .errors import RecipeError, dotted

Path = tuple[str, ...]


class _Missing:
    def __repr__(self) -> str:
        return "MISSING"


MISSING: Any = _Missing()


class RawTree:
    def __init__(self) -> None:
        self.data: dict[str, Any] = {}
        self._records: dict[Path, tuple[str, str]] = {}
        self._lines: dict[Path, int] = {}
        self._spelled: dict[Path, str] = {}
        """Keys the user wrote under another name (DeepSpeed's field names): path -> the name written."""
        self.bare_deepspeed = False
        """The recipe file is a bare ds_config.json: its keys are shown without the `deepspeed.` prefix."""

    def put(
        self, path: Path, value: Any, origin: str, where: str, lines: dict[Path, int] | None = None
    ) -> None:
        """Set `path` to `value` (creating mappings on the way); later puts win, as --set over the file."""
        if path:
            parent = self.data
            for depth, key in enumerate(path[:-1]):
                child = parent.get(key, MISSING)
                if child is MISSING or child is None:
                    child = parent[key] = {}
                elif not isinstance(child, dict):
                    raise RecipeError(
                        f"Cannot set `{dotted(path)}` ({where}): `{dotted(path[: depth + 1])}` is "
                        f"{type(child).__name__} {child!r}, not a mapping. Set the mapping itself, or fix the "
                        "key path."
                    )
                parent = child
            parent[path[-1]] = value
        else:
            if not isinstance(value, dict):
                raise RecipeError(
                    f"{where}: the recipe must be a mapping of sections, got {type(value).__name__}."
                )
            self.data = value
        for old in [p for p in self._records if p[: len(path)] == path]:
            del self._records[old]
        for old in [p for p in self._lines if p[: len(path)] == path]:
            del self._lines[old]
        self._records[path] = (origin, where)
        for sub, line in (lines or {}).items():
            self._lines[path + sub] = line

    def get(self, path: Path) -> Any:
        node: Any = self.data
        for key in path:
            if not isinstance(node, dict) or key not in node:
                return MISSING
            node = node[key]
        return node

    def has(self, path: Path) -> bool:
        return self.get(path) is not MISSING

    def origin(self, path: Path) -> str:
        """file or --set for a value present in the tree (the nearest recorded ancestor decides)."""
        return self._record(path)[0]

    def from_file(self, path: Path) -> bool:
        """True when some value under `path` was written in a file (not only created by --set)."""
        leaves = [p for p, v in self.walk(path) if not isinstance(v, dict)] or [path]
        return any(self.has(p) and self.origin(p) == "file" for p in leaves)

    def where(self, path: Path) -> str:
        """`recipe.yaml line 12` / `--set train.lr=1`, for error messages."""
        origin, where = self._record(path)
        if origin == "file":
            for depth in range(len(path), 0, -1):
                line = self._lines.get(path[:depth])
                if line is not None:
                    return f"{where} line {line}"
        return where

    def _record(self, path: Path) -> tuple[str, str]:
        for depth in range(len(path), -1, -1):
            record = self._records.get(path[:depth])
            if record is not None:
                return record
        return ("default", "the built-in defaults")

    def rename(self, old: Path, new: Path) -> None:
        """Move the value at `old` to `new` (a synonym the loader normalizes), keeping where it was written and
        how: errors about `new` quote `old`'s file, line and spelling."""
        origin, where = self._record(old)
        lines = {p[len(old) :]: line for p, line in self._lines.items() if p[: len(old)] == old}
        value = self.get(old)
        parent = self.get(old[:-1])
        del parent[old[-1]]
        self.put(new, value, origin, where, lines)
        self._spelled[new] = old[-1]

    def key(self, path: Path) -> str:
        """The dotted key as the user wrote it (no `deepspeed.` prefix inside a bare ds_config.json)."""
        for depth in range(len(path), 0, -1):  # the renamed key itself or a key inside a renamed mapping
            spelled = self._spelled.get(path[:depth])
            if spelled is not None:
                path = path[: depth - 1] + (spelled,) + path[depth:]
                break
        if self.bare_deepspeed and path[:1] == ("deepspeed",) and len(path) > 1:
            path = path[1:]
        return dotted(path)

    def walk(self, path: Path = ()) -> list[tuple[Path, Any]]:
        """Every (path, value) under `path`, mappings included, parents before children."""
        out: list[tuple[Path, Any]] = []
        node = self.get(path)
        if isinstance(node, dict):
            for key, value in node.items():
                out.append((path + (key,), value))
                out.extend(self.walk(path + (key,)))
        return out
