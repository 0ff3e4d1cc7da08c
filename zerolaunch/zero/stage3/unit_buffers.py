"""One stage 3 unit's tensors: the full compute-dtype buffer, this rank's shard, and their collectives.

[Note: stage-3 buffers]
A unit's trainable parameters are laid out with layout.plan_layout, one bucket per param group (decay /
no decay), each padded to a multiple of world_size; the unit's flat buffer is the concatenation of its
buckets, and every parameter's `.data` is a view into it while the unit is gathered. Between uses the
buffer's *storage* is resized to 0 bytes ("freed") and resized back before an all-gather refills it
(FSDP's trick): tensors autograd saved in forward (views such as `weight.t()`) keep pointing at the same
storage, so they read the re-gathered values in backward without any patching of torch functions. While
freed, each parameter's `.data` is a zero-stride placeholder of its shape (reads give zeros, never freed
memory); gathering points it back at its view (set_data keeps the version counter autograd checks).
This rank keeps only its slice of every bucket (the shard, compute dtype; on the host when the params are
offloaded; none when it gathers from the master, below), plus its fp32 grad shard (`grad_views` point into
the engine's per-group flat grads) and its fp32 master and optimizer state (the engine's ShardOptimizer, at
`master_offsets`).

[Note: frozen buckets]
A unit's frozen params (requires_grad False: a LoRA base, a reference model) sit in the same flat buffer,
in one bucket of their own after the trainable ones (group FROZEN_GROUP), so one all-gather brings the whole
unit and one free releases it. They have a shard like the trainable buckets (compute dtype, offloaded with
the params, in the swap file under nvme), but no grad, no staging, no master and no optimizer state: the
reduce-scatter covers the trainable buckets only (a prefix of the buffer), and `place_in_master`,
`attach_grad_shards` and `fragments` skip the frozen bucket. Where the unit gathers from its master, the
frozen bucket still keeps a compute-dtype shard of its own (it has no master), on the compute device.

Gradients are unit.py's `Stage3Unit`: each parameter's full gradient is copied into a staging buffer (comm
dtype, the trainable buckets' padded size, zeroed so padding and grads missing this micro-step count as
zero) as soon as it is ready, and dropped; once the unit is issued, one reduce-scatter averages every
trainable bucket into the fp32 grad shard (`grad_views`).

On CUDA the all-gathers (with the copy of an offloaded shard to the device) and the reduce-scatters run on
side streams with comm.py's waits ([Note: comm streams]): each waits for the compute stream before the
unit's collectives are issued, and the compute stream waits for it in `wait_gathered()` / the reduce pipeline's wait (../reduce.py).
Inputs stay alive by reference until then (no record_stream).

[Note: gather from master]
With the fp32 master on the compute device and no param offload (plan.gathers_from_master), a unit keeps no
compute-dtype shard: it would only ever be the cast of the master (at init, after every step, at a
checkpoint load), so the gather reads the master instead, as FSDP2 does (its sharded fp32 param is the
master, cast into a transient all-gather input). `attach_master` hands the unit its buckets' master views
(one per bucket: the buckets' masters live in their param groups' flat masters, not back to back), and
`gather` issues one comm.all_gather per bucket with the fp32 view as input. comm casts on the gather
stream, after that stream waited for the compute stream where the step wrote the master: at world size 1
straight into the full buffer, above it into a compute-dtype buffer of the bucket's shard size that the
Pending keeps alive until `wait_gathered()` (none in fp32: the master view itself is the input). Nothing is
written after a step (`write_shard` does nothing); the resident unit still re-gathers. Saves the shard's
bytes: 2 per param / world in bf16.

[Note: world size 1 aliases]
At world size 1 a bucket's shard is the whole bucket, so where every bucket's source (the master view, or
the shard) is on the compute device in the compute dtype, the gathered values ARE the source: no all-gather,
no copy. Such a unit (`aliases_source`) takes each param's view straight onto its source's storage; gather
points the params at those views, free points them back at the placeholders (it never frees the source), and
the full buffer stays 0 bytes. Writes into the source (the step into the master, a checkpoint load, a
shard written on the compute device) are what the next gather shows, as a re-gather would have. Where a
bucket's source is elsewhere (an offloaded or swapped shard: a real host->device copy) or of another dtype
(an fp32 master under a 16-bit model: a cast), the unit keeps the full buffer and gathers as above.
"""

