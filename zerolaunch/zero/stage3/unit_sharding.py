"""ZeRO stage 3: parameters, gradients and optimizer state all sharded, parameters gathered just in time.

This module owns `UnitSharding`, the stage-3 strategy of the one `Engine` (sharding.py has the contract):
construction (units from partition.py, one unit materialized at a time by materialize.py, keeping only this
rank's shard), the forward/backward hooks (schedule.py, see [Note: stage-3 schedule]), the step's
publish of updated shards, memory accounting; the checkpoint fragments are fragments.py's. Buffers:
[Note: stage-3 buffers] in unit_buffers.py.

Per rank it holds: the compute-dtype shard of every unit (on the host with `offload_param.device == "cpu"`;
none without any offload, where a unit gathers from its fp32 master: [Note: gather from master]), the fp32
grad shards per param group and, in ../optim/shard_optimizer.py's ShardOptimizer, the fp32 master +
optimizer state (on the host with offload_optimizer cpu, in a swap file with nvme), the resident tensors
(params under `stage3_param_persistence_threshold` -- replicated, their grads averaged by reduce-scatter then
re-gathered after the step, the bytes of an all-reduce --, frozen params under it, buffers), and, only while a
unit runs, that unit's full buffer. Frozen params over the threshold are sharded in their unit, in the
compute dtype, with nothing else ([Note: frozen buckets] in unit_buffers.py). The step walks the master chunk by chunk (one per unit bucket, cut smaller with
cpu offload) and refreshes each chunk's compute-dtype shard, where there is one, as soon as it has stepped.
"""

from __future__ import annotations

from functools import partial

import torch
from torch import nn

from .. import comm, phases, plan
from ..grad_shards import GradShards
from ..layout import ParamSpec
from ..optim import nvme_store, shard_optimizer
from ..optim.shard_optimizer import Chunk, ShardOptimizer, split_chunks
from ..param_groups import collect_aliases, collect_params, optimizer_groups
from ..plan import GradSegment, aliases_gathered, gathers_from_master
from ..sharding import Sharding, StrategyContext, master_start, nbytes
from .fragments import UnitStateMixin
from .materialize import materialize, param_sites, unit_seed
from .partition import partition
from .schedule import Stage3Schedule
from .unit_buffers import UnitFlat


