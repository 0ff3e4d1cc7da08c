"""The one `Engine`: the training-step protocol of docs/ARCHITECTURE.md "The engine", for every ZeRO stage.

This module owns what does not depend on how state is sharded: construction order (options checked,
placement and dtypes resolved, then the strategy built), forward/backward with loss scaling and
accumulation, the step at the accumulation boundary (grad norm, clipping, the skip on inf/nan, the loss
scaler, the lr schedule), and the engine side of the checkpoint contract (engine_state.py). Where params,
grads and the fp32 master live is the sharding strategy's (sharding.py): `flat.flat_sharding.FlatSharding` for
stages 0-2, `stage3.unit_sharding.UnitSharding` for stage 3, picked by `sharding_for`.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace

import torch
from torch import nn

from . import comm, phases, placement
from .engine_state import EngineStateMixin
from .layout import Fragment
from .loss_scale import LossScaler
from .optim.torch_optim import check_and_scale, note_nonfinite_loss, sum_of_squares
from .option_rules import why_not_fused
from .options import EngineOptions
from .protocol import DTYPES, StepInfo, validate_options
from .sched import LRSchedule, Schedule, groups_description
from .sharding import Sharding, StrategyContext
from .weak_hooks import refusing_modules


def sharding_for(stage: int) -> type[Sharding]:
    """The strategy class of a ZeRO stage (imported here, not at the top: each pulls in its own modules)."""
    if stage == 3:
        from .stage3.unit_sharding import UnitSharding

        return UnitSharding
    from .flat.flat_sharding import FlatSharding

    return FlatSharding


def _refuse_sharded_model(model: nn.Module) -> None:
    """A model a stage-3 engine sharded holds zero placeholders where its weights were ([Note: weak hooks]):
    another engine built on it would start from zeros."""
    sharded = refusing_modules(model)
    if sharded:
        raise ValueError(
            f"this {type(model).__name__} was already sharded by a ZeRO stage-3 engine ({len(sharded)} modules, "
            f"first {sharded[0]!r}): its weights live in that engine, and its parameters are zero placeholders, "
            "so a new engine would start from zeros. Build the new engine on a fresh model, loading the weights "
            "into it first (the first engine's consolidated_state_dict(), save_16bit_model or checkpoint)"
        )


class Engine(EngineStateMixin):
    def __init__(
        self,
        model: nn.Module,
        options: EngineOptions,
        *,
        group=None,
        device: torch.device = torch.device("cpu"),
        init_fn=None,
        param_groups: list[dict] | None = None,
    ):
        """param_groups: the client's optimizer groups (param_groups.client_groups); None = the default
        groups of options.optimizer (decay_1d). init_fn(module): stage 3 initializes a unit built on the
        meta device with it (one unit is materialized at a time)."""
        validate_options(options)
        _refuse_sharded_model(model)
        self.options = options
        self.stage = options.zero.stage
        self.group = group
        self.device = torch.device(device)
        self.rank = comm.rank(group)
        self.world_size = comm.world_size(group)
        self.comm_stats = comm.CommStats()
        self.comm_context = comm.CommContext(self.device, group, overlap=options.zero.overlap)
        """The device, group and CUDA side streams every part of the strategy issues its work with."""
        self.dtype = DTYPES[options.precision.dtype]
        self.master_dtype = DTYPES[options.precision.master_dtype]
        """Of the master weights and optimizer state: fp32, or bf16 ([Note: bf16 master])."""
        # grads are reduced in fp32 unless asked otherwise: exact sums, FSDP2's choice.
        self.comm_dtype = DTYPES[options.precision.communication_dtype or "fp32"]
        self.master_device = placement.master_device(options.zero.offload_optimizer, self.device)

        context = StrategyContext(
            options=options,
            group=group,
            device=self.device,
            rank=self.rank,
            world_size=self.world_size,
            dtype=self.dtype,
            comm_dtype=self.comm_dtype,
            master_device=self.master_device,
            master_dtype=self.master_dtype,
            comm=self.comm_context,
            stats=self.comm_stats,
        )
        self.sharding: Sharding = sharding_for(self.stage)(
            context, model, init_fn=init_fn, param_groups=param_groups
        )
        self.module = self.sharding.module
        self.shards = self.sharding.shards
        self.num_groups = self.sharding.num_groups

        self.scheduler: Schedule = LRSchedule(options.scheduler, options.optimizer.lr)
        self.scheduler.check_groups(
            self.num_groups, groups_description(param_groups, options.optimizer.decay_1d)
        )
        self.scaler = LossScaler(options.precision)
        self.global_steps = 0
        self.micro_steps = 0
        self._loss_nonfinite: torch.Tensor | None = None
        """Any inf/nan loss in this accumulation window (a device flag: no sync per micro-step)."""
        self._lr = self.lrs_at(0)[0]
        self._window_backwards = 0
        """Backwards since the last accumulation boundary."""
        self._window_start = 0
        """micro_steps at the last accumulation boundary (discard_window() returns there)."""
        self._failed_backward: str | None = None
        """Why a backward of this window raised, until discard_window() ([Note: failed backward])."""

    @property
    def forward_hooks_free(self) -> bool:
        """No engine hook runs inside the model's forward, so torch.compile can take the whole forward as one
        graph: stages 0-2 without overlap_step, and stage 3 where every unit aliases what it holds (world
        size 1, params not offloaded, nothing to cast: [Note: hook-free forward] in stage3/schedule.py).
        Otherwise compile the blocks (models/compiling.py)."""
        return self.sharding.forward_hooks_free

    # ---- training step --------------------------------------------------------------------------------
    def __call__(self, *args, **kwargs):
        with phases.phase(phases.FORWARD):
            self.sharding.begin_forward()
            try:
                return self.module(*args, **kwargs)
            finally:
                self.sharding.end_forward()

    def backward(self, loss: torch.Tensor, *, window_ends: bool | None = None) -> None:
        """loss * loss_scale / gradient_accumulation_steps, backward; the strategy's grad hooks reduce.
        window_ends: whether the step() after this backward will be a boundary, when the caller decides it
        (DeepSpeed's set_gradient_accumulation_boundary before the backward); None: every
        gradient_accumulation_steps-th. Only where offloaded grads go to the host (once, from the window's
        last backward: [Note: device-summed window] in reduce.py); a wrong guess costs time, never values."""
        if loss.dim() != 0:
            raise ValueError(
                f"engine.backward expects a scalar loss, got shape {tuple(loss.shape)}; "
                "reduce it first (e.g. loss.mean())"
            )
        self._refuse_failed_window("backward")
        self.wait_for_step()
        if window_ends is None:
            window_ends = (self.micro_steps + 1) % self.options.gradient_accumulation_steps == 0
        self.sharding.begin_backward(window_ends)
        self._loss_nonfinite = note_nonfinite_loss(self._loss_nonfinite, loss)
        self._window_backwards += 1
        scale = self.scaler.scale / self.options.gradient_accumulation_steps
        with phases.phase(phases.BACKWARD):
            try:
                (loss * scale).backward()
            except BaseException as error:
                self.sharding.abort_backward()
                self._failed_backward = f"{type(error).__name__}: {error}".splitlines()[0][:200]
                raise
            self.sharding.finish_backward()

    def step(self, boundary: bool | None = None) -> StepInfo:
        """Call after every backward; steps the optimizer only at an accumulation boundary: every
        gradient_accumulation_steps-th call, or when `boundary` says so (DeepSpeed's
        set_gradient_accumulation_boundary: the caller decides; any number of backwards per window)."""
        self._refuse_failed_window("step")
        self.wait_for_step()
        self.micro_steps += 1
        if boundary is None:
            boundary = self.micro_steps % self.options.gradient_accumulation_steps == 0
        if not boundary:
            return StepInfo(False, False, None, self.scaler.scale, self._lr)
        self._window_start = self.micro_steps
        backwards, self._window_backwards = self._window_backwards, 0
        loss_nonfinite, self._loss_nonfinite = self._loss_nonfinite, None
        with phases.phase(phases.FINISH_WINDOW):
            device_sq, loss_nonfinite = self.sharding.finish_window(loss_nonfinite, backwards)
        loss_scale = self.scaler.scale
        with phases.phase(phases.NORM):
            scaling = check_and_scale(
                device_sq if device_sq is not None else sum_of_squares(self.sharding.window_grad_tensors()),
                self.group,
                sharded=self.stage > 0,
                loss_scale=loss_scale,
                clip_norm=self.options.gradient_clipping,
                comm_device=self.device,
                stats=self.comm_stats,
                loss_nonfinite=loss_nonfinite,
            )
        skipped = self.scaler.update(scaling.overflow)
        self.sharding.reset_accumulation()
        if skipped:
            self.sharding.release_grads()
            return StepInfo(False, True, scaling.grad_norm, loss_scale, self._lr)
        lrs = self.lrs_at(self.global_steps)
        self._lr = lrs[0]  # StepInfo's lr: the first group's, what DeepSpeed's monitors write (get_lr()[0])
        with phases.phase(phases.STEP):
            self.sharding.step_and_publish(scaling.multiplier, lrs)
        self.sharding.release_grads()
        self.global_steps += 1
        return StepInfo(True, False, scaling.grad_norm, loss_scale, self._lr)

    def discard_window(self) -> None:
        """Drop every grad of the current accumulation window: the micro-steps since the last optimizer step
        count as never run, and the next backward starts the window afresh (the micro-step count returns to
        the last boundary). What a caller does after catching an error raised by backward (an out-of-memory
        error, say) before going on; see [Note: failed backward]. Params and optimizer state are untouched."""
        self.wait_for_step()
        self.sharding.discard_window()
        self._window_backwards = 0
        self._loss_nonfinite = None
        self.micro_steps = self._window_start
        self._failed_backward = None

    def _refuse_failed_window(self, call: str) -> None:
        """[Note: failed backward]
        A backward that raises stops part way: some grads were reduced into the shards (stage 2/3), written
        into the flat grads (stages 0/1) or staged, others never arrived, and the strategies' bookkeeping is
        mid-window. Stepping on that, or running the micro-batch again into it, would apply a wrong gradient
        without a sign, so until the caller drops the window (discard_window) both are refused. At world
        size > 1 only a failure every rank meets the same way can be recovered like this: a rank that fails
        alone leaves the others waiting in a collective, which the launcher ends and reports."""
        if self._failed_backward is None:
            return
        raise RuntimeError(
            f"engine.{call}(): a backward of this accumulation window raised ({self._failed_backward}), so "
            "its grads are only partly reduced. Call engine.discard_window() to drop the window's grads (then "
            "run its micro-batches since the last optimizer step again), or stop the run."
        )

    def lrs_at(self, step: int) -> list[float]:
        """Each param group's lr for the optimizer step after `step` steps (sched.py LRSchedule.lrs_at)."""
        return self.scheduler.lrs_at(step, self.shards.group_lrs)

    def set_schedule(self, schedule: Schedule) -> None:
        """Run the next optimizer steps at `schedule`'s lrs (sched.py Schedule) instead of the options' one,
        e.g. a Hugging Face Trainer's scheduler (hf/optim_sched.py). The checkpoint meta then records
        `schedule.state_dict()`; StepInfo reports its lr for the next step until that step runs."""
        self.scheduler = schedule
        self._lr = self.lrs_at(self.global_steps)[0]

    @contextmanager
    def gathered(self):
        """Forwards of `engine.module` called directly inside read gathered params (generate, a reference
        model's forward outside `engine(...)`). At stage 3 the root unit is gathered for the whole context and
        every other unit as its forward runs, then freed, as in the engine's forward (one unit at a time
        besides the root; synced_gpus keeps ranks in step for these gathers); all is released at the end. A
        no-op at stages 0-2, and inside the engine's forward or backward, or after a forward with grad whose
        backward is still to run (its gathers are in place)."""
        opened = self.sharding.open_forward()
        try:
            yield
        finally:
            if opened:
                self.sharding.end_forward()

    def use_fused_step(self) -> bool:
        """Turn `optimizer.fused_step` on from now on where it can run (option_rules.why_not_fused: Adam /
        AdamW, no optimizer offload); returns whether it is on. Master, moments and step count are the same
        state either way ([Note: fused step]), so the run continues where it is, as a resumed run switching
        it does. What DeepSpeed's engine.compile() turns on with an inductor backend (zerolaunch/api.py); the
        grad shard's dtype, chosen at construction, stays as it is."""
        if self.options.optimizer.fused_step:
            return True
        if why_not_fused(self.options) is not None:
            return False
        self.options = replace(self.options, optimizer=replace(self.options.optimizer, fused_step=True))
        self.shards.fused_step = True  # the strategy read the option once, at construction
        return True

    def wait_for_step(self) -> None:
        """Wait for an overlapped step to finish and publish every param (a no-op without overlap_step).
        Call it before reading params outside a forward after step() (e.g. model.state_dict())."""
        self.sharding.wait_for_step()

    def close(self) -> None:
        """Finish a step in flight, release the nvme swap files now (they are also removed at garbage
        collection and at exit)."""
        self.sharding.close()

    # ---- accounting -----------------------------------------------------------------------------------
    def memory_bytes(self) -> dict[str, int]:
        """Bytes this rank holds per kind (model states and engine buffers; activations not included)."""
        self.wait_for_step()
        return self.sharding.memory_bytes()

    # ---- checkpoint contract: collective-free unless noted ---------------------------------------------
    def owned_fragments(self) -> list[Fragment]:
        """Fragments this rank saves (each element of the model is saved by exactly one rank)."""
        return self.sharding.owned_fragments()

    def load_fragment_state(self, read) -> None:
        """read(kind, name, start, stop) -> flat fp32 tensor. Loads master + optimizer state of the owned
        fragments and the params they fill. The optimizer step count comes from load_state_meta, not from
        "step" fragments."""
        self.wait_for_step()
        self.sharding.load_fragment_state(read)

    def iter_full_state(self, dtype: torch.dtype | None = None) -> Iterator[tuple[str, torch.Tensor]]:
        """COLLECTIVE (call on every rank, iterate to the end): yields (name, full tensor) for every param once
        (a tied alias is not repeated), then every buffer (non-persistent ones too). At stage 3 each tensor is
        gathered one unit at a time. A tensor may be the live param or a view of a gather buffer: copy what you keep.
        A consolidated dict for scripts is api.ZeroLaunchEngine.consolidated_state_dict.

        dtype=None gives the params as the model holds them. Asking fp32 from a 16-bit model gives the fp32
        master, so the values are the exact optimizer weights, not rounded copies.
        """
        self.wait_for_step()
        yield from self.sharding.full_params(dtype)
        for name, b in self.sharding.model_buffers:
            yield name, b.detach() if dtype is None or not b.is_floating_point() else b.detach().to(dtype)
