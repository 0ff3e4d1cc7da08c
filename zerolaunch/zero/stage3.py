"""ZeRO stage 3: parameters, gradients and optimizer state all sharded, parameters gathered just in time.

This module owns the `Stage3Engine`, which `Engine(...)` returns for `zero.stage == 3`, with the same public
API (docs/ARCHITECTURE.md "The engine"): construction (units from units.py, one unit materialized at a time
by meta_init.py, keeping only this rank's shard), the training step (forward/backward hooks of
stage3_hooks.py, see [Note: stage-3 schedule]; the step itself reuses optim.py, loss_scale.py, sched.py),
memory and comm accounting; the checkpoint contract is stage3_state.py's. Buffers: [Note: stage-3 buffers]
in stage3_flat.py.

Per rank it holds: the compute-dtype shard of every unit (on the host with `offload_param.device == "cpu"`),
the fp32 master + grad shards + optimizer state per param group (on the host with offload_optimizer cpu),
the resident tensors (params under `stage3_param_persistence_threshold` -- replicated, their grads averaged
by reduce-scatter then re-gathered after the step, the bytes of an all-reduce --, frozen params, buffers),
and, only while a unit runs, that unit's full buffer. With offload_optimizer nvme the master + optimizer state
move to nvme.py's swap file after construction (one chunk per unit bucket; during construction the fp32
master is still built in host memory once), and each chunk's shard is refreshed as soon as it has stepped.
"""

from __future__ import annotations

import torch
from torch import nn

from . import comm, nvme, offload
from .engine import DTYPES, StepInfo, validate_options
from .layout import ParamSpec
from .loss_scale import LossScaler
from .meta_init import materialize, param_sites, unit_seed
from .optim import build_optimizer, unscale_check_clip
from .options import EngineOptions
from .param_groups import collect_aliases, collect_params, split_decay_groups
from .sched import LRSchedule
from .stage3_flat import UnitFlat
from .stage3_hooks import Stage3Schedule
from .stage3_state import Stage3StateMixin
from .units import partition


