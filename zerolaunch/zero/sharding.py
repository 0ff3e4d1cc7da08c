"""The contract between the one `Engine` (engine.py) and its sharding strategy, and what every strategy shares.

The engine owns the step protocol (loss scaling, accumulation, the boundary's grad norm + clipping + skip,
the lr schedule, the checkpoint meta). A strategy owns where params, grads and the fp32 master live and how
they move between ranks:

- `flat.flat_sharding.FlatSharding`: stages 0-2, params in flat buffers cut into gradient buckets
  (flat/reducer.py).
- `stage3.unit_sharding.UnitSharding`: stage 3, params sharded per unit and gathered just in time
  (stage3/schedule.py).

A strategy sets at construction: `module`, `_named` (name -> trainable or frozen param, tied counted once),
`_aliases`, `_frozen`, `_buffers`, `shards` (optim.shard_optimizer.ShardOptimizer), `grad_shards`
(grad_shards.GradShards: the fp32 grad shards in segments), `num_groups`; and supplies the methods of `Sharding` below that it overrides.
"""

from __future__ import annotations

import enum

import torch

from . import plan
from .optim import host


class GradWindow(enum.Enum):
    """Where one slice of the fp32 grad shards (a stage-2 bucket's, a stage-3 unit's, a world-size-1 param's)
    stands in the accumulation window. Each reducer keeps one per slice; `reset_accumulation()` after a step
    sets every slice back to FRESH, which is why the shards need no zeroing pass."""

    FRESH = enum.auto()
    """No grad of this window has reached the slice yet: it still holds the previous window's values (or
    zeros), and the next reduced grad overwrites it (a copy, the exact upcast)."""
    ACCUMULATING = enum.auto()
    """The slice holds this window's sum so far: the next reduced grad is added to it."""


class Sharding:
    def __init__(self, engine) -> None:
        # the placement and dtypes the engine resolved from the options (Engine.__init__), copied so
        # that a strategy reads them as its own attributes.
        self.options = engine.options
        self.stage = engine.stage
        self.group = engine.group
        self.device = engine.device
        self.rank = engine.rank
        self.world_size = engine.world_size
        self.comm_stats = engine.comm_stats
        self.comm_context = engine.comm_context
        self.dtype = engine.dtype
        self.comm_dtype = engine.comm_dtype
        self.master_device = engine.master_device
        self.fused_step = engine.options.optimizer.fused_step
        self.master_dtype = engine.master_dtype

    def _compute_grad_dtype(self, direct: bool) -> torch.dtype | None:
        """The dtype a window's grad shards start in when it is not fp32 ([Note: compute-dtype grads] in
        grad_shards.py; plan.grads_in_compute_dtype decides), for GradShards(compute_dtype=...); `direct`: the
        strategy takes the world-size-1 direct path."""
        options = self.options
        in_compute_dtype = plan.grads_in_compute_dtype(
            direct,
            options.precision.dtype,
            options.gradient_accumulation_steps,
            self.fused_step,
            options.precision.master_dtype,
        )
        return self.dtype if in_compute_dtype else None

    # ---- hooks around forward and backward (no-ops unless a strategy needs them) ---------------------
    def begin_forward(self) -> None:
        pass

    def end_forward(self) -> None:
        pass

    def begin_backward(self) -> None:
        pass

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
        for p in self._named.values():
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
        if plan.host_waits_at_boundary(self.device.type, self.master_device.type):
            host.sync(self.device)

    def reset_accumulation(self) -> None:
        """After the norm check: the next window starts accumulating afresh."""

    def step_and_publish(self, grad_multiplier: torch.Tensor | None, lr: float) -> None:
        """Step the fp32 shards and bring the updated params back to where the forward reads them."""
        raise NotImplementedError

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

    def full_params(self, dtype: torch.dtype | None = None):
        """COLLECTIVE: (name, full tensor) of every param, trainable and frozen (Engine.full_state_dict)."""
        raise NotImplementedError

    def _load_fragments(self, read, fragments) -> None:
        """Master + optimizer state of `fragments` <- read(kind, name, start, stop)."""
        for f in fragments:
            for kind in ("master", *self.shards.kinds):
                self.shards.write(kind, f.group, f.shard_offset, read(kind, f.name, f.start, f.stop))


def nbytes(tensors) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)
