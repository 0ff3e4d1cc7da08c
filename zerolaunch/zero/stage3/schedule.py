"""When stage 3 gathers, frees and reduces each unit: the forward/backward hooks and their bookkeeping.

This module owns the gather / prefetch / free schedule and the order reduce-scatters are issued in; each
unit's own state (its params, staged grads, reduce-scatter and write, held / prefetched / waited-for inputs)
is unit.py's `Stage3Unit`; the reduce-scatters in flight are ../reduce.py's `ReducePipeline`, shared with
stage 2, and the world-size-1 direct writes its `DirectWrites`.

[Note: stage-3 schedule]
- Forward: the engine gathers the root unit before the model runs. A unit's forward pre-hook gathers it
  (waiting for a prefetch already in flight) and prefetches the units predicted to run next (the previous
  forward's call sequence; module order on the first step), as many as fit in
  `stage3_prefetch_bucket_size` elements while the gathered, non-resident elements stay within
  `stage3_max_live_parameters` (the unit needed now is always gathered). The post-hook frees the unit and
  registers a hook on each of its output tensors that need grad: autograd calls it before the unit's own
  backward, which gathers the unit again (and prefetches the next ones in reverse call order). A unit whose
  outputs hold no tensor we can see (a dataclass, say) is kept gathered until its backward is done.
- `stage3_max_reuse_distance` (DeepSpeed's rule, partitioned_param_coordinator.__params_to_release): the
  post-hook does not free a unit whose next use in the predicted trace (the rest of this forward, then the
  backward in reverse) comes before `max_reuse_distance` elements of other units have been gathered; it
  stays gathered into that use and is freed after its backward as usual. Typically the last units of the
  forward, which would otherwise be gathered again at once. Unlike DeepSpeed, a unit is only kept while
  the root, the kept units and the largest unit gathered before its reuse fit in
  `stage3_max_live_parameters`. 0 (the default) frees every unit after its forward.
  The root stays gathered after a forward with grad enabled: backward needs it first.
- Activation checkpointing (use_reentrant=False) re-runs a unit's forward inside backward: the hooks see
  the BACKWARD phase and only make sure the unit is gathered.
- Backward: each param's post-accumulate-grad hook moves its grad into the unit's staging buffer. Autograd
  accumulates a leaf once per backward, also for a unit called twice, so when every trainable param of a
  unit has reported, nothing in this backward reads the unit's params any more: it is freed, and its
  reduce-scatter becomes ready.
- Frozen params ([Note: frozen buckets] in unit_buffers.py) change when a unit's backward is over: a frozen
  weight is read by the node that computes the grad of the unit's input, which may run after the last
  trainable grad of the unit arrived (LoRA: the adapter's grads come before the base Linear's input grad),
  and a unit of frozen params only has no grad at all. So a unit with frozen params wraps its forward's
  inputs that need grad in `_InputsBackward` (FSDP2's post-backward trick): its backward runs once the
  grads of those inputs are computed, i.e. after every node of the unit. Such a unit is freed in backward
  once its trainable grads arrived (if any) and every wrapper of this window fired. Its outputs get the
  pre-backward hook whenever they need grad (also with no trainable param). A reentrant checkpoint runs
  the forward under no_grad (no wrapper) and re-runs it inside backward: the re-run wraps its inputs, whose
  grads the inner backward computes; a non-reentrant re-run does not wrap (the forward's wrapper fires,
  the re-run's graph is thrown away). Backward prefetches skip units without trainable params whose
  outputs needed no grad (a frozen base below the trainable layers has no backward).
- Reduce-scatters are issued in one fixed order on every rank (units in reverse module order, root, then
  the resident params), a ready unit waiting for the ones before it, so all ranks issue the same
  collectives even when autograd orders grads differently. At the end of backward every unit not yet
  issued (skipped this step, or with an unused param) is issued with the grads it has (zeros otherwise).
All gathers depend only on the call sequence, which is the same on every rank for the same model code.

[Note: direct grads]
At world size 1 without offload (plan.accumulates_directly; ../reduce.py DirectWrites, as for stages 0-2)
a reduce-scatter is a copy: the staging buffer, the reduce output and their two copies of every gradient
hold nothing the shard would not. So each param's hook writes its grad straight into its slice of the
unit's fp32 grad shard: overwritten (the exact upcast) in the window's first micro-step, added to (fp32)
after it, the values of the reducing path bit for bit (GradShards.write; with one micro-step, a 16-bit model
and a step that reads 16-bit grads the copy stays in the compute dtype, [Note: compute-dtype grads] in
../grad_shards.py). A unit whose every param reported is done for the micro-step; at the end of backward, the
slices of params without a grad in the window's first micro-step are zeroed, which is what the zeroed staging
buffer gave. Nothing is issued.

[Note: hook-free forward]
Where every unit aliases its source ([Note: world size 1 aliases] in unit_buffers.py: world size 1, params
not offloaded, the master, if gathered from, in the compute dtype), gathering a unit moves nothing and
holds no memory: it only points the params at views they could keep for good. So such a schedule gathers
every unit once, at construction, and never frees one (UnitFlat.stay_gathered), and registers no module
forward hook: the forward is the model's own code, which torch.compile can trace whole (api.py compile,
`compile_scope: model`). Nothing else needs the forward bookkeeping then: the post-accumulate-grad hooks
count arrivals and write or stage grads by themselves, the frozen-param input wrappers only decide when a
unit may be freed, and the pre-backward hooks only gather and prefetch.
The same holds where `stage3_param_persistence_threshold` is above every param: all of them are persistent
(DeepSpeed's rule: not partitioned), in the resident unit, which is gathered for good and registers no hook
anyway. At world size 1 over an fp32 master that is the way to trade stage 3's transient 16-bit units for
stage 2's memory and a forward compiled whole: the resident unit keeps the cast and refreshes it after each
step, where the units would cast their master slices twice a step (forward and backward).
"""

