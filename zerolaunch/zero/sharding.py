"""The contract between the one `Engine` (engine.py) and its sharding strategy, and what every strategy shares.

The engine owns the step protocol (loss scaling, accumulation, the boundary's grad norm + clipping + skip,
the lr schedule, the checkpoint meta). A strategy owns where params, grads and the fp32 master live and how
they move between ranks:

- `flat.flat_sharding.FlatSharding`: stages 0-2, params in flat buffers cut into gradient buckets
  (flat/reducer.py).
- `stage3.unit_sharding.UnitSharding`: stage 3, params sharded per unit and gathered just in time
  (stage3/schedule.py).

A strategy is built from a `StrategyContext` (what the engine resolved from the options; frozen, so a
strategy cannot change the engine's placement) and sets at construction the public attributes the engine and
its checkpoint side read: `module`, `named_params` (name -> trainable or frozen param, tied counted once),
`aliases`, `frozen_params`, `model_buffers`, `shards` (optim.shard_optimizer.ShardOptimizer), `grad_shards`
(grad_shards.GradShards: the fp32 grad shards in segments), `num_groups`; and supplies the methods of
`Sharding` below that it overrides.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

import torch
from torch import nn

from . import comm, placement, plan
from .options import EngineOptions


class GradWindow(enum.Enum):
    """Where one slice of the fp32 grad shards (a stage-2 bucket's, a stage-3 unit's, a world-size-1 param's)
    stands in the accumulation window. Each reducer keeps one per slice; `reset_accumulation()` after a step
    sets every slice back to FRESH, which is why the shards need no zeroing pass."""

    FRESH = enum.auto()
    """No grad of this window has reached the slice yet: it still holds the previous window's values (or
    zeros), and the next reduced grad overwrites it (a copy, the exact upcast)."""
    ACCUMULATING = enum.auto()
    """The slice holds this window's sum so far: the next reduced grad is added to it."""


@dataclass(frozen=True)
class StrategyContext:
    """The placement and dtypes the engine resolved from the options (Engine.__init__), the one thing a
    strategy is given besides the model: a strategy reads the engine through nothing else."""

    options: EngineOptions
    group: object
    """The process group (None: the default group, or no group at world size 1)."""
    device: torch.device
    """The compute device: params, activations, grads before they are reduced."""
    rank: int
    world_size: int
    dtype: torch.dtype
    """The compute dtype of the params."""
    comm_dtype: torch.dtype
    """The dtype grads are reduced in."""
    master_device: torch.device
    """Where the fp32 (or bf16) master, optimizer state and grad shards live."""
    master_dtype: torch.dtype
    comm: comm.CommContext
    """The device, group and CUDA side streams every collective of the strategy is issued with."""
    stats: comm.CommStats

    @property
    def stage(self) -> int:
        return self.options.zero.stage


