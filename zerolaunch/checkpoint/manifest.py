"""The manifest of a zerolaunch checkpoint: what `manifest.json` holds, and its validation.

A checkpoint folder `step_000123/` holds `manifest.json` and one `rank_{r}.safetensors` per saving rank.
Rank files hold tensors under four prefixes: `{kind}/{param}/{start}` (one fragment of fp32 state, see
[Note: layout] in zero/layout.py; kind = master, exp_avg, exp_avg_sq, momentum_buffer, step), `frozen/
{param}/{start}` (one fragment of a frozen param that stage 3 shards, in the param's dtype, from the rank
that holds it: each element once), `replicated/{name}` (the other frozen params and buffers, rank 0 only) and
`extra/{key}` (tensor leaves of that rank's `extra`). A frozen param is in `replicated` or in frozen
fragments, never both (checkpoints written before stage 3 sharded frozen params have them all replicated).
The manifest lists every parameter (name, shape, dtype, trainable, aliases), every rank's fragments and
file size, the step, stage, engine state_meta and each rank's JSON `extra`, so a checkpoint describes itself
and loads at any world size. The rank files' bytes are covered by per-tensor crc32s (RankEntry.checksums);
the manifest itself, whose JSON `extra` holds the data position, the RNG's JSON leaves and the HF config that
convert-checkpoint writes out, by one crc32 of its own canonical JSON (the top-level `checksum`). This module
owns that schema; it reads no tensors.
"""

from __future__ import annotations

import json
import zlib
from dataclasses import asdict, dataclass, field
from pathlib import Path

from zerolaunch.checkpoint.errors import CheckpointError

FORMAT = "zerolaunch.checkpoint"
VERSION = 1
MANIFEST_NAME = "manifest.json"
CHECKSUM_KEY = "checksum"
"""Top-level manifest key: {"algorithm": "crc32", "body": crc32 of every other key, see manifest_crc}."""


def manifest_crc(d: dict) -> int:
    """crc32 of the manifest without its own checksum, as canonical JSON (sorted keys, no spaces), so it
    does not depend on how the file was indented or on tuples written as lists."""
    body = {k: v for k, v in d.items() if k != CHECKSUM_KEY}
    return zlib.crc32(json.dumps(body, sort_keys=True, separators=(",", ":")).encode())


def rank_file_name(rank: int) -> str:
    return f"rank_{rank}.safetensors"


def fragment_key(kind: str, name: str, start: int) -> str:
    return f"{kind}/{name}/{start}"


@dataclass(frozen=True)
class ParamEntry:
    name: str
    shape: tuple[int, ...]
    dtype: str
    """The model's dtype of the parameter ("bfloat16"); state is always stored in fp32."""
    trainable: bool
    aliases: tuple[str, ...] = ()
    """Other names of the same tensor (tied weights), written out again on conversion."""

    @property
    def numel(self) -> int:
        n = 1
        for d in self.shape:
            n *= d
        return n


@dataclass(frozen=True)
class ReplicatedEntry:
    name: str
    shape: tuple[int, ...]
    dtype: str
    persistent: bool = True
    """False for a buffer registered with persistent=False (a rotary cache): resumed, but not exported."""


@dataclass(frozen=True)
class RankEntry:
    file: str
    bytes: int
    """Size of the rank file when written: a shorter file on load is reported as truncated."""
    fragments: tuple[tuple[str, int, int], ...]
    """(param name, start, stop) of every fragment the rank saved."""
    extra: dict = field(default_factory=dict)
    """JSON leaves of the rank's `extra` (RNG states, data position); tensor leaves are in the rank file."""
    extra_tensors: tuple[str, ...] = ()
    checksums: dict | None = None
    """crc32 of the file's header and of every tensor's bytes, taken while writing
    ({"algorithm": "crc32", "header": int, "tensors": {name: int}}); None in checkpoints written before
    checksums existed (they load unverified)."""
    frozen_fragments: tuple[tuple[str, int, int], ...] = ()
    """(param name, start, stop) of every frozen-param fragment the rank saved (stage 3 shards them)."""