from __future__ import annotations

import enum

import torch
from torch.utils._pytree import tree_flatten, tree_leaves, tree_unflatten

from .. import comm, phases
from ..grad_shards import GradShards
from ..plan import IssueOrder
from ..reduce import DirectWrites, ReducePipeline
from ..weak_hooks import refuse_when_gone, remove_with, weak_partial
from .partition import ROOT
from .unit import Stage3Unit
from .unit_buffers import UnitFlat


class SchedulePhase(enum.Enum):
    """Which part of a micro-step the schedule's hooks are in (`Stage3Schedule.phase`)."""

    IDLE = enum.auto()
    """Before the first forward, between a forward and its backward, after a backward (also an aborted one):
    a forward or a backward comes next. Gathered besides the resident unit: after a forward with grad, the
    root unit (backward needs it first) and the units held for their backward; otherwise none."""
    FORWARD = enum.auto()
    """Inside the engine's forward: a unit's pre-hook records the call, gathers it and prefetches the
    predicted next units; its post-hook frees it (unless its backward will need it soon) and hooks its
    outputs for backward."""
    BACKWARD = enum.auto()
    """From begin_backward until finish_backward: units are gathered again for their backward, a forward
    hook only makes sure its unit is gathered (activation-checkpoint recompute), and grads are moved into
    staging buffers and reduce-scattered in the fixed order."""


def _engine_gone_message(module) -> str:
    return (
        f"this {type(module).__name__} was sharded by a ZeRO stage-3 engine that has been freed (nothing "
        "referenced it any more), and its weights went with the engine: its parameters are zero placeholders. "
        "Keep a reference to the engine while the model is in use, or save the weights first "
        "(engine.consolidated_state_dict(), save_16bit_model or save_pretrained) and load them into a new model"
    )


def _copied_message(module) -> str:
    return (
        f"this {type(module).__name__} is a deep copy of a module a ZeRO stage-3 engine sharded: its parameters "
        "are copies of zero placeholders (the weights live in the engine). Copy the weights instead: load the "
        "engine's consolidated_state_dict() into a new model"
    )