class UnitSharding(UnitStateMixin, Sharding):
    def __init__(
        self, ctx: StrategyContext, model: nn.Module, *, init_fn=None, param_groups: list[dict] | None = None
    ):
        """init_fn(module) initializes a unit built on the meta device (one is materialized at a time);
        param_groups as in FlatSharding."""
        super().__init__(ctx)
        options = self.ctx.options
        zero_options = options.zero
        self.gathers_from_master = gathers_from_master(
            zero_options.offload_optimizer.device, zero_options.offload_param.device
        )
        """No compute-dtype shard: each unit gathers from its fp32 master ([Note: gather from master])."""
        # offload_param nvme: the shards of the units (not the small persistent params) live in a swap file.
        param_nvme = zero_options.offload_param.device == "nvme"
        shard_device = {"cpu": torch.device("cpu"), "nvme": None}.get(
            zero_options.offload_param.device, self.ctx.device
        )
        if self.gathers_from_master:
            shard_device = None  # the unit reads its master's views, attached in _allocate_shards
        self.module = model
        precision = options.precision
        may_alias = aliases_gathered(
            self.ctx.world_size,
            zero_options.offload_param.device,
            self.gathers_from_master,
            precision.dtype,
            precision.master_dtype,
        )
        """[Note: world size 1 aliases] in unit_buffers.py."""

        self.aliases = collect_aliases(model)
        named = dict(collect_params(model))
        group_of = {}
        optimizer_options = options.optimizer
        groups = optimizer_groups(
            list(named.items()), optimizer_options.weight_decay, optimizer_options.decay_1d, param_groups
        )
        for g, grp in enumerate(groups):
            group_of.update(dict.fromkeys(grp["names"], g))
        part = partition(model, zero_options.stage3_units, zero_options.stage3_param_persistence_threshold)
        self.units = part.units

        def make_flat(index, names, resident, frozen_names=()):
            if not names and not frozen_names:
                return None
            specs = [ParamSpec(n, tuple(named[n].shape), group_of[n]) for n in names]
            return UnitFlat(
                index,
                specs,
                frozen_specs=[ParamSpec(n, tuple(named[n].shape)) for n in frozen_names],
                world_size=self.ctx.world_size,
                rank=self.ctx.rank,
                dtype=self.ctx.dtype,
                device=self.ctx.device,
                shard_device=torch.device("cpu") if resident and param_nvme else shard_device,
                resident=resident,
                pin=zero_options.offload_param.pin_memory,
                may_alias=may_alias,
            )

        self.flats = [
            make_flat(u.index, [n for n, _ in u.params], False, [n for n, _ in u.frozen]) for u in part.units
        ]
        self.flats.append(make_flat(len(part.units), [n for n, _ in part.persistent], True))
        self._flat_of = {n: k for k, f in enumerate(self.flats) if f is not None for n in f.slots}
        self.param_swap: nvme_store.SwapStore | None = None
        """offload_param nvme: every unit's compute-dtype shard, one chunk per unit."""
        if param_nvme:  # nvme_path given: zero/option_rules.py
            swapped = [f for f in self.flats if f is not None and f.shard is None]
            self.param_swap = nvme_store.SwapStore(
                zero_options.offload_param.nvme_path,
                [f.shard_numel for f in swapped],
                ("param",),
                0,
                rank=self.ctx.rank,
                pin=zero_options.offload_param.pin_memory,
                dtype=self.ctx.dtype,
                option="offload_param",
            )
            for c, flat in enumerate(swapped):
                flat.attach_swap(self.param_swap, c)
        self.num_groups = len(groups)
        self._allocate_shards(groups)
        # the units' views into the grad shards are taken: free them while the units are built, where they
        # would sit beside each unit's full init buffer (1/N of the model in fp32, for nothing)
        self.grad_shards.release()
        self._materialize(part, named, init_fn)

        self.named_params = dict(collect_params(model))
        self.frozen_params = [(n, self.named_params[n]) for n, _ in part.frozen]
        """The resident frozen params (replicated_state); the others are sharded in their units."""
        self.model_buffers = list(model.named_buffers())
        unit_params = [[(n, self.named_params[n]) for n, _ in u.params] for u in part.units]
        unit_params.append([(n, self.named_params[n]) for n, _ in part.persistent])
        self.schedule = Stage3Schedule(
            self.flats,
            [u.module for u in part.units] + [None],
            unit_params,
            self.ctx.comm,
            comm_dtype=self.ctx.comm_dtype,
            prefetch_numel=zero_options.stage3_prefetch_bucket_size,
            max_live_numel=zero_options.stage3_max_live_parameters,
            max_reuse_numel=zero_options.stage3_max_reuse_distance,
            stats=self.ctx.stats,
            # the norm's sum of squares is taken on the device from each unit's reduced grads when they
            # are the window's final values and would otherwise be summed again on the host.
            track_grad_sq=zero_options.offload_optimizer.device != "none"
            and options.gradient_accumulation_steps == 1,
            grad_shards=self.grad_shards,
            direct=self._accumulates_directly(options),
            sum_on_device=plan.sums_window_on_device(
                zero_options.offload_optimizer.device, options.gradient_accumulation_steps
            ),
            hook_free=self._forward_without_hooks(),
        )
        self.grad_shards.release()  # not held before the first backward either

    def _forward_without_hooks(self) -> bool:
        """Every unit aliases its source or is resident (every param under stage3_param_persistence_threshold),
        so none needs gathering in the forward ([Note: hook-free forward] in schedule.py). A method: tests
        force the hooks to check the schedule at world size 1."""
        return all(f.aliases_source or f.resident for f in self.flats if f is not None)

    @property
    def forward_hooks_free(self) -> bool:
        return self.schedule.forward_hooks_free

    # ---- construction --------------------------------------------------------------------------------------
    def _allocate_shards(self, groups: list[dict]) -> None:
        """Per param group one fp32 grad shard and (shard_optimizer) master + optimizer state: the
        concatenation of every unit bucket's shard. One grad segment and one step chunk per unit bucket (the
        chunk cut smaller for a cpu-offloaded step)."""
        zero_options = self.ctx.options.zero
        cursor = [0] * self.num_groups
        self._bucket_refs: list[tuple[UnitFlat, int]] = []
        """(unit, bucket) of each step chunk's `owner` index."""
        pieces = []
        for flat in self.flats:
            if flat is None:
                continue
            flat.place_in_master(cursor)
            for i, b in enumerate(flat.buckets[: flat.n_trainable_buckets]):
                pieces.append(
                    Chunk(b.group, flat.master_offsets[i], b.shard_numel, owner=len(self._bucket_refs))
                )
                self._bucket_refs.append((flat, i))
        # on the compute device each unit bucket's grad shard is allocated by its first reduce of a window
        # and freed after the step ([Note: released grad shards] in ../grad_shards.py)
        direct = self._accumulates_directly(self.ctx.options)
        self.grad_shards = GradShards(
            cursor,
            [GradSegment(p.group, p.offset, p.numel, p.owner) for p in pieces],
            self.ctx.master_device,
            pin=zero_options.offload_optimizer.pin_memory,
            releasable=zero_options.offload_optimizer.device == "none",
            compute_dtype=self._compute_grad_dtype(direct),
        )
        self.shards = ShardOptimizer(
            self.ctx.options.optimizer,
            zero_options.offload_optimizer,
            cursor,
            groups,
            split_chunks(
                pieces,
                shard_optimizer.HOST_CHUNK_NUMEL if zero_options.offload_optimizer.device == "cpu" else None,
            ),
            device=self.ctx.master_device,
            rank=self.ctx.rank,
            fused_step=self.ctx.options.optimizer.fused_step,  # steps only: publishing stays a copy of its own
            master_dtype=self.ctx.master_dtype,
        )
        """fp32 master + optimizer state of this rank's shards (on the device, the host or nvme); under nvme
        construction writes each unit's master straight to the swap file, never holding all of it."""
        for flat in self.flats:
            if flat is None:
                continue
            flat.attach_grad_shards(self.grad_shards, per_param=direct)
            if self.gathers_from_master:  # views into the device-resident master (offload_optimizer none)
                flat.attach_master(
                    [
                        self.shards.read("master", b.group, flat.master_offsets[i], b.shard_numel)
                        for i, b in enumerate(flat.buckets[: flat.n_trainable_buckets])
                    ]
                )

    def _write_master_start(self, flat: UnitFlat, i: int, start: int, values: torch.Tensor) -> None:
        """Elements [start, start + n) of unit bucket i's master shard <- the initial values, rounded through
        the compute dtype as stages 0-2's master is (sharding.master_start)."""
        group = flat.buckets[i].group
        self.shards.write(
            "master", group, flat.master_offsets[i] + start, master_start(values.float(), self.ctx.dtype)
        )

    def close(self) -> None:
        """Release the nvme swap files now (they are also removed at garbage collection and at exit)."""
        self.shards.close()
        if self.param_swap is not None:
            self.param_swap.close()

    @torch.no_grad()
    def _materialize(self, part, named: dict[str, nn.Parameter], init_fn) -> None:
        """One unit at a time: real fp32 values of the unit's size -> this rank's shard + master (both the values
        in the compute dtype: _write_master_start), dropped."""
        seed = torch.tensor([torch.initial_seed() % (2**62)], dtype=torch.int64, device=self.ctx.device)
        comm.broadcast(seed, 0, self.ctx.group, stats=self.ctx.stats)  # every rank inits with rank 0's seed
        base_seed = int(seed.item())
        sites = param_sites(self.module)
        # a list, not a set: every rank must broadcast in the same order (str hashes differ per process).
        resident = [n for n, _ in part.persistent + part.frozen]
        self.init_peak_numel = 0
        """Largest number of sharded-param elements materialized at once during construction."""
        for unit in part.units:  # the root first: later units' tensors are still meta while its init runs
            flat = self.flats[unit.index]
            init32 = torch.zeros(
                flat.padded_numel if flat else 0, dtype=torch.float32, device=self.ctx.device
            )
            self.init_peak_numel = max(self.init_peak_numel, init32.numel())
            sharded = {n: flat.param_view(init32, n) for n, _ in unit.params + unit.frozen} if flat else {}
            homed = [n for n in resident if part.home_unit[n] == unit.index]
            tied_here = tuple(
                n
                for n, k in part.init_unit.items()
                if k == unit.index != part.home_unit[n] and n in self._flat_of
            )
            had_meta, delivered = materialize(
                unit,
                sites,
                sharded,
                homed,
                named_params=named,
                device=self.ctx.device,
                seed=unit_seed(base_seed, unit.index),
                init_fn=init_fn,
                deliver=tied_here,
            )
            for name, value in delivered.items():  # the owner (root) is sharded already: write its slices
                owner = self.flats[self._flat_of[name]]
                owner.write_owned(name, value.float(), partial(self._write_master_start, owner))
            if flat is None:
                continue
            if not had_meta:  # real weights from a builder: rank 0's win (ranks may have seeded differently)
                comm.broadcast(init32, 0, self.ctx.group, stats=self.ctx.stats)
            self._adopt(flat, init32, named)
        for name in resident:
            p = named[name]
            comm.broadcast(p.data, 0, self.ctx.group, stats=self.ctx.stats)
        for _, b in self.module.named_buffers():
            comm.broadcast(b, 0, self.ctx.group, stats=self.ctx.stats)
        pflat = self.flats[-1]
        if pflat is not None:
            init32 = torch.zeros(pflat.padded_numel, dtype=torch.float32, device=self.ctx.device)
            for name in pflat.slots:
                pflat.param_view(init32, name).copy_(named[name].detach())
            self._adopt(pflat, init32, named)
        if self.ctx.dtype != torch.float32:
            for _, p in collect_params(self.module):
                if not p.requires_grad and p.is_floating_point():
                    p.data = p.data.to(self.ctx.dtype)
            for module in self.module.modules():
                for key, b in module._buffers.items():
                    if b is not None and b.is_floating_point():
                        module._buffers[key] = b.to(self.ctx.dtype)

    def _adopt(self, flat: UnitFlat, init32: torch.Tensor, named: dict[str, nn.Parameter]) -> None:
        """shard + master <- this rank's slices of init32; params become views of the unit's full buffer
        (whose storage stays freed until the unit first runs, except for the resident unit)."""
        for i in range(len(flat.buckets)):
            owned = flat.bucket_owned(init32, i)
            flat.write_shard(flat.shard_offsets[i], owned)
            if not flat.is_frozen_bucket(i):
                self._write_master_start(flat, i, 0, owned)
        # views can only be taken of allocated storage; they stay valid while it is freed again.
        flat.full.untyped_storage().resize_(flat.full_nbytes)
        if flat.resident:
            flat.full.copy_(init32)
        flat.adopt_params(named)

    # ---- training step -------------------------------------------------------------------------------------
    def begin_forward(self) -> None:
        self.schedule.begin_forward()

    def end_forward(self) -> None:
        self.schedule.end_forward()

    def open_forward(self) -> bool:
        return self.schedule.open_forward()

    def begin_backward(self, window_ends: bool = True) -> None:
        self.schedule.begin_backward(window_ends)

    def abort_backward(self) -> None:
        self.schedule.abort_backward()

    def finish_backward(self) -> None:
        """Units reduce-scatter as they finish; wait for the last ones."""
        self.schedule.finish_backward()

    def discard_window(self) -> None:
        self.schedule.discard_window()
        self._drop_param_grads()
        self.grad_shards.release()

    def finish_window(self, loss_nonfinite: torch.Tensor | None, backwards: int):
        pipeline = self.schedule.pipeline
        if pipeline.sum_on_device:
            # [Note: device-summed window]: the sums are the window's grads whatever its number of backwards
            pipeline.flush()
            window_sq = pipeline.window_grad_sq()
            self._await_host_grads()
            self.grad_shards.zero_unwritten()
            return window_sq, loss_nonfinite
        self._await_host_grads()
        self.grad_shards.zero_unwritten()  # segments no grad reached in this window (e.g. no backward)
        device_sq = self.schedule.take_grad_sq()
        # summed per unit reduce, i.e. per backward (asked for at accumulation 1 only): the window's norm
        # only when the window is one backward; a caller-set boundary can make it several.
        return (device_sq if backwards == 1 else None), loss_nonfinite

    def reset_accumulation(self) -> None:
        # the next window's first reduce-scatter of each unit overwrites its grad shard: no zeroing pass.
        self.schedule.reset_accumulation()

    @torch.no_grad()
    def step_and_publish(self, grad_multiplier: torch.Tensor | None, lr: float) -> None:
        """Step the shards chunk by chunk, each stepped chunk cast into the unit's compute-dtype shard at
        once (host->device without blocking when pinned: [Note: offload pipeline]; nothing to write when the
        units gather from the master); then the resident unit re-gathers its full buffer."""

        def on_stepped(c: int, master: torch.Tensor) -> None:
            chunk = self.shards.chunks[c]
            flat, i = self._bucket_refs[chunk.owner]
            with phases.phase(phases.PUBLISH):
                flat.write_shard(
                    flat.shard_offsets[i] + chunk.owner_offset,
                    master,
                    non_blocking=self.shards.copy_may_overlap(master),
                )

        self.shards.step(self.grad_shards, lr, on_stepped, grad_multiplier=grad_multiplier)
        with phases.phase(phases.PUBLISH):
            for flat in self.flats:
                if flat is not None:
                    flat.regather_resident(self.ctx.group, stats=self.ctx.stats)

    # ---- accounting ----------------------------------------------------------------------------------------
    def memory_bytes(self) -> dict[str, int]:
        flats = [f for f in self.flats if f is not None]
        out = {
            "params": sum(f.shard_bytes_in_memory + f.full_bytes_alive for f in flats)
            + nbytes([p for _, p in self.frozen_params]),
            "grads": self.grad_shards.capacity_bytes + self.schedule.pipeline.device_sum_bytes,
            "buckets": self.schedule.staging_bytes,
        }
        # under nvme "optimizer" is the host staging buffers and "nvme" the bytes on disk.
        out.update(self.shards.memory_bytes())
        if self.param_swap is not None:
            out["nvme"] = out.get("nvme", 0) + self.param_swap.file_bytes
        return out
