"""Seeded mutations the fuzz tests share (test_fuzz.py, test_fuzz_recipes.py, test_fuzz_prepare_data.py): a
config tree's leaves retyped, keys dropped or made up, a file's bytes overwritten. Each takes the test's
`random.Random`, so a seed names the same cases on every run; each draws from it in one fixed order."""

from __future__ import annotations

import random
from collections.abc import Iterator, Sequence


def leaves(tree: dict, path: tuple = ()) -> Iterator[tuple[tuple, object]]:
    """(key path, value) of every leaf; an empty mapping is a leaf (it can be retyped like any value)."""
    for key, value in tree.items():
        if isinstance(value, dict) and value:
            yield from leaves(value, (*path, key))
        else:
            yield (*path, key), value


def mappings(tree: dict, path: tuple = ()) -> Iterator[tuple[tuple, dict]]:
    """(key path, mapping) of the tree itself and every mapping in it."""
    yield path, tree
    for key, value in tree.items():
        if isinstance(value, dict):
            yield from mappings(value, (*path, key))


def set_at(tree: dict, path: Sequence, value) -> None:
    """tree[path[0]]...[path[-1]] = value, making the mappings on the way that are missing."""
    for key in path[:-1]:
        tree = tree.setdefault(key, {})
    tree[path[-1]] = value


def retype(rng: random.Random, tree: dict, values: Sequence) -> tuple[tuple, object]:
    """Set a random leaf to a random one of `values`; returns (its path, the value set)."""
    path, _ = rng.choice(list(leaves(tree)))
    value = rng.choice(values)
    set_at(tree, path, value)
    return path, value


def drop_key(rng: random.Random, tree: dict) -> None:
    """Delete a random key of a random non-empty mapping."""
    _, mapping = rng.choice([m for m in mappings(tree) if m[1]])
    del mapping[rng.choice(list(mapping))]


def add_unknown(
    rng: random.Random, tree: dict, names: Sequence[str], values: Sequence, suffixes: Sequence[str] = ()
) -> None:
    """Put a made-up key (one of `names`, plus one of `suffixes` when given: near misses of real keys) with one
    of `values` into a random mapping."""
    _, mapping = rng.choice(list(mappings(tree)))
    value = rng.choice(values)
    name = rng.choice(names) + (rng.choice(suffixes) if suffixes else "")
    mapping[name] = value


def overwrite_bytes(rng: random.Random, data: bytes, most: int, values: range = range(256)) -> bytes:
    """`data` with 1 to `most` random positions overwritten by bytes drawn from `values` (range(32, 127) keeps
    text printable)."""
    out = bytearray(data)
    for _ in range(rng.randint(1, most)):
        if out:
            out[rng.randrange(len(out))] = rng.randrange(values.start, values.stop)
    return bytes(out)