@dataclass(frozen=True)
class Manifest:
    step: int
    world_size: int
    stage: int | None
    kinds: tuple[str, ...]
    params: tuple[ParamEntry, ...]
    replicated: tuple[ReplicatedEntry, ...]
    ranks: tuple[RankEntry, ...]
    state_meta: dict = field(default_factory=dict)
    bucket_numel: int | None = None
    """The saving engine's reduce_bucket_size, reused when resharding offline to another world size."""
    excluded_frozen: tuple[str, ...] = ()
    """Frozen params (requires_grad False) left out of params and replicated (save_checkpoint's
    exclude_frozen_parameters, as DeepSpeed's); a load keeps the model's values for them."""

    def to_json(self) -> dict:
        d = {"format": FORMAT, "version": VERSION, **asdict(self)}
        if not d["excluded_frozen"]:  # written only when used: other checkpoints keep their manifest
            del d["excluded_frozen"]
        for r in d["ranks"]:
            if not r["frozen_fragments"]:  # likewise
                del r["frozen_fragments"]
        d[CHECKSUM_KEY] = {"algorithm": "crc32", "body": manifest_crc(d)}
        return d

    @staticmethod
    def from_json(d: dict, where: Path, *, verify: bool = True) -> Manifest:
        if not isinstance(d, dict) or d.get("format") != FORMAT:
            raise CheckpointError(f"{where} is not a zerolaunch checkpoint manifest (no format={FORMAT!r})")
        if d.get("version") != VERSION:
            raise CheckpointError(
                f"{where}: manifest version {d.get('version')!r} is not supported "
                f"(this zerolaunch reads version {VERSION}); convert it with the "
                "zerolaunch version that wrote it"
            )
        if verify:
            check_manifest_crc(d, where)
        try:
            manifest = Manifest(
                step=_int(d["step"]),
                world_size=_int(d["world_size"]),
                stage=None if d.get("stage") is None else _int(d["stage"]),
                kinds=tuple(_str(k) for k in d["kinds"]),
                params=tuple(
                    ParamEntry(
                        _str(p["name"]),
                        tuple(_int(n) for n in p["shape"]),
                        _str(p["dtype"]),
                        bool(p["trainable"]),
                        tuple(p.get("aliases", ())),
                    )
                    for p in d["params"]
                ),
                replicated=tuple(
                    ReplicatedEntry(
                        _str(r["name"]),
                        tuple(_int(n) for n in r["shape"]),
                        _str(r["dtype"]),
                        bool(r.get("persistent", True)),
                    )
                    for r in d["replicated"]
                ),
                ranks=tuple(
                    RankEntry(
                        _str(r["file"]),
                        _int(r["bytes"]),
                        tuple((str(n), _int(a), _int(b)) for n, a, b in r["fragments"]),
                        dict(r.get("extra", {})),
                        tuple(r.get("extra_tensors", ())),
                        _checksums(r.get("checksums")),
                        tuple((_str(n), _int(a), _int(b)) for n, a, b in r.get("frozen_fragments", ())),
                    )
                    for r in d["ranks"]
                ),
                state_meta=dict(d.get("state_meta", {})),
                bucket_numel=d.get("bucket_numel"),
                excluded_frozen=tuple(_str(n) for n in d.get("excluded_frozen", ())),
            )
        except (KeyError, TypeError, ValueError) as e:
            raise CheckpointError(f"{where}: corrupt manifest ({type(e).__name__}: {e})") from None
        if len(manifest.ranks) != manifest.world_size:
            raise CheckpointError(
                f"{where}: manifest lists {len(manifest.ranks)} rank files for world size "
                f"{manifest.world_size}"
            )
        manifest.check_coverage(where)
        return manifest

    def check_coverage(self, where: Path) -> None:
        """Every trainable param's elements are covered exactly once by the ranks' fragments; every frozen
        param is replicated or covered exactly once by the ranks' frozen fragments."""
        pieces: dict[str, list[tuple[int, int]]] = {p.name: [] for p in self.params if p.trainable}
        for r in self.ranks:
            for name, a, b in r.fragments:
                if name not in pieces:
                    raise CheckpointError(f"{where}: fragment of unknown or frozen param {name!r}")
                pieces[name].append((a, b))
        replicated = {r.name for r in self.replicated}
        frozen: dict[str, list[tuple[int, int]]] = {
            p.name: [] for p in self.params if not p.trainable and p.name not in replicated
        }
        for r in self.ranks:
            for name, a, b in r.frozen_fragments:
                if name not in frozen:
                    raise CheckpointError(
                        f"{where}: frozen fragment of unknown, trainable or replicated param {name!r}"
                    )
                frozen[name].append((a, b))
        self._check_exact(where, pieces)
        self._check_exact(where, frozen)

    def _check_exact(self, where: Path, pieces: dict[str, list[tuple[int, int]]]) -> None:
        numel = {p.name: p.numel for p in self.params}
        for name, ranges in pieces.items():
            pos = 0
            for a, b in sorted(ranges):
                if a != pos or b <= a:
                    break
                pos = b
            if pos != numel[name]:
                raise CheckpointError(
                    f"{where}: the rank files do not cover param {name!r} exactly "
                    f"(fragments {sorted(ranges)[:4]}, numel {numel[name]})"
                )