from __future__ import annotations

import enum

import torch

from .. import comm, host_pinning, phases, placement
from ..grad_shards import GradShards, GradSlice
from ..layout import Fragment, ParamSpec
from ..optim.nvme_store import SwapStore
from ..plan import unit_layout

FROZEN_GROUP = 2**31 - 1
"""The group of a unit's frozen bucket ([Note: frozen buckets]): above every optimizer group, so the layout
puts it after the trainable buckets."""


class UnitState(enum.Enum):
    """Whether a unit's full buffer exists (`UnitFlat.state`; a resident unit stays GATHERED)."""

    SHARDED = enum.auto()
    """The full buffer's storage is 0 bytes: this rank holds only its shard, and every param's `.data` is a
    zero-stride placeholder of its shape. `gather()` starts the way out. (A resident unit passes through it
    only inside `regather_resident`, its storage kept, so that gather() refills it in place.)"""
    GATHERED = enum.auto()
    """The full buffer is allocated and every param's `.data` is its view into it. From `gather()` on; an
    all-gather may still be writing into it until `wait_gathered()`, after which the compute stream may
    read it. `free()` (or a resident unit's regather) goes back to SHARDED."""


class UnitFlat:
    def __init__(
        self,
        index: int,
        specs: list[ParamSpec],
        *,
        world_size: int,
        rank: int,
        dtype: torch.dtype,
        device: torch.device,
        shard_device: torch.device | None,
        pin: bool,
        resident: bool,
        frozen_specs: list[ParamSpec] = (),
        may_alias: bool = False,
    ):
        """specs: the trainable params; frozen_specs: the frozen ones ([Note: frozen buckets]).
        shard_device: where this rank's compute-dtype shard lives; None = no shard in memory: in a swap
        file, attached with `attach_swap` (offload_param nvme), or the master's, `attach_master`.
        may_alias: plan.aliases_gathered ([Note: world size 1 aliases]; adopt_params still checks the tensors)."""
        self.index = index
        self.rank = rank
        self.world_size = world_size
        self.dtype = dtype
        self.device = device
        self.resident = resident
        """Resident units (the persistent params) are gathered once and never freed."""
        frozen = [ParamSpec(s.name, s.shape, FROZEN_GROUP) for s in frozen_specs]
        self.layout = unit_layout([*specs, *frozen], world_size)
        self.buckets = list(self.layout.buckets)
        self.n_trainable_buckets = sum(b.group != FROZEN_GROUP for b in self.buckets)
        """The trainable buckets come first; the frozen one (if any) after them."""
        self.bucket_offsets: list[int] = []
        self.shard_offsets: list[int] = []
        full_off = shard_off = 0
        for b in self.buckets:
            self.bucket_offsets.append(full_off)
            self.shard_offsets.append(shard_off)
            full_off += b.padded_numel
            shard_off += b.shard_numel
        self.padded_numel = full_off
        self.shard_numel = shard_off
        n = self.n_trainable_buckets
        self.train_padded_numel = sum(b.padded_numel for b in self.buckets[:n])
        """Elements of the trainable buckets: the prefix of the buffer that grads are staged and reduced in."""
        self.train_shard_numel = sum(b.shard_numel for b in self.buckets[:n])
        self.numel = sum(s.numel for s in [*specs, *frozen])
        self.slots = {s.name: s for s in self.layout.params}
        self.trainable_slots = {s.name: s for s in self.layout.params if s.group != FROZEN_GROUP}
        self.full = torch.empty(self.padded_numel, dtype=dtype, device=device)
        self.full_nbytes = self.full.untyped_storage().nbytes()
        self.state = UnitState.GATHERED
        if not resident:  # allocated only while the unit runs; views into it stay valid while freed
            self.full.untyped_storage().resize_(0)
            self.state = UnitState.SHARDED
        self._pin = pin
        self.shard: torch.Tensor | None = None
        """The resident shard (None while it lives in a swap file: read_shard / write_shard, or when the unit
        gathers from the master; then only the frozen buckets' shard, from `shard_base` on)."""
        self.shard_base = 0
        """Where `shard` starts in this rank's shard of the whole unit (the frozen buckets' start when the
        trainable ones gather from the master)."""
        if shard_device is not None:
            # exact size when pinned: held all run, a power-of-two block would waste up to half of it
            self.shard = host_pinning.zeros(self.shard_numel, shard_device, pin=pin, dtype=dtype)
        self._swap: tuple[SwapStore, int] | None = None
        self._master: list[torch.Tensor] | None = None
        """Each bucket's fp32 master view when the unit gathers from it ([Note: gather from master])."""
        self._zero = torch.zeros((), dtype=dtype, device=device)
        self._params: list[tuple[torch.nn.Parameter, torch.Tensor]] = []
        """(param, its view into the full buffer, or into its source when `aliases_source`), set by
        adopt_params."""
        self._may_alias = may_alias
        self.aliases_source = False
        """World size 1 with every bucket's source on the compute device in its dtype: params view the
        sources, the full buffer is never allocated ([Note: world size 1 aliases]); set by adopt_params."""
        self.stays_gathered = False
        """An aliased unit gathered for good (`stay_gathered`): free() leaves its params on their views."""
        self._pending: list[comm.Pending] = []
        """The all-gathers of the last gather() until wait_gathered()."""
        self.grad_views: list[torch.Tensor] = []
        self.grad_segments: list[int] = []
        """The GradShards segment of each bucket's grad view (allocated before a reduced grad is written)."""
        self.grad_slices: dict[str, GradSlice] = {}
        """World size 1: each param's slice of the grad shard, written by the direct path through GradShards."""
        self.master_offsets: list[int] = []
        """Where each bucket's shard starts inside the engine's fp32 master of the bucket's group."""

    # ---- views -------------------------------------------------------------------------------------------
    def param_view(self, flat: torch.Tensor, name: str) -> torch.Tensor:
        slot = self.slots[name]
        start = self.bucket_offsets[slot.bucket] + slot.offset
        return flat[start : start + slot.numel].view(slot.shape)

    def bucket_full(self, flat: torch.Tensor, i: int) -> torch.Tensor:
        return flat[self.bucket_offsets[i] : self.bucket_offsets[i] + self.buckets[i].padded_numel]

    def bucket_owned(self, flat: torch.Tensor, i: int) -> torch.Tensor:
        """The slice of bucket i that this rank owns, inside a full-size flat (params, fp32 init values)."""
        lo, hi = self.buckets[i].shard_range(self.rank)
        return self.bucket_full(flat, i)[lo:hi]

    def bucket_shard(self, shard: torch.Tensor, i: int) -> torch.Tensor:
        return shard[self.shard_offsets[i] : self.shard_offsets[i] + self.buckets[i].shard_numel]

    def stored_bucket_shard(self, stored: torch.Tensor, i: int) -> torch.Tensor:
        """Bucket i's shard inside what `read_shard()` returned (which starts at `shard_base`)."""
        start = self.shard_offsets[i] - self.shard_base
        return stored[start : start + self.buckets[i].shard_numel]

    def is_frozen_bucket(self, i: int) -> bool:
        return i >= self.n_trainable_buckets

    @property
    def trainable_buckets(self) -> range:
        return range(self.n_trainable_buckets)

    @property
    def frozen_buckets(self) -> range:
        return range(self.n_trainable_buckets, len(self.buckets))

    # ---- where this unit's shards sit in the per-group master and grad shards --------------------------
    def place_in_master(self, cursor: list[int]) -> None:
        """Each bucket's shard goes at `cursor[group]` of its group's fp32 master (and grad shard), which
        advances past it."""
        self.master_offsets = []
        for b in self.buckets[: self.n_trainable_buckets]:  # the frozen bucket has no master
            self.master_offsets.append(cursor[b.group])
            cursor[b.group] += b.shard_numel

    def attach_grad_shards(self, grad_shards: GradShards, *, per_param: bool) -> None:
        """Take this unit's views into the fp32 grad shards (after place_in_master, while the segments are
        held): each bucket's view and segment, and with `per_param` (world size 1, where a bucket's shard is
        the whole bucket: [Note: direct grads] in schedule.py) each param's slice."""
        trainable = self.buckets[: self.n_trainable_buckets]
        self.grad_views = [
            grad_shards.view(b.group, self.master_offsets[i], b.shard_numel) for i, b in enumerate(trainable)
        ]
        self.grad_segments = [
            grad_shards.index_of(b.group, self.master_offsets[i]) for i, b in enumerate(trainable)
        ]
        if per_param:
            self.grad_slices = {
                name: grad_shards.slice(
                    self.buckets[slot.bucket].group,
                    self.master_offsets[slot.bucket] + slot.offset,
                    slot.numel,
                )
                for name, slot in self.trainable_slots.items()
            }

    # ---- this rank's shard, resident or swapped ------------------------------------------------------------
    def attach_swap(self, store: SwapStore, chunk: int) -> None:
        """The shard lives in `store` (kind "param", chunk `chunk`) from now on (offload_param nvme)."""
        self._swap = (store, chunk)
        self.shard = None

    def attach_master(self, views: list[torch.Tensor]) -> None:
        """Gather the trainable buckets from these fp32 master views, one per bucket, and keep no shard of
        them ([Note: gather from master]); the caller keeps the master up to date. The frozen bucket keeps its
        compute-dtype shard, on the compute device ([Note: frozen buckets])."""
        self._master = list(views)
        self.shard_base = self.train_shard_numel
        frozen_numel = self.shard_numel - self.train_shard_numel
        self.shard = torch.zeros(frozen_numel, dtype=self.dtype, device=self.device) if frozen_numel else None

    @property
    def gathers_from_master(self) -> bool:
        return self._master is not None

    def read_shard(self) -> torch.Tensor:
        """This rank's stored compute-dtype shard (from `shard_base`): the resident tensor itself, or a new host copy read from the
        swap file (pinned when asked: blocks come from torch's pinned-memory cache, so a gathered unit's copy
        is recycled once its host->device copy has completed)."""
        if self._swap is None:
            return self.shard
        store, chunk = self._swap
        out = placement.recycled_empty(self.shard_numel, torch.device("cpu"), pin=self._pin, dtype=self.dtype)
        store.read_into("param", chunk, 0, out)
        return out

    @torch.no_grad()
    def write_shard(self, start: int, values: torch.Tensor, *, non_blocking: bool = False) -> None:
        """Shard elements [start, start + values.numel()) <- values (any float dtype; cast). non_blocking: the
        caller guarantees `values` stays unchanged until the device's current stream has passed the copy.
        Nothing to write into a trainable bucket that gathers from the master (the caller writes the
        master)."""
        if self._master is not None:
            if start < self.shard_base:
                return
            start -= self.shard_base
        if self._swap is None:
            self.shard[start : start + values.numel()].copy_(values, non_blocking=non_blocking)
            return
        store, chunk = self._swap
        store.write("param", chunk, start, values)

    @property
    def shard_bytes_in_memory(self) -> int:
        return 0 if self.shard is None else self.shard.numel() * self.shard.element_size()

    def fragments(self) -> list[Fragment]:
        """This rank's fragments of trainable params, with shard offsets into the engine's per-group fp32
        master."""
        return self._fragments(self.trainable_buckets, self.master_offsets)

    def frozen_fragments(self) -> list[Fragment]:
        """This rank's fragments of frozen params, with offsets into this rank's shard of the unit
        (`shard_offset`; group FROZEN_GROUP)."""
        return self._fragments(self.frozen_buckets, self.shard_offsets)

    def _fragments(self, buckets: range, bases: list[int]) -> list[Fragment]:
        out = []
        for i in buckets:
            bucket = self.buckets[i]
            lo, hi = bucket.shard_range(self.rank)
            for slot in self.layout.slots_in(bucket):
                a, b = max(lo, slot.offset), min(hi, slot.offset + slot.numel)
                if a < b:
                    out.append(
                        Fragment(
                            slot.name,
                            a - slot.offset,
                            b - slot.offset,
                            bucket.group,
                            bases[i] + a - lo,
                        )
                    )
        return out

    @torch.no_grad()
    def write_owned(self, name: str, value: torch.Tensor, write_master) -> None:
        """shard + master <- this rank's elements of one full parameter value (fp32);
        write_master(bucket, start inside the bucket's shard, values) writes the master (not called for a
        frozen param, which has none)."""
        slot = self.slots[name]
        lo, hi = self.buckets[slot.bucket].shard_range(self.rank)
        a, b = max(lo, slot.offset), min(hi, slot.offset + slot.numel)
        if a >= b:
            return
        src = value.reshape(-1)[a - slot.offset : b - slot.offset]
        self.write_shard(self.shard_offsets[slot.bucket] + a - lo, src)
        if not self.is_frozen_bucket(slot.bucket):
            write_master(slot.bucket, a - lo, src)

    # ---- gather / free -----------------------------------------------------------------------------------
    @property
    def gathered(self) -> bool:
        """state is GATHERED (the full buffer is allocated; maybe still being written: wait_gathered)."""
        return self.state is UnitState.GATHERED

    @property
    def full_bytes_alive(self) -> int:
        return self.full.untyped_storage().nbytes()

    def free(self) -> None:
        """Release the full buffer's memory (waits for an all-gather still writing into it)."""
        if self.resident or self.stays_gathered or not self.gathered:
            return
        self.wait_gathered()
        if not self.aliases_source:  # an aliased unit's views hold the source itself: never freed
            self.full.untyped_storage().resize_(0)
        self._point_params_at_placeholders()
        self.state = UnitState.SHARDED

    def stay_gathered(self) -> None:
        """Point the params at their views of the source and keep them there: free() does nothing from here
        on. Only for an aliased unit, where gathered costs no memory and no copy ([Note: hook-free forward]
        in schedule.py)."""
        if not self.aliases_source:
            raise ValueError(f"unit {self.index} gathers into a buffer of its own: it cannot stay gathered")
        self._point_params_at_views()
        self.state = UnitState.GATHERED
        self.stays_gathered = True

    def _alias_sources(self) -> list[torch.Tensor] | None:
        """Each bucket's gathered values as they already sit in memory, when the unit can alias them ([Note:
        world size 1 aliases]); None when any bucket needs a collective, a copy or a cast."""
        if not self._may_alias or self.world_size != 1 or self._swap is not None:
            return None
        sources = []
        for i in range(len(self.buckets)):
            if self._master is not None and not self.is_frozen_bucket(i):
                src = self._master[i]
            elif self.shard is not None:
                src = self.stored_bucket_shard(self.shard, i)
            else:
                return None
            # _zero's device, not self.device: "cuda" names no index, the tensors' devices do
            on_device = src.device == self._zero.device
            if src.dtype != self.dtype or not on_device or src.numel() != self.buckets[i].padded_numel:
                return None
            sources.append(src)
        return sources

    def adopt_params(self, params: dict[str, torch.nn.Parameter]) -> None:
        """Make every parameter of the unit a view into the full buffer (which must be allocated now), or into
        its bucket's source ([Note: world size 1 aliases]; after attach_master / attach_swap)."""
        sources = self._alias_sources()
        self.aliases_source = sources is not None
        if sources is None:
            self._params = [(params[name], self.param_view(self.full, name)) for name in self.slots]
        else:
            self._params = [(params[name], self._source_view(sources, name)) for name in self.slots]
            self.full.untyped_storage().resize_(0)
        self._point_params_at_views()
        if not self.resident:
            self.full.untyped_storage().resize_(0)
            self._point_params_at_placeholders()
            self.state = UnitState.SHARDED

    def _source_view(self, sources: list[torch.Tensor], name: str) -> torch.Tensor:
        slot = self.slots[name]
        return sources[slot.bucket][slot.offset : slot.offset + slot.numel].view(slot.shape)

    def _point_params_at_views(self) -> None:
        """Each param shows its view of the full buffer, or of its source where the unit aliases it."""
        for p, view in self._params:
            p.data = view

    def _point_params_at_placeholders(self) -> None:
        # a freed param must never read the released memory (a print or a user's .sum() would crash the
        # process): it shows zeros of its true shape through a zero-stride view of one element, which also
        # refuses in-place writes. Views autograd saved keep the full buffer's storage and stay valid.
        for p, view in self._params:
            p.data = self._zero.expand(view.shape)

    def gather(self, group, *, stream, stats: comm.CommStats) -> None:
        """Start refilling the full buffer from every rank's shard; `wait_gathered()` before reading it."""
        if self.gathered:
            return
        with phases.phase(phases.GATHER):
            self._gather(group, stream=stream, stats=stats)

    def _gather(self, group, *, stream, stats: comm.CommStats) -> None:
        if not self.aliases_source:
            self.full.untyped_storage().resize_(self.full_nbytes)
        self._point_params_at_views()
        self.state = UnitState.GATHERED
        if self.aliases_source:  # the views show the source itself: nothing to move
            return
        fulls = [self.bucket_full(self.full, i) for i in range(len(self.buckets))]
        if self._master is not None:
            # one call per bucket, its fp32 master cast by comm on `stream` ([Note: gather from master]);
            # the frozen bucket from its own shard ([Note: frozen buckets])
            n = self.n_trainable_buckets
            self._pending = [
                comm.all_gather(full, master, group, stats=stats, async_op=True, stream=stream)
                for full, master in zip(fulls[:n], self._master, strict=True)
            ]
            if n < len(fulls):
                self._pending.append(
                    comm.all_gather(fulls[n:], self.shard, group, stats=stats, async_op=True, stream=stream)
                )
            return
        # an offloaded shard is copied to the device by comm.all_gather, on `stream`, ahead of use
        # (non-blocking from pinned memory; a swapped shard is read from its file first). The shard is the
        # buckets' shards back to back, so one call gathers every bucket.
        self._pending = [
            comm.all_gather(fulls, self.read_shard(), group, stats=stats, async_op=True, stream=stream)
        ]

    def wait_gathered(self) -> None:
        """The compute stream may read the full buffer (or free it) from here on."""
        if not self._pending:
            return
        with phases.phase(phases.GATHER_WAIT):
            for pending in self._pending:
                pending.wait()
        self._pending = []

    # ---- after the optimizer step ------------------------------------------------------------------------
    def regather_resident(self, group, *, stats: comm.CommStats) -> None:
        """A resident unit's full buffer <- its updated shards (after every bucket's shard was written).
        Nothing to do where its params view the shards themselves ([Note: world size 1 aliases])."""
        if self.resident and not self.aliases_source:
            self.state = UnitState.SHARDED  # the storage stays allocated; gather() refills it in place
            self.gather(group, stream=None, stats=stats)
            self.wait_gathered()