class _InputsBackward(torch.autograd.Function):
    """Identity on a unit's inputs that need grad; its backward calls `on_done` (the unit's backward is over:
    every node that reads its params ran before the grads of its inputs exist)."""

    @staticmethod
    def forward(ctx, on_done, *tensors):
        ctx.on_done = on_done
        return tensors  # as they are (FSDP2's RegisterPostBackwardFunction): in-place ops on them stay legal

    @staticmethod
    def backward(ctx, *grads):
        ctx.on_done()
        return (None, *grads)


class Stage3Schedule:
    def __init__(
        self,
        flats: list[UnitFlat | None],
        modules: list,
        params: list[list[tuple[str, torch.nn.Parameter]]],
        context: comm.CommContext,
        *,
        comm_dtype: torch.dtype,
        prefetch_numel: int,
        max_live_numel: int,
        max_reuse_numel: int = 0,
        stats: comm.CommStats,
        max_reduces_in_flight: int = 2,
        track_grad_sq: bool = False,
        grad_shards: GradShards,
        direct: bool = False,
        sum_on_device: bool = False,
        hook_free: bool = False,
    ):
        """flats[k] / params[k]: unit k's buffers and sharded params (None / [] when it has none); the last
        entry is the resident unit of persistent params (modules[-1] is None). hook_free: every unit stays
        gathered and no forward hook is registered ([Note: hook-free forward]; each flat must alias or be
        resident)."""
        self.flats = flats
        self.units = [
            None
            if flat is None
            else Stage3Unit(
                k,
                flat,
                modules[k],
                params[k],
                context,
                comm_dtype=comm_dtype,
                stats=stats,
                grad_shards=grad_shards,
            )
            for k, flat in enumerate(flats)
        ]
        """units[k]: unit k's params, buffers, grads and schedule state (unit.py); None where flats[k] is."""
        self.direct = direct
        """World size 1 ([Note: direct grads]): grads go straight into the grad shard from their hooks."""
        self.direct_writes: DirectWrites | None = None
        if direct:
            self.direct_writes = DirectWrites(
                grad_shards, {name: s for f in flats if f is not None for name, s in f.grad_slices.items()}
            )
        self.group = context.group
        self.device = context.device
        self.prefetch_numel = max(0, prefetch_numel)
        self.max_live_numel = max_live_numel
        if max_reuse_numel < 0:
            raise ValueError(f"zero.stage3_max_reuse_distance must be >= 0, got {max_reuse_numel}")
        self.max_reuse_numel = max_reuse_numel
        self.overlap = context.overlap
        self.stats = stats
        self.max_in_flight = max(1, max_reduces_in_flight) if self.overlap else 1
        self.gather_stream = context.gather_stream
        n = len(flats)
        units = [u for u in self.units if u is not None]
        trainable = [k for k, u in enumerate(self.units) if u is not None and u.n_trainable]
        reduce_order = [k for k in reversed(trainable) if k != n - 1] + [k for k in trainable if k == n - 1]
        self.issue_order = IssueOrder(reduce_order, [0 if u is None else u.n_trainable for u in self.units])
        """Units are reduced in reverse module order, the resident unit last (the Note)."""
        self.phase = SchedulePhase.IDLE
        with_grads = [f for f in flats if f is not None and f.grad_views]
        self.pipeline = ReducePipeline(
            units,
            device=self.device,
            shard_device=with_grads[0].grad_views[0].device if with_grads else self.device,
            host_staging_numel=max((f.train_shard_numel for f in with_grads), default=0),
            track_grad_sq=track_grad_sq,
            # the compute stream waits for the reduce-scatter, then adds its output into the shard
            write_on_reduce_stream=False,
            sum_on_device=sum_on_device,
        )
        """The reduce-scatters in flight and their writes into the grad shard (../reduce.py)."""
        self.predicted: list[int] = [k for k in range(n - 1) if flats[k] is not None]
        self.calls: list[int] = []
        self._bwd_seq: list[int] = []
        self._bwd_pos = 0
        self.reuse_kept = 0
        """Units kept gathered by max_reuse_distance, over the run (tests read it)."""
        self._reset_backward_state()
        self.peak_live_numel = 0
        """Largest sum of gathered non-resident elements seen at once (tests read it)."""
        self.prefetch_hits = 0
        """Units found already gathered (by a prefetch) when they were needed (tests read it)."""
        self.forward_hooks_free = hook_free
        """No module forward hook is registered: every unit stays gathered ([Note: hook-free forward])."""
        self._handles = []
        if hook_free:
            for flat in flats:
                if flat is not None and not flat.resident:  # a resident unit is gathered for good already
                    flat.stay_gathered()
        else:
            for k, module in enumerate(modules):
                if module is None or flats[k] is None or k == ROOT:
                    continue
                self._handles.append(
                    module.register_forward_pre_hook(weak_partial(self._pre_forward, k), with_kwargs=True)
                )
                self._handles.append(module.register_forward_hook(weak_partial(self._post_forward, k)))
        for k, unit_params in enumerate(params):
            for name, p in unit_params:
                self._handles.append(
                    p.register_post_accumulate_grad_hook(weak_partial(self._on_grad, k, name))
                )
        remove_with(self, self._handles)  # [Note: weak hooks]: the model outlives the schedule
        # A hook-free forward keeps every param a view of its master or shard, which the params keep alive: its
        # model runs on without the engine (and no hook may enter its compiled forward). Otherwise a module
        # whose weights were sharded refuses to run once they have gone with the schedule.
        for k, module in enumerate(modules):
            if not hook_free and module is not None and flats[k] is not None and not flats[k].resident:
                module.register_forward_pre_hook(
                    refuse_when_gone(self, _engine_gone_message(module), _copied_message(module))
                )

    def _reset_backward_state(self) -> None:
        self.issue_order.reset()
        self.pipeline.reset_issued()
        for unit in self.units:
            if unit is not None:
                unit.reset_backward()

    @property
    def issued_count(self) -> int:
        """Reduce-scatters issued in this backward (tests read it)."""
        return self.pipeline.issued_count

    # ---- gather / free -----------------------------------------------------------------------------------
    def live_numel(self) -> int:
        return sum(f.padded_numel for f in self.flats if f is not None and f.gathered and not f.resident)

    def _gather(self, k: int) -> None:
        flat = self.flats[k]
        if flat is not None and not flat.gathered:
            flat.gather(self.group, stream=self.gather_stream, stats=self.stats)
            self.peak_live_numel = max(self.peak_live_numel, self.live_numel())

    def gather_and_wait(self, k: int) -> None:
        """Unit k is gathered and readable on the compute stream."""
        flat = self.flats[k]
        if flat is None:
            return
        if self.units[k].prefetched:
            self.units[k].prefetched = False
            self.prefetch_hits += 1
        self._gather(k)
        flat.wait_gathered()

    def free(self, k: int) -> None:
        flat = self.flats[k]
        if flat is not None:
            flat.free()

    def _prefetch(self, upcoming: list[int]) -> None:
        budget = self.prefetch_numel
        for k in upcoming:
            flat = self.flats[k]
            if flat is None or flat.gathered:
                continue
            if flat.padded_numel > budget or self.live_numel() + flat.padded_numel > self.max_live_numel:
                return
            self._gather(k)
            self.units[k].prefetched = True
            budget -= flat.padded_numel

    # ---- forward -------------------------------------------------------------------------------------------
    def begin_forward(self) -> None:
        if self.phase is not SchedulePhase.BACKWARD:
            self.phase = SchedulePhase.FORWARD
            self.calls = [ROOT]
            self.gather_and_wait(ROOT)
            self._prefetch(self.predicted[1:])

    def open_forward(self) -> bool:
        """A forward of the module outside the engine's (Engine.gathered): begun when the hooks are IDLE and
        the root is released; not inside the engine's forward or backward, nor after a forward with grad,
        where the root is still gathered for backward and each unit's hooks gather it as it runs. True when
        begun (end_forward closes it)."""
        root = self.flats[ROOT]
        if self.phase is not SchedulePhase.IDLE or (root is not None and root.gathered):
            return False
        self.begin_forward()
        return True

    def end_forward(self) -> None:
        """After the model's forward: keep what backward needs first, free mispredicted prefetches."""
        if self.phase is SchedulePhase.BACKWARD:
            return
        self.phase = SchedulePhase.IDLE
        grad = torch.is_grad_enabled()
        for k, unit in enumerate(self.units):
            if unit is not None and not (grad and (k == ROOT or unit.held)):
                unit.flat.free()
        self.predicted = list(self.calls)

    def _pre_forward(self, k: int, module, args, kwargs):
        if self.phase is SchedulePhase.BACKWARD:  # activation-checkpoint recompute: pre_backward gathered it
            self.gather_and_wait(k)
            # a reentrant re-run (no wrapper from its no_grad forward) wraps; a non-reentrant one's forward
            # wrapper is still pending and fires itself (the Note)
            if self.units[k].input_waits == 0:
                return self._wrap_inputs(k, args, kwargs)
            return None
        self.calls.append(k)
        self.gather_and_wait(k)
        self._prefetch(self.predicted[len(self.calls) :])
        return self._wrap_inputs(k, args, kwargs)

    def _wrap_inputs(self, k: int, args, kwargs):
        """A unit with frozen params: its inputs that need grad go through _InputsBackward (the Note)."""
        if not self.units[k].has_frozen or k == ROOT or not torch.is_grad_enabled():
            return None
        flat, spec = tree_flatten((args, kwargs))
        picked = [i for i, t in enumerate(flat) if isinstance(t, torch.Tensor) and t.requires_grad]
        if not picked:
            return None
        wrapped = _InputsBackward.apply(weak_partial(self._inputs_done, k), *[flat[i] for i in picked])
        for i, t in zip(picked, wrapped, strict=True):
            flat[i] = t
        self.units[k].input_waits += 1
        return tree_unflatten(flat, spec)

    def _inputs_done(self, k: int) -> None:
        unit = self.units[k]
        unit.input_waits = max(0, unit.input_waits - 1)
        self._maybe_free_after_backward(unit)

    def _maybe_free_after_backward(self, unit: Stage3Unit) -> None:
        """Free the unit once nothing in this backward reads it any more (the Note)."""
        if unit.backward_done:
            unit.held = False
            unit.flat.free()

    def _post_forward(self, k: int, module, args, output):
        if self.phase is SchedulePhase.BACKWARD:
            return output
        if torch.is_grad_enabled():
            unit = self.units[k]
            tensors = [t for t in tree_leaves(output) if isinstance(t, torch.Tensor) and t.requires_grad]
            if not tensors and unit.n_trainable > 0:
                unit.held = True
                return output
            if tensors:
                unit.hooked = True
            for t in tensors:
                t.register_hook(weak_partial(self._pre_backward, k))
            if tensors and self._reused_soon(k):
                unit.held = True
                self.reuse_kept += 1
                return output
        self.free(k)
        return output

    def _reused_soon(self, k: int) -> bool:
        """max_reuse_distance: whether unit k's next use comes within max_reuse_numel gathered elements of
        other units (the predicted rest of this forward, then the backward in reverse call order), and
        keeping it gathered until then stays within max_live_numel."""
        if self.max_reuse_numel == 0 or self.flats[k].resident:
            return False
        upcoming = self.predicted[len(self.calls) :] + list(reversed(self.predicted))
        between, largest = 0, 0
        for j in upcoming:
            if j == k:
                break
            flat = self.flats[j]
            if flat is None or flat.resident or j == ROOT:  # the root stays gathered: no gather to count
                continue
            between += flat.padded_numel
            largest = max(largest, flat.padded_numel)
            if between >= self.max_reuse_numel:  # DeepSpeed stops looking at the distance
                return False
        else:
            return False  # not used again in the predicted trace
        root = self.flats[ROOT]
        kept = sum(
            u.flat.padded_numel
            for u in self.units
            if u is not None and (u.held or u.index == k) and not u.flat.resident
        )
        root_numel = root.padded_numel if root is not None and not root.resident and k != ROOT else 0
        return root_numel + kept + largest <= self.max_live_numel

    # ---- backward ------------------------------------------------------------------------------------------
    def begin_backward(self, window_ends: bool = True) -> None:
        self.pipeline.window_ends = window_ends
        self.phase = SchedulePhase.BACKWARD
        # a unit with no trainable param and no hooked output has no backward: nothing to prefetch for it
        self._bwd_seq = [k for k in reversed(self.calls) if self._has_backward(k)]
        self._bwd_pos = 0
        self.gather_and_wait(ROOT)

    def _has_backward(self, k: int) -> bool:
        unit = self.units[k]
        return unit is not None and (unit.n_trainable > 0 or unit.hooked)

    def abort_backward(self) -> None:
        """backward() raised: the hooks treat the next call as a forward again (the units it gathered and
        the grads it staged stay until discard_window)."""
        self.phase = SchedulePhase.IDLE

    def _pre_backward(self, k: int, grad):
        self.gather_and_wait(k)
        if k not in self._bwd_seq:
            return None
        while self._bwd_pos < len(self._bwd_seq) and self._bwd_seq[self._bwd_pos] != k:
            self._bwd_pos += 1
        self._prefetch(self._bwd_seq[self._bwd_pos + 1 :])
        return None

    def _on_grad(self, k: int, name: str, param: torch.Tensor) -> None:
        if param.grad is None:
            return
        unit = self.units[k]
        if self.direct_writes is not None:
            # the exact copy (upcast) or the fp32 add the reducing path does, without its staging and reduce
            # copies (a compute-dtype window keeps the copy 16-bit: [Note: compute-dtype grads])
            self.direct_writes.write(name, param.grad)
        else:
            with phases.phase(phases.STAGE_GRAD):
                unit.add_grad(name, param.grad)
        param.grad = None  # the full gradient is released: this rank keeps only its shard
        if self.issue_order.arrive(k):
            unit.grads_in = True
            if unit.has_frozen:
                self._maybe_free_after_backward(unit)
            else:
                unit.held = False
                unit.flat.free()
            if self.direct_writes is None:
                self._issue_ready()

    def _issue_ready(self) -> None:
        for k in self.issue_order.issuable():
            self._issue(k)

    def _issue(self, k: int) -> None:
        self.pipeline.issue(self.units[k])
        self.issue_order.issued(k)
        # without overlap each reduce-scatter is awaited at once; with it, up to max_in_flight stay queued.
        while len(self.pipeline.in_flight) > (self.max_in_flight if self.overlap else 0):
            self.pipeline.complete_oldest()

    def finish_backward(self) -> None:
        """Issue what is left in the fixed order (zeros where no grad came), await all, free every unit. The
        direct path zeroes instead what the window's first micro-step did not write."""
        if self.direct_writes is not None:
            self.direct_writes.finish_backward()
        else:
            for k in self.issue_order.unissued():
                self._issue(k)
            self.pipeline.drain()
        for unit in self.units:
            if unit is not None:
                unit.flat.free()
                unit.held = False
        self._reset_backward_state()
        self.phase = SchedulePhase.IDLE

    def reset_accumulation(self) -> None:
        """After a step: each unit's next reduced grads overwrite its grad shard (no zeroing pass)."""
        self.pipeline.reset_accumulation()
        if self.direct_writes is not None:
            self.direct_writes.reset_accumulation()

    def discard_window(self) -> None:
        """The window is dropped (a backward raised part way): await the reduce-scatters in flight, drop the
        units' staged grads, free every unit (the resident one stays), every unit FRESH again, IDLE."""
        self.pipeline.discard()
        if self.direct_writes is not None:
            self.direct_writes.discard()
        for unit in self.units:
            if unit is not None:
                unit.staging = None  # its memory: a retry overwrites every staged grad anyway
                unit.flat.free()
                unit.held = False
                unit.prefetched = False
        self._reset_backward_state()
        self.phase = SchedulePhase.IDLE

    def take_grad_sq(self) -> torch.Tensor | None:
        """Sum of squares of the grads reduced since the last call (track_grad_sq), on the device."""
        return self.pipeline.take_grad_sq()

    @property
    def staging_bytes(self) -> int:
        return sum(u.staging_bytes for u in self.units if u is not None)
