"""Offline resharding: rewrite a zerolaunch checkpoint for another world size (`--to-world-size N`).

Online resume at another world size needs none of this (load_checkpoint re-slices on the fly); this is
for moving a checkpoint between clusters without the old ranks' files, or for inspecting a layout. The
new fragments are planned with `zero.layout.plan_layout` at the new world size and the saving engine's
bucket size (the manifest's `bucket_numel`), i.e. as stages 1/2 would own them; any engine still loads
them, whatever its own layout. Frozen params saved as fragments (stage 3) are re-planned the same way (as
frozen fragments); replicated ones stay in rank 0's file. Every kind of state (master, Adam moments, step) is carried over, and
rank r's `extra` is kept for r below the old world size (new ranks get rank 0's). Rank files are written
one tensor at a time; the output folder is published atomically ([Note: atomic save]).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import torch

from zerolaunch.checkpoint.deepspeed import find_deepspeed_checkpoint
from zerolaunch.checkpoint.errors import CheckpointError
from zerolaunch.checkpoint.extra import encode_extra
from zerolaunch.checkpoint.manifest import MANIFEST_NAME, RankEntry, fragment_key, rank_file_name
from zerolaunch.checkpoint.outputs import ByteProgress
from zerolaunch.checkpoint.reader import CheckpointReader
from zerolaunch.checkpoint.save import resolve_checkpoint
from zerolaunch.checkpoint.tensorfile import SafetensorsWriter, dtype_from_name
from zerolaunch.util.atomic import TMP_PREFIX, publish, remove_path, write_json
from zerolaunch.zero.layout import ParamSpec, plan_layout

_DEFAULT_BUCKET_NUMEL = 500_000_000


def reshard_checkpoint(src, out, world_size: int, *, progress: bool = False, verify: bool = True) -> Path:
    if world_size < 1:
        raise CheckpointError(f"--to-world-size must be >= 1, got {world_size}")

    if find_deepspeed_checkpoint(Path(src)) is not None:
        raise CheckpointError(
            f"{src} is a DeepSpeed checkpoint: --to-world-size needs a zerolaunch "
            f"checkpoint; start a run from its weights with `model.init_from: {src}` "
            "(any world size), or convert it to model.safetensors without --to-world-size"
        )
    out = Path(out)
    with CheckpointReader(resolve_checkpoint(src), verify=verify) as reader:
        out.parent.mkdir(parents=True, exist_ok=True)
        tmp = out.with_name(f"{TMP_PREFIX}{out.name}")
        remove_path(tmp)
        tmp.mkdir()
        try:
            total_bytes = sum(f.stat().st_size for f in reader.folder.glob("rank_*.safetensors"))
            with ByteProgress(progress, total_bytes, reader.folder.name) as bar:
                _write(reader, tmp, world_size, bar.advance)
        except BaseException:
            remove_path(tmp)
            raise
        publish(tmp, out)
    return out


def _write(reader: CheckpointReader, tmp: Path, world_size: int, advance) -> None:
    m = reader.manifest
    trainable = [p for p in m.params if p.trainable]
    layout = plan_layout(
        [ParamSpec(p.name, p.shape) for p in trainable], world_size, m.bucket_numel or _DEFAULT_BUCKET_NUMEL
    )
    sharded_frozen = [p for p in m.params if not p.trainable and reader.holds_sharded_frozen(p.name)]
    frozen_layout = plan_layout(
        [ParamSpec(p.name, p.shape) for p in sharded_frozen],
        world_size,
        m.bucket_numel or _DEFAULT_BUCKET_NUMEL,
    )
    frozen_dtype = {p.name: dtype_from_name(p.dtype) for p in sharded_frozen}
    ranks = []
    for r in range(world_size):
        fragments = layout.owned_fragments(r)
        entries, sources = [], []
        for f in fragments:
            for kind in m.kinds:
                numel = 1 if reader.is_scalar(kind, f.name) else f.numel
                entries.append((fragment_key(kind, f.name, f.start), (numel,), torch.float32))
                sources.append((kind, f.name, f.start, f.stop))
        frozen_fragments = frozen_layout.owned_fragments(r)
        for f in frozen_fragments:
            entries.append((f"frozen/{f.name}/{f.start}", (f.numel,), frozen_dtype[f.name]))
            sources.append(("frozen", f.name, f.start, f.stop))
        if r == 0:
            for rep in m.replicated:
                entries.append((f"replicated/{rep.name}", rep.shape, dtype_from_name(rep.dtype)))
                sources.append(("replicated", rep.name))
        old = r if r < m.world_size else 0
        extra = reader.extra(old)
        extra_json, extra_tensors = encode_extra(extra)
        for key, t in extra_tensors.items():
            entries.append((key, tuple(t.shape), t.dtype))
            sources.append(("extra", key, t))
        path = tmp / rank_file_name(r)
        writer = SafetensorsWriter(path, entries, metadata={"format": "pt", "zerolaunch_rank": str(r)})
        try:
            for (key, _, _), source in zip(entries, sources, strict=True):
                if source[0] == "replicated":
                    tensor = reader.replicated(source[1])
                elif source[0] == "extra":
                    tensor = source[2]
                elif source[0] == "frozen":
                    tensor = reader.read_frozen(*source[1:])
                else:
                    tensor = reader.read(*source)
                writer.write(key, tensor)
                advance(tensor.numel() * tensor.element_size())
        except BaseException:
            writer.abort()
            raise
        writer.close()
        ranks.append(
            RankEntry(
                path.name,
                path.stat().st_size,
                tuple((f.name, f.start, f.stop) for f in fragments),
                extra_json,
                tuple(sorted(extra_tensors)),
                writer.checksums(),
                tuple((f.name, f.start, f.stop) for f in frozen_fragments),
            )
        )
    manifest = dataclasses.replace(m, world_size=world_size, ranks=tuple(ranks))
    manifest.check_coverage(tmp)
    write_json(tmp / MANIFEST_NAME, manifest.to_json())
