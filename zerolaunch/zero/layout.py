"""Pure planning of the flat-buffer layout: which parameter lives where, which rank owns which elements.

[Note: layout]
Trainable parameters of one param group are packed, in the order given, into consecutive buckets. A bucket
holds whole parameters (a parameter bigger than `bucket_numel` gets a bucket of its own) and is padded to a
multiple of `world_size * align`; rank r owns slice r of every bucket (Megatron's distributed-optimizer
layout), so one reduce-scatter per bucket hands each rank exactly the gradient elements it owns, and one
all-gather per bucket returns the updated parameters. A rank's fp32 master for a group is the concatenation
of its slices of that group's buckets, in bucket order.

A `Fragment` is the intersection of one parameter with one rank's slice: (param name, element range of the
flattened parameter, where it sits in the rank's shard). Checkpoints are written as fragments, which makes
them independent of world size, bucket size and stage.

No torch here: `estimate-memory` and the checkpoint code use the same arithmetic without allocating.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class ParamSpec:
    name: str
    shape: tuple[int, ...]
    group: int = 0
    """Index of the optimizer param group."""

    @property
    def numel(self) -> int:
        return math.prod(self.shape)


@dataclass(frozen=True)
class ParamSlot:
    name: str
    shape: tuple[int, ...]
    numel: int
    group: int
    bucket: int
    """Index into Layout.buckets."""
    offset: int
    """First element of this parameter inside its bucket."""


@dataclass(frozen=True)
class BucketPlan:
    index: int
    group: int
    group_offset: int
    """First element of the bucket inside its group's flat buffer (padded coordinates)."""
    numel: int
    """Elements of parameters in the bucket."""
    padded_numel: int
    """numel rounded up to a multiple of world_size * align."""
    world_size: int

    @property
    def shard_numel(self) -> int:
        return self.padded_numel // self.world_size

    def shard_range(self, rank: int) -> tuple[int, int]:
        """Element range [start, stop) of this bucket owned by `rank`."""
        return rank * self.shard_numel, (rank + 1) * self.shard_numel


@dataclass(frozen=True)
class Fragment:
    name: str
    start: int
    """First element of the flattened parameter in this fragment."""
    stop: int
    group: int
    shard_offset: int
    """Where the fragment begins in the owning rank's flat shard of that group."""

    @property
    def numel(self) -> int:
        return self.stop - self.start


@dataclass(frozen=True)
class Layout:
    world_size: int
    params: tuple[ParamSlot, ...]
    buckets: tuple[BucketPlan, ...]
    num_groups: int

    def group_buckets(self, group: int) -> list[BucketPlan]:
        return [b for b in self.buckets if b.group == group]

    def group_numel(self, group: int) -> int:
        """Padded elements of a group's flat buffer."""
        return sum(b.padded_numel for b in self.group_buckets(group))

    def shard_numel(self, group: int) -> int:
        """Elements of one rank's shard of a group (equal on every rank)."""
        return sum(b.shard_numel for b in self.group_buckets(group))

    def bucket_shard_offset(self, bucket: BucketPlan) -> int:
        """Where `bucket`'s slice begins inside a rank's flat shard of its group."""
        return sum(b.shard_numel for b in self.group_buckets(bucket.group) if b.index < bucket.index)

    def slots_in(self, bucket: BucketPlan) -> list[ParamSlot]:
        return [p for p in self.params if p.bucket == bucket.index]

    def owned_fragments(self, rank: int) -> list[Fragment]:
        """The parameter pieces that `rank` owns, in shard order."""
        out: list[Fragment] = []
        for bucket in self.buckets:
            lo, hi = bucket.shard_range(rank)
            base = self.bucket_shard_offset(bucket)
            for slot in self.slots_in(bucket):
                a, b = max(lo, slot.offset), min(hi, slot.offset + slot.numel)
                if a < b:
                    out.append(
                        Fragment(slot.name, a - slot.offset, b - slot.offset, slot.group, base + a - lo)
                    )
        return out

    @property
    def padded_numel(self) -> int:
        return sum(b.padded_numel for b in self.buckets)


def plan_layout(specs: Sequence[ParamSpec], world_size: int, bucket_numel: int, align: int = 1) -> Layout:
    """Pack `specs` (in the given order, grouped by `group`) into buckets; see [Note: layout]."""
    if world_size < 1:
        raise ValueError(f"world_size must be >= 1, got {world_size}")
    if bucket_numel < 1:
        raise ValueError(f"bucket_numel must be >= 1, got {bucket_numel}")
    multiple = world_size * max(1, align)
    groups = sorted({s.group for s in specs})
    slots: list[ParamSlot] = []
    buckets: list[BucketPlan] = []
    for g in groups:
        group_offset = 0
        pending: list[ParamSpec] = []
        filled = 0

        def close(g: int = g) -> None:
            nonlocal group_offset, pending, filled
            if not pending:
                return
            index = len(buckets)
            offset = 0
            for s in pending:
                slots.append(ParamSlot(s.name, tuple(s.shape), s.numel, g, index, offset))
                offset += s.numel
            padded = -(-offset // multiple) * multiple
            buckets.append(BucketPlan(index, g, group_offset, offset, padded, world_size))
            group_offset += padded
            pending, filled = [], 0

        for s in (s for s in specs if s.group == g):
            if s.numel == 0:
                continue
            if pending and filled + s.numel > bucket_numel:
                close()
            pending.append(s)
            filled += s.numel
        close()
    return Layout(world_size, tuple(slots), tuple(buckets), len(groups))


@dataclass(frozen=True)
class TensorSpec:
    """One model parameter as the checkpoint sees it (every parameter once; tied names are aliases)."""

    name: str
    shape: tuple[int, ...]
    dtype: str
    """torch dtype name without the prefix: "float32", "bfloat16", "float16"."""
    trainable: bool
    aliases: tuple[str, ...] = ()