def check_manifest_crc(d: dict, where: Path) -> None:
    """The manifest's own crc32 matches its content; a CheckpointError naming the file if not.

    A manifest with no `checksum` is accepted only when its rank entries carry none either (a checkpoint
    written before checksums existed); one that lost it while its ranks kept theirs was edited."""
    recorded = d.get(CHECKSUM_KEY)
    fix = "Use another checkpoint (or a good copy of this file); --no-verify reads it unchecked"
    if recorded is None:
        ranks = d.get("ranks")
        if isinstance(ranks, list) and any(isinstance(r, dict) and r.get("checksums") for r in ranks):
            raise CheckpointError(
                f"{where} has no `{CHECKSUM_KEY}` though its rank files have checksums: it was edited or "
                f"damaged. {fix}"
            )
        return
    if not isinstance(recorded, dict) or recorded.get("algorithm") != "crc32":
        raise CheckpointError(f"{where}: corrupt manifest (`{CHECKSUM_KEY}` is {recorded!r:.80}). {fix}")
    want, got = recorded.get("body"), manifest_crc(d)
    if isinstance(want, bool) or not isinstance(want, int) or want != got:
        shown = f"{want:#010x}" if isinstance(want, int) and not isinstance(want, bool) else f"{want!r:.40}"
        raise CheckpointError(
            f"{where} is damaged or was edited: its content has crc32 {got:#010x}, the manifest recorded "
            f"{shown} when it was written (it covers the step, the layout and every rank's extra: data "
            f"position, RNG, HF config). {fix}"
        )


def _int(value) -> int:
    """A whole number as JSON writes one: int("7"), int(7.9) or int(True) would accept an edited manifest."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"expected a whole number >= 0, got {value!r:.40}")
    return value


def _str(value) -> str:
    if not isinstance(value, str):
        raise ValueError(f"expected a string, got {value!r:.40}")
    return value


def _checksums(value) -> dict | None:
    if value is None:
        return None
    if (
        not isinstance(value, dict)
        or value.get("algorithm") != "crc32"
        or not isinstance(value.get("tensors"), dict)
    ):
        raise TypeError(
            f"checksums must be {{'algorithm': 'crc32', 'header': int, 'tensors': {{...}}}}, got {value!r:.80}"
        )
    return {
        "algorithm": "crc32",
        "header": int(value["header"]),
        "tensors": {str(k): int(v) for k, v in value["tensors"].items()},
    }


def read_manifest(folder: Path, *, verify: bool = True) -> Manifest:
    path = Path(folder) / MANIFEST_NAME
    try:
        text = path.read_text()
    except (FileNotFoundError, NotADirectoryError):
        raise CheckpointError(
            f"{folder} is not a zerolaunch checkpoint: {MANIFEST_NAME} is missing"
        ) from None
    except OSError as e:
        raise CheckpointError(f"cannot read {path}: {e.strerror}") from None
    except UnicodeDecodeError as e:
        raise CheckpointError(f"{path} is corrupt: not UTF-8 text ({e.reason} at byte {e.start})") from None
    try:
        d = json.loads(text)
    except json.JSONDecodeError as e:
        raise CheckpointError(f"{path} is corrupt: {e}") from None
    return Manifest.from_json(d, path, verify=verify)
