"""The checkpoint fragments of the stage 3 sharding (unit_sharding.UnitSharding), as a mixin.

This module owns what a checkpoint reads from and writes into the units: the fragments this rank owns
(every unit's buckets, with offsets into the per-group fp32 master, [Note: layout]), their master +
optimizer state, and the streamed full params (one unit gathered at a time:
`stage3_gather_16bit_weights_on_model_save`). Everything but `full_params` is collective-free. The
tensors themselves are built by unit_sharding.py; this module only reads and fills them. The engine meta and
the replicated tensors are ../engine_state.py's, shared by both strategies.
"""

from __future__ import annotations

import torch

from .. import comm
from ..layout import Fragment
from .unit_buffers import UnitFlat


class UnitStateMixin:
    def owned_fragments(self) -> list[Fragment]:
        return [frag for f in self.flats if f is not None for frag in f.fragments()]

    @torch.no_grad()
    def load_fragment_state(self, read) -> None:
        """read(kind, name, start, stop) -> flat fp32 tensor: the owned master + optimizer state, then every
        unit's shard from the master (where it keeps one: [Note: gather from master]); resident params read
        whole (no collective)."""
        self._load_fragments(read, self.owned_fragments())
        for flat in self.flats:
            if flat is None:
                continue
            for i in flat.trainable_buckets:
                flat.write_shard(flat.shard_offsets[i], self._bucket_master(flat, i))
            if flat.resident and not flat.aliases_source:  # an aliased unit views the loaded master
                for name, slot in flat.trainable_slots.items():
                    full = read("master", name, 0, slot.numel)
                    flat.param_view(flat.full, name).copy_(full.reshape(slot.shape))

    def frozen_fragments(self) -> list[Fragment]:
        """This rank's fragments of the sharded frozen params ([Note: frozen buckets] in unit_buffers.py):
        the checkpoint saves them from every rank, once, like the trainable fragments."""
        return [frag for f in self.flats if f is not None for frag in f.frozen_fragments()]

    def frozen_fragment_state(self) -> dict[str, torch.Tensor]:
        """{f"{name}/{start}": this rank's elements of that frozen param, in the compute dtype} (copies)."""
        out = {}
        for flat in self.flats:
            if flat is None or not flat.frozen_buckets:
                continue
            stored = flat.read_shard()
            base = flat.shard_base
            for frag in flat.frozen_fragments():
                lo = frag.shard_offset - base
                out[f"{frag.name}/{frag.start}"] = stored[lo : lo + frag.numel].clone()
        return out

    @torch.no_grad()
    def load_frozen_state(self, read_frozen) -> None:
        """read_frozen(name, start, stop) -> flat tensor, or None to keep the current values (a param the
        checkpoint left out): this rank's elements of every sharded frozen param (no collective)."""
        for flat in self.flats:
            if flat is None:
                continue
            for frag in flat.frozen_fragments():
                values = read_frozen(frag.name, frag.start, frag.stop)
                if values is not None:
                    flat.write_shard(frag.shard_offset, values.to(self.ctx.device))

    @torch.no_grad()
    def full_params(self, dtype: torch.dtype | None = None):
        """Streamed: one unit is gathered at a time (stage3_gather_16bit_weights_on_model_save). dtype=fp32
        from a 16-bit model gathers the fp32 master instead, so the values are the exact optimizer weights."""
        from_master = dtype == torch.float32 and self.ctx.dtype != torch.float32
        current: tuple[int, torch.Tensor] | None = None
        for name, p in self.named_params.items():
            k = self._flat_of.get(name)
            if k is None:
                t = p.detach()
                yield name, t if dtype is None or not t.is_floating_point() else t.to(dtype)
                continue
            flat = self.flats[k]
            if current is None or current[0] != k:
                current = (k, self._gather_for_save(flat, from_master))
            t = flat.param_view(current[1], name).clone()
            yield name, t if dtype is None else t.to(dtype)

    def _bucket_master(self, flat: UnitFlat, i: int) -> torch.Tensor:
        """The fp32 master of bucket i of `flat` (a copy read from the swap file under nvme)."""
        bucket = flat.buckets[i]
        return self.shards.read("master", bucket.group, flat.master_offsets[i], bucket.shard_numel)

    def _gather_for_save(self, flat: UnitFlat, from_master: bool) -> torch.Tensor:
        """A standalone full copy of the unit (compute dtype, or the fp32 master). A unit without a shard
        gathers its master, which comm casts to the compute dtype ([Note: gather from master])."""
        stored = flat.read_shard()
        stored = None if stored is None else stored.to(self.ctx.device)
        sources = [
            flat.stored_bucket_shard(stored, i)
            if flat.is_frozen_bucket(i) or not (from_master or flat.gathers_from_master)
            else self._bucket_master(flat, i).to(self.ctx.device)
            for i in range(len(flat.buckets))
        ]
        dtype = torch.float32 if from_master else self.ctx.dtype
        out = torch.empty(flat.padded_numel, dtype=dtype, device=self.ctx.device)
        for i, src in enumerate(sources):
            comm.all_gather(flat.bucket_full(out, i), src, self.ctx.group, stats=self.ctx.stats)
        return out
