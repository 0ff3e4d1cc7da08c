"""The engine meta and replicated tensors of a checkpoint, shared by the stage 0-2 and stage 3 engines.

Owns: the param specs, frozen params + buffers (identical on every rank), the JSON-able meta (steps, schedule, loss scale,
the optimizer's step count), and the master + optimizer state of the fragments a rank owns, read from and
written to the engine's `shards` (shard_optim.ShardOptimizer) wherever they live. It relies on attributes
both engines set up the same way (`_frozen`, `_buffers`, `scheduler`, `scaler`, `shards`, and
`owned_fragments()`); which fragments a rank owns, and the params they fill, stay with each engine, whose
layouts differ.
"""

from __future__ import annotations

import torch

from . import comm, offload
from .layout import TensorSpec
from .loss_scale import LossScaler
from .protocol import DTYPES
from .sched import LRSchedule


class EngineStateMixin:
    def _init_common(self, options, group, device) -> None:
        """The attributes both constructors set first (placement, dtypes, comm accounting)."""
        self.options = options
        self.group = group
        self.device = torch.device(device)
        self.rank = comm.rank(group)
        self.world_size = comm.world_size(group)
        self.comm_stats = comm.CommStats()
        self.dtype = DTYPES[options.precision.dtype]
        # grads are reduced in fp32 unless asked otherwise: exact sums, FSDP2's choice.
        self.comm_dtype = DTYPES[options.precision.communication_dtype or "fp32"]
        self.master_device = offload.master_device(options.zero.offload_optimizer, self.device)

    def _init_step_state(self) -> None:
        """Schedule, loss scaler and step counters, set last by both constructors."""
        self.scheduler = LRSchedule(self.options.scheduler, self.options.optimizer.lr)
        self.scaler = LossScaler(self.options.precision)
        self.global_steps = 0
        self.micro_steps = 0
        self._loss_nonfinite: torch.Tensor | None = None
        """Any inf/nan loss in this accumulation window (a device flag: no sync per micro-step)."""
        self._lr = self.scheduler.lr_at(0)

    def settle(self) -> None:
        """Finish a step still running in the background (engines with an overlapped step override this)."""

    def param_specs(self) -> list[TensorSpec]:
        dtype_name = str(self.dtype).removeprefix("torch.")
        return [
            TensorSpec(
                name,
                tuple(p.shape),
                str(p.dtype).removeprefix("torch.") if not p.requires_grad else dtype_name,
                p.requires_grad,
                self._aliases.get(name, ()),
            )
            for name, p in self._named.items()
        ]

    def replicated_state(self) -> dict[str, torch.Tensor]:
        return {name: t.detach() for name, t in self._frozen + self._buffers}

    @torch.no_grad()
    def load_replicated_state(self, state: dict[str, torch.Tensor]) -> None:
        expected = {name: t for name, t in self._frozen + self._buffers}
        missing = sorted(set(expected) - set(state))
        unknown = sorted(set(state) - set(expected))
        if missing or unknown:
            raise ValueError(
                f"replicated state does not match the model: missing {missing}, unknown {unknown}; "
                "was the checkpoint written for another model?"
            )
        for name, t in expected.items():
            t.copy_(state[name])

    def fragment_state(self) -> dict[str, torch.Tensor]:
        """{f"{kind}/{name}/{start}": flat fp32 tensor} for every owned fragment; "step/..." is 1 element.
        Resident shards give views (no copy); an nvme swap file gives copies, resident until dropped."""
        self.settle()
        step = torch.tensor([float(self._optimizer_step_count())])
        out: dict[str, torch.Tensor] = {}
        for f in self.owned_fragments():
            for kind in ("master", *self.shards.kinds):
                out[f"{kind}/{f.name}/{f.start}"] = self.shards.read(kind, f.group, f.shard_offset, f.numel)
            out[f"step/{f.name}/{f.start}"] = step
        return out

    def _load_fragments(self, read, fragments) -> None:
        """Master + optimizer state of `fragments` <- read(kind, name, start, stop)."""
        for f in fragments:
            for kind in ("master", *self.shards.kinds):
                self.shards.write(kind, f.group, f.shard_offset, read(kind, f.name, f.start, f.stop))

    def _optimizer_step_count(self) -> int:
        return self.shards.step_count if self.shards.counts_steps else 0

    def state_meta(self) -> dict:
        self.settle()
        return {
            "stage": self.stage,
            "global_steps": self.global_steps,
            "micro_steps": self.micro_steps,
            "optimizer_step": self._optimizer_step_count(),
            "scheduler": self.scheduler.state_dict(),
            "loss_scaler": self.scaler.state_dict(),
        }

    def load_state_meta(self, meta: dict) -> None:
        self.settle()
        self.global_steps = int(meta["global_steps"])
        self.micro_steps = int(meta.get("micro_steps", 0))
        self.scheduler.load_state_dict(meta["scheduler"])
        self.scaler.load_state_dict(meta["loss_scaler"])
        self.shards.step_count = int(meta.get("optimizer_step", self.global_steps))
        self._lr = self.scheduler.lr_at(self.global_steps)
