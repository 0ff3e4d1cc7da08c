"""ZeRO stages 0, 1 and 2: the flat-bucket sharding strategy of the `Engine` (sharding.py has the contract).

The buffers and gradient buckets are reducer.py's; see [Note: layout].

- Stage 0: every rank holds and steps everything; grads all-reduced per bucket (a plain DDP baseline).
- Stage 1: full grads (param.grad are views into a flat grad buffer) accumulate over micro-steps with no
  communication; at the boundary each bucket is reduce-scattered, each rank steps the slices it owns.
- Stage 2: reduce-scatter per bucket during backward (reducer.BackwardReducer); only the fp32 shard is kept.
- Stages 1/2: updated params return with one all-gather per gradient bucket (DeepSpeed's allgather_bucket_size
  is accepted with no effect: the reduce buckets already bound the message size).
- The fp32 master + optimizer state are ../optim/shard_optimizer.py's (on the device, the host or in an nvme
  swap file); the step walks its chunks and all-gathers each bucket as soon as its last chunk has stepped and
  been sent to the device, so with offload the copies overlap the CPU step ([Note: offload pipeline]).
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import torch
from torch import nn

from .. import comm, phases, plan
from ..grad_shards import GradShards
from ..layout import Fragment, ParamSpec
from ..optim import shard_optimizer
from ..optim.overlapped_step import OverlappedStep
from ..optim.shard_optimizer import Chunk, ShardOptimizer, split_chunks
from ..param_groups import collect_aliases, collect_params, optimizer_groups
from ..sharding import Sharding, StrategyContext, nbytes
from ..weak_hooks import remove_with, weak_partial
from . import reducer
from .full_grads import FullGrads


class FlatSharding(Sharding):
    def __init__(
        self, ctx: StrategyContext, model: nn.Module, *, init_fn=None, param_groups: list[dict] | None = None
    ):
        """param_groups: the client's optimizer groups (param_groups.client_groups); None = the default
        groups of options.optimizer (decay_1d). init_fn is stage 3's (stages 0-2 take built weights)."""
        super().__init__(ctx)
        options = self.ctx.options
        pin = options.zero.offload_optimizer.pin_memory

        self.module = (
            model.to(device=self.ctx.device, dtype=self.ctx.dtype)
            if self.ctx.dtype != torch.float32
            else model.to(device=self.ctx.device)
        )
        named = collect_params(self.module)
        self.named_params = dict(named)
        self.aliases = collect_aliases(self.module)
        self.frozen_params = [(n, p) for n, p in named if not p.requires_grad]
        self.model_buffers = list(self.module.named_buffers())
        optimizer_options = options.optimizer
        self._groups = optimizer_groups(
            named, optimizer_options.weight_decay, optimizer_options.decay_1d, param_groups
        )
        specs = [
            ParamSpec(name, tuple(p.shape), g)
            for g, grp in enumerate(self._groups)
            for name, p in zip(grp["names"], grp["params"], strict=True)
        ]
        self.layout = plan.flat_layout(specs, self.ctx.stage, self.ctx.world_size, options.zero.bucket_numel)
        self._layout_rank = 0 if self.ctx.stage == 0 else self.ctx.rank
        self.num_groups = len(self._groups)

        self.flat_params = reducer.FlatParams(
            self.layout, self.named_params, self.num_groups, self.ctx.dtype, self.ctx.device
        )
        self._broadcast_initial_state()

        shard_numels = [self.layout.shard_numel(g) for g in range(self.num_groups)]
        offload_device = options.zero.offload_optimizer.device
        direct = self._accumulates_directly(options)
        segments = plan.flat_grad_segments(self.layout, direct)
        # on the compute device each segment is freed after the step and re-allocated at its first write in
        # backward ([Note: released grad shards] in ../grad_shards.py)
        self.grad_shards = GradShards(
            shard_numels,
            segments,
            self.ctx.master_device,
            pin=pin,
            releasable=offload_device == "none",
            compute_dtype=self._compute_grad_dtype(direct),
        )
        # the sum of squares for the norm is taken from the reduced grads on the device while they are
        # still there, when those are the window's final values: saves a pass over the host shards.
        self._device_grad_sq = offload_device != "none" and (
            self.ctx.stage < 2 or options.gradient_accumulation_steps == 1
        )
        self.shards = ShardOptimizer(
            options.optimizer,
            options.zero.offload_optimizer,
            shard_numels,
            self._groups,
            # a chunk never spans two grad segments (a segment lies inside one bucket's shard)
            split_chunks(
                [
                    Chunk(g.group, g.offset, g.numel, owner=g.bucket, owner_offset=g.bucket_offset)
                    for g in segments
                ],
                shard_optimizer.HOST_CHUNK_NUMEL if offload_device == "cpu" else None,
            ),
            device=self.ctx.master_device,
            rank=self.ctx.rank,
            fused_step=self.ctx.options.optimizer.fused_step,
            master_dtype=self.ctx.master_dtype,
            # [Note: master is params]
            master_tensors=self.flat_params.buffers if self._master_is_params(options) else None,
        )
        """fp32 (or bf16) master + optimizer state of this rank's shards (on the device, the host or nvme)."""
        buffers = self.flat_params.buffers
        self.shards.initialize(lambda c, master: master.copy_(self._chunk_of_params(buffers, c)))

        self.reducer = self._build_grad_path(direct)
        # not held before the first backward either (the reducers' views above are taken): the first
        # forward's peak is then every step's peak
        self.grad_shards.release()

        self._in_flight: OverlappedStep | None = None
        """The step running in the background ([Note: overlapped step]); None when none runs."""
        self._step_executor: ThreadPoolExecutor | None = None
        if options.zero.offload_optimizer.overlap_step:
            self._step_executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="zerolaunch-step")
            # the training thread keeps one core while the step runs: it launches the forward's kernels and
            # spins in device syncs, and an OpenMP team with a preempted thread waits for it at every chunk.
            self._step_threads = max(1, torch.get_num_threads() - 1)
            self._copy_stream = self.ctx.comm.copy_stream
            self._register_publish_hooks()

    # ---- init -----------------------------------------------------------------------------------------
    _pipeline = None
    """Stage 2 (world size > 1 or offload): the BackwardReducer's reduce pipeline."""

    def _build_grad_path(self, direct: bool) -> reducer.GradPath:
        """How grads reach the fp32 shards, chosen once: straight from their hooks at world size 1, reduced
        from their hooks per bucket in stage 2, through full-size grad buffers reduced at the boundary in
        stages 0/1."""
        if direct:
            path = reducer.DirectAccumulator(self.layout, self.grad_shards)
        elif self.ctx.stage in (0, 1):
            return FullGrads(
                self.layout,
                self.flat_params,
                self.named_params,
                self.grad_shards,
                self.ctx,
                track_grad_sq=self._device_grad_sq,
            )
        else:
            path = reducer.BackwardReducer(
                self.layout,
                self.grad_shards,
                self.ctx.comm,
                comm_dtype=self.ctx.comm_dtype,
                stats=self.ctx.stats,
                track_grad_sq=self._device_grad_sq,
                sum_on_device=plan.sums_window_on_device(
                    self.ctx.options.zero.offload_optimizer.device,
                    self.ctx.options.gradient_accumulation_steps,
                ),
            )
            self._pipeline = path.pipeline
        self._hook_handles = [
            self.named_params[slot.name].register_post_accumulate_grad_hook(path.hook_for(slot))
            for slot in self.layout.params
        ]
        remove_with(path, self._hook_handles)  # [Note: weak hooks]: the model outlives the reducer
        return path

    def _master_is_params(self, options) -> bool:
        """[Note: master is params]
        Where this rank steps whole buckets (stage 0, or one rank: `_params_written_directly`) and the master
        has the params' dtype (fp32 training, or pure bf16: [Note: bf16 master]) on the device, a master
        would be a second copy of the flat param buffers, element for element (at layout world 1 a group's
        shard is its buffer, buckets back to back). So the buffers are the master: the step updates the
        params in place and nothing is copied back; 4 bytes per param saved in fp32 (2 in bf16). The values
        are those of a separate master (its copy back was exact); the memory accounting reports them once,
        as params. plan.master_is_params (estimate-memory asks it too)."""
        return plan.master_is_params(
            self.ctx.stage,
            self.ctx.world_size,
            options.zero.offload_optimizer.device != "none",
            options.precision.dtype,
            options.precision.master_dtype,
        )

    def _chunk_of_params(self, flats: list[torch.Tensor], c: int) -> torch.Tensor:
        """Chunk c of this rank's shard, inside full-size flat buffers (params or full grads)."""
        chunk = self.shards.chunks[c]
        owned = reducer.owned_view(flats, self.layout.buckets[chunk.owner], self._layout_rank)
        return owned[chunk.owner_offset : chunk.owner_offset + chunk.numel]

    def close(self) -> None:
        """Finish a step in flight, release the nvme swap file now (it is also removed at garbage collection
        and at exit)."""
        self.wait_for_step()
        if self._step_executor is not None:
            self._step_executor.shutdown(wait=True)
        self.shards.close()

    def _register_publish_hooks(self) -> None:
        """overlap_step: before a module's forward, publish the buckets of its own params; after the root's
        forward, everything ([Note: overlapped step]). A state_dict() of any module holding params (the root's
        reaches each of them) waits for the step first, so a checkpoint the user writes with torch holds this step's
        weights, not the previous one's."""
        slot_by_param = {id(self.named_params[s.name]): s for s in self.layout.params}
        handles = []
        for module in self.module.modules():
            buckets = [
                slot_by_param[id(p)].bucket
                for p in module.parameters(recurse=False)
                if id(p) in slot_by_param
            ]
            if buckets:
                handles.append(
                    module.register_forward_pre_hook(weak_partial(self._publish_before_forward, min(buckets)))
                )
                handles.append(module.register_state_dict_pre_hook(weak_partial(self._wait_in_hook)))
        handles.append(self.module.register_forward_hook(weak_partial(self._wait_in_hook)))
        remove_with(self, handles)  # [Note: weak hooks]

    def _wait_in_hook(self, *_) -> None:
        self.wait_for_step()

    @property
    def forward_hooks_free(self) -> bool:
        """Only overlap_step hooks the forward (its publish hooks, above)."""
        return self._step_executor is None

    def _publish_before_forward(self, bucket: int, *_) -> None:
        if self._in_flight is not None:
            self._in_flight.publish_through(bucket)

    def wait_for_step(self) -> None:
        if self._in_flight is not None:
            in_flight, self._in_flight = self._in_flight, None
            in_flight.wait_for_step()

    def _broadcast_initial_state(self) -> None:
        """Every rank starts from rank 0's weights and buffers (builders may seed differently per rank)."""
        with torch.no_grad():
            for buf in self.flat_params.buffers:
                comm.broadcast(buf, 0, self.ctx.group, stats=self.ctx.stats)
            for _, t in self.frozen_params + self.model_buffers:
                if t.is_contiguous():
                    comm.broadcast(t.data, 0, self.ctx.group, stats=self.ctx.stats)
                else:
                    tmp = t.data.contiguous()
                    comm.broadcast(tmp, 0, self.ctx.group, stats=self.ctx.stats)
                    t.data.copy_(tmp)

    # ---- training step --------------------------------------------------------------------------------
    def begin_backward(self, window_ends: bool = True) -> None:
        if self._pipeline is not None:
            self._pipeline.window_ends = window_ends
        self.reducer.begin_backward()

    def finish_backward(self) -> None:
        """Stage 2 reduces as grads arrive: wait for the last buckets."""
        self.reducer.finish_backward()

    @torch.no_grad()
    def discard_window(self) -> None:
        self._drop_param_grads()
        self.reducer.discard()
        self.grad_shards.release()

    def finish_window(self, loss_nonfinite: torch.Tensor | None, backwards: int):
        device_sq, loss_nonfinite = self.reducer.finish_window(loss_nonfinite, backwards)
        self._await_host_grads()
        self.grad_shards.zero_unwritten()  # segments no gradient reached in this window (e.g. no backward)
        return device_sq, loss_nonfinite

    def reset_accumulation(self) -> None:
        # every grad shard element is overwritten by the next window's first reduction (stages 0/1 at the
        # boundary, stage 2 on its first micro-step): no zeroing pass over the shards.
        self.reducer.reset_accumulation()

    def step_and_publish(self, grad_multiplier: torch.Tensor | None, lr: float) -> None:
        if self._step_executor is not None:
            self._in_flight = self._start_overlapped_step(grad_multiplier, lr)
        else:
            self._step_in_place(grad_multiplier, lr)

    def _params_written_directly(self) -> bool:
        """Stage 0 and world size 1: this rank's shard is the whole bucket, written straight into the params
        (no all-gather, no staging copy)."""
        return self.ctx.stage == 0 or self.ctx.world_size == 1

    def _chunk_destination(self, c: int, outgoing: dict[int, torch.Tensor]) -> torch.Tensor:
        """Where stepped chunk c goes on the device: its slice of the params (direct) or of its bucket's
        compute-dtype all-gather input in `outgoing` (allocated on first use)."""
        if self._params_written_directly():
            return self._chunk_of_params(self.flat_params.buffers, c)
        chunk = self.shards.chunks[c]
        bucket = self.layout.buckets[chunk.owner]
        if bucket.index not in outgoing:
            outgoing[bucket.index] = torch.empty(
                bucket.shard_numel, dtype=self.ctx.dtype, device=self.ctx.device
            )
        return outgoing[bucket.index][chunk.owner_offset : chunk.owner_offset + chunk.numel]

    def _send_chunk(
        self, c: int, master: torch.Tensor, outgoing: dict[int, torch.Tensor], *, written: bool = False
    ) -> bool:
        """Copy stepped chunk c to the device (`_chunk_destination`; `written`: the fused step wrote it
        already). Returns True when it was its bucket's last chunk.

        copy_ across device and dtype at once: from pinned memory one async host->device copy and a cast on
        the device (6x faster than .to(device, dtype=...), which casts on the host)."""
        if not written:
            dst = self._chunk_destination(c, outgoing)
            dst.copy_(master, non_blocking=self.shards.copy_may_overlap(master))
        chunk = self.shards.chunks[c]
        return chunk.owner_offset + chunk.numel == self.layout.buckets[chunk.owner].shard_numel

    def _gathers_master_itself(self, c: int) -> bool:
        """A master in the compute dtype (fp32 training, or a bf16 master) without offload, params not written
        directly: a chunk that is its bucket's whole shard is all-gathered from the resident master itself,
        no copy. (An nvme buffer is refilled while the all-gather may still read it: that one is always
        copied.)"""
        chunk = self.shards.chunks[c]
        resident = self.shards.store is None and self.ctx.master_device == self.ctx.device
        return (
            not self._params_written_directly()
            and resident
            and self.ctx.dtype == self.ctx.master_dtype
            and chunk.numel == self.layout.buckets[chunk.owner].shard_numel
        )

    def _all_gather_bucket(self, index: int, src: torch.Tensor):
        """Start the all-gather of bucket `index` from this rank's updated slice; the work keeps `src` alive
        until wait() (gloo and nccl hold their input tensors)."""
        out = reducer.bucket_view(self.flat_params.buffers, self.layout.buckets[index])
        with phases.phase(phases.PUBLISH):
            return comm.all_gather(out, src, self.ctx.group, stats=self.ctx.stats, async_op=True)

    @torch.no_grad()
    def _step_in_place(self, grad_multiplier: torch.Tensor | None, lr: float) -> None:
        """Step the shards chunk by chunk; send each stepped chunk to the device at once and all-gather a
        bucket as soon as its last chunk was sent ([Note: offload pipeline] in
        ../optim/shard_optimizer.py)."""
        direct = self._params_written_directly()
        # the step writes each chunk's destination itself (fused), or the master is the params already
        # ([Note: master is params]): nothing to copy
        written = self.shards.fused_step or self.shards.master_is_external
        outgoing: dict[int, torch.Tensor] = {}
        issued = []

        def publish_into(c: int) -> torch.Tensor | None:
            if self.shards.master_is_external or self._gathers_master_itself(c):
                return None
            return self._chunk_destination(c, outgoing)

        def on_stepped(c: int, master: torch.Tensor) -> None:
            bucket = self.layout.buckets[self.shards.chunks[c].owner].index
            if self._gathers_master_itself(c):
                issued.append(self._all_gather_bucket(bucket, master))
                return
            if self._send_chunk(c, master, outgoing, written=written) and not direct:
                issued.append(self._all_gather_bucket(bucket, outgoing.pop(bucket)))

        self.shards.step(
            self.grad_shards,
            lr,
            on_stepped,
            grad_multiplier=grad_multiplier,
            publish_into=publish_into if self.shards.fused_step else None,
        )
        with phases.phase(phases.PUBLISH):
            for pending in issued:
                pending.wait()

    def _start_overlapped_step(self, grad_multiplier: torch.Tensor | None, lr: float) -> OverlappedStep:
        """The step of _step_in_place, in the background, in forward order ([Note: overlapped step])."""
        buckets = self.layout.buckets
        chunks = self.shards.chunks
        direct = self._params_written_directly()
        # staging for the all-gathers, allocated here on the compute stream (the background thread only
        # writes into them, on its copy stream, after that stream waited for this point).
        outgoing = (
            {}
            if direct
            else {
                b.index: torch.empty(b.shard_numel, dtype=self.ctx.dtype, device=self.ctx.device)
                for b in buckets
            }
        )

        def publish(b: int):
            return None if direct else self._all_gather_bucket(b, outgoing.pop(b))

        def on_stepped(c: int, master: torch.Tensor) -> None:
            if self._send_chunk(c, master, outgoing):
                in_flight.bucket_sent(chunks[c].owner)

        # the last bucket holds the first layers: step it first, so the next forward can start on it.
        order = sorted(range(len(chunks)), key=lambda c: (-chunks[c].owner, chunks[c].owner_offset))
        in_flight = OverlappedStep(
            len(buckets), self.ctx.device, publish, self._step_executor, self._step_threads, self._copy_stream
        )
        in_flight.run(
            lambda _: self.shards.step(
                self.grad_shards, lr, on_stepped, grad_multiplier=grad_multiplier, order=order
            )
        )
        return in_flight

    # ---- accounting -----------------------------------------------------------------------------------
    def memory_bytes(self) -> dict[str, int]:
        out = {
            "params": nbytes(self.flat_params.buffers) + nbytes([p for _, p in self.frozen_params]),
            "grads": self.reducer.full_grad_bytes + self.grad_shards.capacity_bytes,
            "buckets": self.reducer.staging_bytes,
        }
        # under nvme "optimizer" is the host staging buffers and "nvme" the bytes on disk.
        return {**out, **self.shards.memory_bytes()}

    # ---- checkpoint fragments: collective-free unless noted --------------------------------------------
    def owned_fragments(self) -> list[Fragment]:
        """Stage 0 replicates everything: rank 0 saves it all, the others none (each element is then
        written exactly once); every rank still loads the whole state."""
        if self.ctx.stage == 0 and self.ctx.rank != 0:
            return []
        return self.layout.owned_fragments(self._layout_rank)

    @torch.no_grad()
    def load_fragment_state(self, read) -> None:
        """Every full trainable param is read too, so no all-gather is needed."""
        for slot in self.layout.params:
            full = read("master", slot.name, 0, slot.numel)
            self.flat_params.param_view(self.flat_params.buffers, slot).copy_(full.reshape(slot.shape))
        # stage 0: every rank loads everything (owned_fragments() is what rank 0 alone saves).
        self._load_fragments(read, self.layout.owned_fragments(self._layout_rank))

    def full_params(self, dtype: torch.dtype | None = None):
        """Asking fp32 from a 16-bit model gathers the fp32 master bucket by bucket."""
        from_master = dtype == torch.float32 and self.ctx.dtype != torch.float32
        gathered: dict[int, torch.Tensor] = {}
        for name, p in self.named_params.items():
            slot = self.flat_params.slot_of.get(name)
            if slot is None or not from_master:
                t = p.detach()
                yield name, t if dtype is None or not t.is_floating_point() else t.to(dtype)
                continue
            if slot.bucket not in gathered:
                gathered.clear()
                gathered[slot.bucket] = self._gather_master_bucket(self.layout.buckets[slot.bucket])
            yield name, gathered[slot.bucket][slot.offset : slot.offset + slot.numel].view(slot.shape)

    def _gather_master_bucket(self, bucket) -> torch.Tensor:
        shard_offset = self.layout.bucket_shard_offset(bucket)
        src = self.shards.read("master", bucket.group, shard_offset, bucket.shard_numel).to(self.ctx.device)
        if self.ctx.stage == 0:
            return src
        out = torch.empty(bucket.padded_numel, dtype=torch.float32, device=self.ctx.device)
        comm.all_gather(out, src, self.ctx.group, stats=self.ctx.stats)
        return out
