"""The engine meta and replicated tensors of a checkpoint, shared by the stage 0-2 and stage 3 engines.

Owns: frozen params + buffers (identical on every rank), and the JSON-able meta (steps, schedule, loss scale,
the optimizer's step count). It relies on attributes both engines set up the same way (`_frozen`, `_buffers`,
`scheduler`, `scaler`, `optimizer`, `master`, `nvme`, `master_device`, `_state_tensor`,
`_optimizer_step_count`); the sharded fragments stay with each engine, whose layouts differ.
"""

from __future__ import annotations

import torch

from .optim import state_kinds


class EngineStateMixin:
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

    def state_meta(self) -> dict:
        return {
            "stage": self.stage,
            "global_steps": self.global_steps,
            "micro_steps": self.micro_steps,
            "optimizer_step": self._optimizer_step_count(),
            "scheduler": self.scheduler.state_dict(),
            "loss_scaler": self.scaler.state_dict(),
        }

    def load_state_meta(self, meta: dict) -> None:
        self.global_steps = int(meta["global_steps"])
        self.micro_steps = int(meta.get("micro_steps", 0))
        self.scheduler.load_state_dict(meta["scheduler"])
        self.scaler.load_state_dict(meta["loss_scaler"])
        step = int(meta.get("optimizer_step", self.global_steps))
        if self.nvme is not None:
            self.nvme.step_count = step
        elif step > 0 or self.optimizer.state:
            for g, master in enumerate(self.master):
                for kind in state_kinds(self.options.optimizer):
                    self._state_tensor(kind, g)
                state = self.optimizer.state[master]
                old = state.get("step")
                state["step"] = torch.tensor(
                    float(step),
                    dtype=old.dtype if old is not None else torch.float32,
                    device=old.device if old is not None else self._step_device(),
                )
        self._lr = self.scheduler.lr_at(self.global_steps)

    def _step_device(self) -> torch.device:
        # fused optimizers keep "step" on the params' device; the others on the CPU.
        return self.master_device if self.optimizer.defaults.get("fused") else torch.device("cpu")