def master_start(values: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """The values a master starts from, given the model's initial values: those of the model in its compute
    dtype `dtype`, i.e. rounded through it (a no-op for fp32 training; a bf16 master rounds once either way).
    DeepSpeed casts the module to bf16/fp16 before it builds its optimizer (zero.Init stores the params in
    it), so its fp32 master is made from the 16-bit values at every stage. Stages 0-2 get that by copying
    their master from the cast flat buffers; stage 3, which materializes fp32 values unit by unit, rounds
    them here, so that the stage does not change where training starts. Not for a checkpoint's master, which
    is restored exactly."""
    return values if dtype == torch.float32 else values.to(dtype).to(values.dtype)


class Sharding:
    module: nn.Module
    named_params: dict[str, nn.Parameter]
    aliases: dict[str, tuple[str, ...]]
    frozen_params: list[tuple[str, nn.Parameter]]
    model_buffers: list[tuple[str, torch.Tensor]]
    num_groups: int

    def __init__(self, ctx: StrategyContext) -> None:
        self.ctx = ctx

    def _accumulates_directly(self, options: EngineOptions) -> bool:
        """plan.accumulates_directly: world size 1 without offload, grads written straight into the shards
        from their hooks (flat/reducer.py DirectAccumulator, [Note: direct grads] in stage3/schedule.py). A
        method: tests force the reducing path to compare the two."""
        precision = options.precision
        return plan.accumulates_directly(
            options.zero.stage,
            self.ctx.world_size,
            options.zero.offload_optimizer.device != "none",
            precision.dtype,
            precision.communication_dtype or "fp32",
            options.gradient_accumulation_steps,
        )

    def _compute_grad_dtype(self, direct: bool) -> torch.dtype | None:
        """The dtype a window's grad shards start in when it is not fp32 ([Note: compute-dtype grads] in
        grad_shards.py; plan.grads_in_compute_dtype decides), for GradShards(compute_dtype=...); `direct`: the
        strategy takes the world-size-1 direct path."""
        options = self.ctx.options
        in_compute_dtype = plan.grads_in_compute_dtype(
            direct,
            options.precision.dtype,
            options.gradient_accumulation_steps,
            options.optimizer.fused_step,
            options.precision.master_dtype,
        )
        return self.ctx.dtype if in_compute_dtype else None

    # ---- hooks around forward and backward (no-ops unless a strategy needs them) ---------------------
    @property
    def forward_hooks_free(self) -> bool:
        """No hook of the strategy runs inside the model's forward (its grad hooks run in backward), so
        torch.compile may trace the whole forward as the model's own code (api.py compile)."""
        return True

    def begin_forward(self) -> None:
        pass

    def end_forward(self) -> None:
        pass

    def open_forward(self) -> bool:
        """Begin a forward for a call of the module outside the engine's (Engine.gathered) when one is
        needed; True when begun (end_forward closes it)."""
        return False

    def begin_backward(self, window_ends: bool = True) -> None:
        """window_ends: the engine expects this backward to be its window's last ([Note: device-summed
        window] in reduce.py: the strategies that sum offloaded grads on the device copy them out then)."""

    def abort_backward(self) -> None:
        """backward() raised: leave the hooks ready for the next forward."""

    def finish_backward(self) -> None:
        """After each micro-step's backward: drain what the grad hooks started."""

    def discard_window(self) -> None:
        """Drop this accumulation window's grads (Engine.discard_window, after a backward that raised:
        [Note: failed backward] in engine.py): the collectives the grad hooks started are awaited, staged
        grads dropped, every slice of the grad shards FRESH again and the shards released, no param keeps a
        .grad. The next backward starts a window as after a step."""
        raise NotImplementedError

    def _drop_param_grads(self) -> None:
        """No param keeps a .grad a failed backward left (a hook that did not run to its end)."""
        for p in self.named_params.values():
            p.grad = None

    # ---- the boundary --------------------------------------------------------------------------------
    def finish_window(self, loss_nonfinite: torch.Tensor | None, backwards: int):
        """At an accumulation boundary: bring the window's grads into `grad_shards` (on the host, with the
        host synced: `_await_host_grads`). `backwards`: how many backwards the window had
        (gradient_accumulation_steps, or any number when the caller sets the boundary). Returns (sum of squares of the window's grads taken on the device, or None
        for the engine to take it from the shards; the loss flag the norm check should still OR in, or None
        where the strategy already put it into the grads)."""
        raise NotImplementedError

    def _await_host_grads(self) -> None:
        """[Note: boundary sync]
        With the grad shards on the host (optimizer offload), the host reads them next (their norm, the CPU
        step): wait until the device has finished the copies into them. With the shards on the device nothing
        on the host reads them, and the engine's norm check waits for the stream anyway, right after the
        norm's kernels are queued: check_and_scale reads the sum of squares and the norm in one transfer (the
        step's only read, before any step kernel is queued; a read after them, such as a float() of the norm
        for StepInfo, would wait for the whole step). Waiting here too would drain the queue first, so the
        GPU would sit idle while the host launched the norm's kernels."""
        if plan.host_waits_at_boundary(self.ctx.device.type, self.ctx.master_device.type):
            placement.sync(self.ctx.device)

    def reset_accumulation(self) -> None:
        """After the norm check: the next window starts accumulating afresh."""

    def step_and_publish(self, grad_multiplier: torch.Tensor | None, lr: float) -> None:
        """Step the fp32 shards and bring the updated params back to where the forward reads them."""
        raise NotImplementedError

    def window_grad_tensors(self) -> list[torch.Tensor]:
        """Per grad segment, the tensor holding this window's grads (what the norm reads when finish_window
        gave no device sum of squares)."""
        return self.grad_shards.window_tensors()

    def release_grads(self) -> None:
        """After the step read the grad shards (or a skipped step discarded them): free what the next window
        re-allocates at its first write ([Note: released grad shards] in grad_shards.py)."""
        self.grad_shards.release()

    def wait_for_step(self) -> None:
        """Finish a step still running in the background (only an overlapped step has one)."""

    def close(self) -> None:
        self.shards.close()

    def memory_bytes(self) -> dict[str, int]:
        raise NotImplementedError

    # ---- checkpoint fragments ------------------------------------------------------------------------
    def owned_fragments(self) -> list:
        raise NotImplementedError

    def load_fragment_state(self, read) -> None:
        raise NotImplementedError

    def frozen_fragment_state(self) -> dict[str, torch.Tensor]:
        """{f"{name}/{start}": this rank's elements of a frozen param it shards}; none where frozen params
        are whole on every rank (stages 0-2: they are in replicated_state)."""
        return {}

    def load_frozen_state(self, read_frozen) -> None:
        """Fill the frozen params this rank shards from read_frozen(name, start, stop) (None: keep)."""

    def full_params(self, dtype: torch.dtype | None = None):
        """COLLECTIVE: (name, full tensor) of every param, trainable and frozen (Engine.iter_full_state)."""
        raise NotImplementedError

    def _load_fragments(self, read, fragments) -> None:
        """Master + optimizer state of `fragments` <- read(kind, name, start, stop)."""
        for f in fragments:
            for kind in ("master", *self.shards.kinds):
                self.shards.write(kind, f.group, f.shard_offset, read(kind, f.name, f.start, f.stop))


def nbytes(tensors) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)