class Stage3Engine(Stage3StateMixin):
    def __init__(
        self,
        model: nn.Module,
        options: EngineOptions,
        group=None,
        device: torch.device = torch.device("cpu"),
        *,
        init_fn=None,
    ):
        validate_options(options)
        z = options.zero
        if z.offload_param.device == "nvme":
            raise ValueError(
                "zero.offload_param.device 'nvme' is not supported; use 'cpu' (offload_optimizer may be nvme)"
            )
        if z.stage3_max_live_parameters < 1:
            raise ValueError(
                f"zero.stage3_max_live_parameters must be >= 1, got {z.stage3_max_live_parameters}"
            )
        self.options = options
        self.group = group
        self.device = torch.device(device)
        self.stage = 3
        self.rank = comm.rank(group)
        self.world_size = comm.world_size(group)
        self.comm_stats = comm.CommStats()
        self.dtype = DTYPES[options.precision.dtype]
        self.comm_dtype = DTYPES[options.precision.communication_dtype or "fp32"]
        self.master_device = offload.master_device(z.offload_optimizer, self.device)
        shard_device = torch.device("cpu") if z.offload_param.device == "cpu" else self.device
        self.module = model

        self._aliases = collect_aliases(model)
        named = dict(collect_params(model))
        group_of = {}
        groups = split_decay_groups(list(named.items()), options.optimizer.weight_decay)
        for g, grp in enumerate(groups):
            group_of.update(dict.fromkeys(grp["names"], g))
        part = partition(model, z.stage3_units, z.stage3_param_persistence_threshold)
        self.units = part.units

        def make_flat(index, names, resident):
            if not names:
                return None
            specs = [ParamSpec(n, tuple(named[n].shape), group_of[n]) for n in names]
            return UnitFlat(
                index,
                specs,
                world_size=self.world_size,
                rank=self.rank,
                dtype=self.dtype,
                device=self.device,
                shard_device=shard_device,
                resident=resident,
                pin=z.offload_param.pin_memory,
            )

        self.flats = [make_flat(u.index, [n for n, _ in u.params], False) for u in part.units]
        self.flats.append(make_flat(len(part.units), [n for n, _ in part.persistent], True))
        self._flat_of = {n: k for k, f in enumerate(self.flats) if f is not None for n in f.slots}
        self.num_groups = len(groups)
        self._allocate_master(z.offload_optimizer.pin_memory)
        self._materialize(part, named, init_fn)

        self._named = dict(collect_params(model))
        self._frozen = [(n, p) for n, p in self._named.items() if not p.requires_grad]
        self._buffers = list(model.named_buffers())
        unit_params = [[(n, self._named[n]) for n, _ in u.params] for u in part.units]
        unit_params.append([(n, self._named[n]) for n, _ in part.persistent])
        self.schedule = Stage3Schedule(
            self.flats,
            [u.module for u in part.units] + [None],
            unit_params,
            group,
            device=self.device,
            comm_dtype=self.comm_dtype,
            prefetch_numel=z.stage3_prefetch_bucket_size,
            max_live_numel=z.stage3_max_live_parameters,
            overlap=z.overlap,
            stats=self.comm_stats,
        )
        self.nvme: nvme.NvmeOptimizer | None = None
        """The swap-file master + optimizer state (offload_optimizer nvme); then `master` is empty."""
        self.optimizer = None
        if z.offload_optimizer.device == "nvme":
            self._spill_to_nvme([grp["weight_decay"] for grp in groups])
        else:
            self.optimizer = build_optimizer(
                options.optimizer,
                [
                    {"params": [m], "weight_decay": grp["weight_decay"]}
                    for m, grp in zip(self.master, groups, strict=True)
                ],
                self.master_device,
            )
        self.scheduler = LRSchedule(options.scheduler, options.optimizer.lr)
        self.scaler = LossScaler(options.precision)
        self.global_steps = 0
        self.micro_steps = 0
        self._lr = self.scheduler.lr_at(0)

    # ---- construction --------------------------------------------------------------------------------------
    def _allocate_master(self, pin: bool) -> None:
        """Per param group one fp32 master + grad shard: the concatenation of every unit bucket's shard."""
        cursor = [0] * self.num_groups
        for flat in self.flats:
            if flat is None:
                continue
            for b in flat.buckets:
                flat.master_offsets.append(cursor[b.group])
                cursor[b.group] += b.shard_numel
        self.master = [offload.zeros(n, self.master_device, pin=pin) for n in cursor]
        self.grad_shards = [offload.zeros(n, self.master_device, pin=pin) for n in cursor]
        for flat in self.flats:
            if flat is None:
                continue
            for i, b in enumerate(flat.buckets):
                sl = slice(flat.master_offsets[i], flat.master_offsets[i] + b.shard_numel)
                flat.master_views.append(self.master[b.group][sl])
                flat.grad_views.append(self.grad_shards[b.group][sl])

    @torch.no_grad()
    def _spill_to_nvme(self, weight_decays: list[float]) -> None:
        """Move the fp32 master into a swap file, one chunk per unit bucket, and free the host copy."""
        self._chunk_of = [
            (flat, i) for flat in self.flats if flat is not None for i in range(len(flat.buckets))
        ]
        chunks = [
            nvme.Chunk(f.buckets[i].group, f.master_offsets[i], f.buckets[i].shard_numel)
            for f, i in self._chunk_of
        ]
        self.nvme = nvme.NvmeOptimizer(
            self.options.optimizer, self.options.zero.offload_optimizer, chunks, weight_decays, rank=self.rank
        )
        self.nvme.initialize(
            lambda c, master: master.copy_(self._chunk_of[c][0].master_views[self._chunk_of[c][1]])
        )
        self.master = []
        for flat in self.flats:
            if flat is not None:
                flat.master_views = []

    def close(self) -> None:
        """Release the nvme swap file now (it is also removed at garbage collection and at exit)."""
        if self.nvme is not None:
            self.nvme.close()

    @torch.no_grad()
    def _materialize(self, part, named: dict[str, nn.Parameter], init_fn) -> None:
        """One unit at a time: real fp32 values of the unit's size -> this rank's shard + master, dropped."""
        seed = torch.tensor([torch.initial_seed() % (2**62)], dtype=torch.int64, device=self.device)
        comm.broadcast(seed, 0, self.group, stats=self.comm_stats)  # every rank inits with rank 0's seed
        base_seed = int(seed.item())
        sites = param_sites(self.module)
        # a list, not a set: every rank must broadcast in the same order (str hashes differ per process).
        resident = [n for n, _ in part.persistent + part.frozen]
        self.init_peak_numel = 0
        """Largest number of sharded-param elements materialized at once during construction."""
        for unit in part.units:  # the root first: later units' tensors are still meta while its init runs
            flat = self.flats[unit.index]
            init32 = torch.zeros(flat.padded_numel if flat else 0, dtype=torch.float32, device=self.device)
            self.init_peak_numel = max(self.init_peak_numel, init32.numel())
            sharded = {n: flat.param_view(init32, n) for n, _ in unit.params} if flat else {}
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
                device=self.device,
                seed=unit_seed(base_seed, unit.index),
                init_fn=init_fn,
                deliver=tied_here,
            )
            for name, value in delivered.items():  # the owner (root) is sharded already: write its slices
                self.flats[self._flat_of[name]].write_owned(name, value.float())
            if flat is None:
                continue
            if not had_meta:  # real weights from a builder: rank 0's win (ranks may have seeded differently)
                comm.broadcast(init32, 0, self.group, stats=self.comm_stats)
            self._adopt(flat, init32, named)
        for name in resident:
            p = named[name]
            comm.broadcast(p.data, 0, self.group, stats=self.comm_stats)
        for _, b in self.module.named_buffers():
            comm.broadcast(b, 0, self.group, stats=self.comm_stats)
        pflat = self.flats[-1]
        if pflat is not None:
            init32 = torch.zeros(pflat.padded_numel, dtype=torch.float32, device=self.device)
            for name in pflat.slots:
                pflat.param_view(init32, name).copy_(named[name].detach())
            self._adopt(pflat, init32, named)
        if self.dtype != torch.float32:
            for _, p in collect_params(self.module):
                if not p.requires_grad and p.is_floating_point():
                    p.data = p.data.to(self.dtype)
            for module in self.module.modules():
                for key, b in module._buffers.items():
                    if b is not None and b.is_floating_point():
                        module._buffers[key] = b.to(self.dtype)

    def _adopt(self, flat: UnitFlat, init32: torch.Tensor, named: dict[str, nn.Parameter]) -> None:
        """shard + master <- this rank's slices of init32; params become views of the unit's full buffer
        (whose storage stays freed until the unit first runs, except for the resident unit)."""
        for i in range(len(flat.buckets)):
            owned = flat.bucket_owned(init32, i)
            flat.bucket_shard(flat.shard, i).copy_(owned)
            flat.master_views[i].copy_(owned)
        # views can only be taken of allocated storage; they stay valid while it is freed again.
        flat.full.untyped_storage().resize_(flat.full_nbytes)
        if flat.resident:
            flat.full.copy_(init32)
        flat.adopt_params(named)

    # ---- training step -------------------------------------------------------------------------------------
    def __call__(self, *args, **kwargs):
        self.schedule.begin_forward()
        try:
            return self.module(*args, **kwargs)
        finally:
            self.schedule.end_forward()

    def backward(self, loss: torch.Tensor) -> None:
        """loss * loss_scale / gradient_accumulation_steps, backward; units reduce-scatter as they finish."""
        if loss.dim() != 0:
            raise ValueError(
                f"engine.backward expects a scalar loss, got shape {tuple(loss.shape)}; "
                "reduce it first (e.g. loss.mean())"
            )
        scale = self.scaler.scale / self.options.gradient_accumulation_steps
        self.schedule.begin_backward()
        try:
            (loss * scale).backward()
        except BaseException:
            self.schedule.in_backward = False
            raise
        self.schedule.finish_backward()

    def step(self) -> StepInfo:
        """Call after every backward; steps the optimizer only at an accumulation boundary."""
        self.micro_steps += 1
        if self.micro_steps % self.options.gradient_accumulation_steps != 0:
            return StepInfo(False, False, None, self.scaler.scale, self._lr)
        offload.sync(self.device)
        loss_scale = self.scaler.scale
        overflow, norm = unscale_check_clip(
            self.grad_shards,
            self.group,
            sharded=True,
            loss_scale=loss_scale,
            fp16=self.scaler.enabled,
            clip_norm=self.options.gradient_clipping,
            comm_device=self.device,
            stats=self.comm_stats,
        )
        skipped = self.scaler.update(overflow)
        if skipped:
            for g in self.grad_shards:
                g.zero_()
            return StepInfo(False, True, float("inf"), loss_scale, self._lr)
        self._lr = self.scheduler.lr_at(self.global_steps)
        if self.nvme is not None:
            self._step_nvme()
            return StepInfo(True, False, float(norm), loss_scale, self._lr)
        for pg, master, grad in zip(self.optimizer.param_groups, self.master, self.grad_shards, strict=True):
            pg["lr"] = self._lr
            master.grad = grad
        self.optimizer.step()
        for master, grad in zip(self.master, self.grad_shards, strict=True):
            master.grad = None
            grad.zero_()
        for flat in self.flats:
            if flat is not None:
                flat.publish(self.group, stats=self.comm_stats)
        self.global_steps += 1
        return StepInfo(True, False, float(norm), loss_scale, self._lr)

    @torch.no_grad()
    def _step_nvme(self) -> None:
        def refresh_shard(c: int, master: torch.Tensor) -> None:
            flat, i = self._chunk_of[c]
            flat.bucket_shard(flat.shard, i).copy_(master)  # cast to the compute dtype

        self.nvme.step(self.grad_shards, self._lr, refresh_shard)
        for grad in self.grad_shards:
            grad.zero_()
        for flat in self.flats:
            if flat is not None:
                flat.regather_resident(self.group, stats=self.comm_stats)
        self.global_steps += 1

    # ---- accounting ----------------------------------------------------------------------------------------
    def memory_bytes(self) -> dict[str, int]:
        """Bytes this rank holds per kind (model states and engine buffers; activations not included)."""

        def nbytes(ts):
            return sum(t.numel() * t.element_size() for t in ts)

        flats = [f for f in self.flats if f is not None]
        out = {
            "params": nbytes([f.shard for f in flats])
            + sum(f.full_bytes_alive for f in flats)
            + nbytes([p for _, p in self._frozen]),
            "grads": nbytes(self.grad_shards),
            "buckets": self.schedule.staging_bytes,
        }
        if self.nvme is not None:
            # host: only the staging buffers (master + state of buffer_count chunks); the rest is on disk.
            return {**out, "optimizer": self.nvme.host_bytes, "master": 0, "nvme": self.nvme.nvme_bytes}
        opt_state = [v for st in self.optimizer.state.values() for v in st.values() if torch.is_tensor(v)]
        return {**out, "optimizer": nbytes(opt_state), "master": nbytes(self.master)}
