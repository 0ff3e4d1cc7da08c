"""The engine side of the checkpoint contract, as a mixin of `Engine` (engine.py).

Owns: the param specs, the replicated frozen params + buffers (identical on every rank; stage 3 shards
frozen params over the persistence threshold: `frozen_fragment_state` / `load_frozen_state`), the JSON-able meta (steps, schedule,
loss scale, the optimizer's step count), and the master + optimizer state of the fragments a rank owns, read
from the engine's `shards` (optim.shard_optimizer.ShardOptimizer) wherever they live. Which fragments a rank
owns, and the params they fill, are the sharding strategy's (`owned_fragments()`, `load_fragment_state()`).
"""

from __future__ import annotations

import torch

from .layout import TensorSpec


class EngineStateMixin:
    def param_specs(self) -> list[TensorSpec]:
        dtype_name = str(self.dtype).removeprefix("torch.")
        return [
            TensorSpec(
                name,
                tuple(p.shape),
                str(p.dtype).removeprefix("torch.") if not p.requires_grad else dtype_name,
                p.requires_grad,
                self.sharding.aliases.get(name, ()),
            )
            for name, p in self.sharding.named_params.items()
        ]

    def replicated_state(self) -> dict[str, torch.Tensor]:
        return {name: t.detach() for name, t in self.sharding.frozen_params + self.sharding.model_buffers}

    @torch.no_grad()
    def load_replicated_state(self, state: dict[str, torch.Tensor]) -> None:
        expected = {name: t for name, t in self.sharding.frozen_params + self.sharding.model_buffers}
        missing = sorted(set(expected) - set(state))
        unknown = sorted(set(state) - set(expected))
        if missing or unknown:
            raise ValueError(
                f"replicated state does not match the model: missing {missing}, unknown {unknown}; "
                "was the checkpoint written for another model?"
            )
        for name, t in expected.items():
            t.copy_(state[name])

    def frozen_fragment_state(self) -> dict[str, torch.Tensor]:
        """{f"{name}/{start}": flat tensor in the param's dtype} for the frozen params this rank holds a
        shard of (stage 3); every element is held by one rank. Empty at stages 0-2."""
        return self.sharding.frozen_fragment_state()

    def load_frozen_state(self, read_frozen) -> None:
        """read_frozen(name, start, stop) -> flat tensor, or None to keep the model's values: the frozen
        params this rank shards (stage 3; nothing at stages 0-2, where they are replicated state)."""
        self.sharding.load_frozen_state(read_frozen)

    def fragment_state(self) -> dict[str, torch.Tensor]:
        """{f"{kind}/{name}/{start}": flat tensor} for every owned fragment, in the master's dtype (fp32, or bf16:
        [Note: bf16 master]; the checkpoint writes fp32); "step/..." is 1 element.
        Resident shards give views (no copy); an nvme swap file gives copies, resident until dropped."""
        self.wait_for_step()
        step = torch.tensor([float(self._optimizer_step_count())])
        out: dict[str, torch.Tensor] = {}
        for f in self.owned_fragments():
            for kind in ("master", *self.shards.kinds):
                out[f"{kind}/{f.name}/{f.start}"] = self.shards.read(kind, f.group, f.shard_offset, f.numel)
            out[f"step/{f.name}/{f.start}"] = step
        return out

    def _optimizer_step_count(self) -> int:
        return self.shards.step_count if self.shards.counts_steps else 0

    def state_meta(self) -> dict:
        self.wait_for_step()
        return {
            "stage": self.stage,
            "global_steps": self.global_steps,
            "micro_steps": self.micro_steps,
            "optimizer_step": self._optimizer_step_count(),
            "scheduler": self.scheduler.state_dict(),
            "loss_scaler": self.scaler.state_dict(),
        }

    def load_state_meta(self, meta: dict) -> None:
        self.wait_for_step()
        self.global_steps = int(meta["global_steps"])
        self.micro_steps = int(meta.get("micro_steps", 0))
        self._window_start = self.micro_steps  # checkpoints are taken between windows
        self.scheduler.load_state_dict(meta["scheduler"])
        self.scaler.load_state_dict(meta["loss_scaler"])
        self.shards.step_count = int(meta.get("optimizer_step", self.global_steps))
        self._lr = self.lrs_at(self.global_steps)[0]
