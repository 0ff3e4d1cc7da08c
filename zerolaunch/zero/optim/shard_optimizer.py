"""A rank's fp32 master shards and optimizer state, and the optimizer step over them, chunk by chunk.

This module owns, per param group, the rank's flat fp32 master, the optimizer's per-element state
(`torch_optim.state_kinds`) and the step count every element shares, wherever they live (`ShardOptimizer`):
- resident: flat tensors on the accelerator (no offload) or in host memory (offload_optimizer cpu, the
  master pinned when asked, since it is the source of the host->device copies);
- in a swap file (offload_optimizer nvme): nvme_store.SwapStore, streamed through its host buffers.
The step runs a torch optimizer (fused where the device has one) over one `Chunk` at a time and calls
`on_stepped(chunk_index, master_view)` after each, so an engine can start sending that chunk back to the
device while the next one steps ([Note: offload pipeline]). Clipping and loss-scale unscaling arrive as
one gradient multiplier, folded into the fused kernel (its `grad_scale` input, as torch's GradScaler
uses it), so the step reads each gradient once and no separate pass scales them.
It does not own the grad shards, the global norm or any collective (torch_optim.py and the engines do).

[Note: offload pipeline]
With offload_optimizer cpu, an engine cuts each bucket's shard into chunks of at most HOST_CHUNK_NUMEL
elements. Once chunk k has stepped, its fp32 master is copied host->device without blocking (pinned
memory, cast to the compute dtype on the device), so the copy runs on the copy engine while the CPU steps
chunk k+1; a bucket's all-gather is issued as soon as its last chunk was sent. Only the last chunk's copy
and the last bucket's all-gather remain exposed. The pinned master is written again only by the next
step, which starts after the engine synchronized with the device (placement.sync), so no copy is still
reading it then.

[Note: bf16 master]
precision.master_dtype bf16 (DeepSpeed's bf16.bf16_master_weights_and_grads and bf16_optimizer_states, both
true) is pure bf16 training: master and optimizer state in bf16, as plain torch keeps bf16 params and AdamW
moments, 2 + 2x2 bytes per element instead of 4 + 2x4. The step reads bf16 grads: torch's fused AdamW over a
chunk of bf16 tensors (fp32 arithmetic, rounded once), or the fused step's kernel, which computes the same in
fp32 and rounds once. At world size 1 the grad shard is bf16 already ([Note: compute-dtype grads] in
../grad_shards.py); elsewhere the fp32 shard a reduce-scatter (or a window's accumulation) wrote is rounded
as the step reads it (DeepSpeed sums its bf16 grads in bf16: summing in fp32 rounds less). Clipping multiplies
the bf16 grads in fp32 and rounds the product to bf16, as DeepSpeed's unscale_and_clip_grads and torch's
clip_grad_norm_ write clipped bf16 grads in place; with an fp32 master the factor stays inside the step.
So at world size 1 torch's step gives plain torch's pure-bf16 training bit for bit (tests/unit/
test_bf16_master.py), and at N ranks the weights of a reference that averages the ranks' bf16 grads in fp32
(tests/dist/test_bf16_master_ranks.py); the fused step, the same arithmetic in another order, agrees to a
bf16 rounding. The master stays on the device (the CPU step keeps fp32 state).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

import torch

from .. import placement
from ..option_rules import fused_step_blocker
from ..options import OffloadOptions, OptimizerOptions
from .fused_step import adam_chunk_for, constants_traced, step_scalars
from .nvme_store import SwapStore
from .torch_optim import build_optimizer, state_kinds

if TYPE_CHECKING:
    from ..grad_shards import GradShards

HOST_CHUNK_NUMEL = 1 << 24
"""Elements per chunk of a host (cpu offload) step: 64 MiB of fp32 master, a few ms of copy at PCIe rates,
large enough that the per-chunk Python overhead (~50 us) is noise and small enough that the one copy
left exposed at the end of the step is short."""


@dataclass(frozen=True)
class Chunk:
    group: int
    """Optimizer param group."""
    offset: int
    """First element inside this rank's flat fp32 shard of `group`."""
    numel: int
    owner: int = 0
    """The engine's own index of what the chunk belongs to (a bucket), passed through untouched."""
    owner_offset: int = 0
    """Where the chunk starts inside its owner's shard."""


def split_chunks(chunks: Iterable[Chunk], max_numel: int | None) -> list[Chunk]:
    """Each chunk cut into consecutive pieces of at most max_numel elements (None: left whole)."""
    out: list[Chunk] = []
    for chunk in chunks:
        if not max_numel or chunk.numel <= max_numel:
            out.append(chunk)
            continue
        for start in range(0, chunk.numel, max_numel):
            out.append(
                replace(
                    chunk,
                    offset=chunk.offset + start,
                    numel=min(max_numel, chunk.numel - start),
                    owner_offset=chunk.owner_offset + start,
                )
            )
    return out


def _nbytes(tensors: Iterable[torch.Tensor]) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


class ShardOptimizer:
    """Master + optimizer state of one rank's shards (per param group), stepped chunk by chunk."""

    def __init__(
        self,
        options: OptimizerOptions,
        offload_options: OffloadOptions,
        group_numels: list[int],
        groups: list[dict] | list[float],
        chunks: list[Chunk],
        *,
        device: torch.device,
        rank: int = 0,
        fused_step: bool = False,
        master_dtype: torch.dtype = torch.float32,
        master_tensors: list[torch.Tensor] | None = None,
    ):
        """`device`: where a resident master lives (the accelerator, or the CPU when offloaded).
        `chunks` must tile every group's [0, numel) exactly once; they are stepped in list order.
        `fused_step`: Adam / AdamW chunks are stepped by fused_step.adam_chunk, which also writes each
        chunk's params when `step` is given `publish_into` ([Note: fused step]); needs a resident master.
        `master_dtype`: of the master and the optimizer state (bf16: [Note: bf16 master]; resident only).
        `master_tensors`: one flat tensor per group (group_numels long, master_dtype, on `device`) that IS the
        master, stepped in place: the engine's params where they hold exactly the master ([Note: master is
        params] in ../flat/flat_sharding.py); memory_bytes() then counts no master of its own."""
        if master_dtype != torch.float32 and offload_options.device != "none":
            raise ValueError(
                "a bf16 master stays on the device (zero/option_rules.py refuses it with offload)"
            )
        self.master_dtype = master_dtype
        blocker = fused_step_blocker(options.name, offload_options.device) if fused_step else None
        if blocker is not None:
            raise ValueError(f"the fused step is Adam / AdamW over a master on the device: {blocker[0]}")
        self.fused_step = fused_step
        self._decoupled_decay = options.name == "adamw"
        self.kinds = state_kinds(options)
        self.counts_steps = options.name in ("adam", "adamw")
        """Adam keeps a step count (checkpointed as "step"); SGD keeps none, as torch's."""
        self.master_is_external = master_tensors is not None
        """The master is the caller's tensors (not counted in memory_bytes(), not filled by initialize())."""
        self.chunks = list(chunks)
        self.device = torch.device(device)
        self.group_numels = list(group_numels)
        self.step_count = 0
        """Optimizer steps taken (the Adam "step" every element shares)."""
        self.store: SwapStore | None = None
        self.master: list[torch.Tensor] = []
        self.state: list[dict[str, torch.Tensor]] = []
        if offload_options.device == "nvme":  # nvme_path given: zero/option_rules.py
            self.store = SwapStore(
                offload_options.nvme_path,
                [c.numel for c in self.chunks],
                ("master", *self.kinds),
                offload_options.buffer_count,
                rank=rank,
                pin=offload_options.pin_memory,
            )
        else:
            pin = offload_options.pin_memory and offload_options.device == "cpu"
            if master_tensors is not None:
                # by device type: an engine given "cuda" holds buffers on "cuda:0", the same place
                shapes = [(t.numel(), t.dtype, t.device.type) for t in master_tensors]
                if shapes != [(n, master_dtype, self.device.type) for n in group_numels]:
                    raise ValueError(f"master_tensors {shapes} are not {group_numels} x {master_dtype} here")
                self.master = list(master_tensors)
            else:
                self.master = [
                    placement.zeros(n, self.device, pin=pin, dtype=master_dtype) for n in group_numels
                ]
            self.state = [
                {k: torch.zeros(n, dtype=master_dtype, device=self.device) for k in self.kinds}
                for n in group_numels
            ]
        # one torch optimizer per param group (its weight decay, lr, betas, eps), whose single param is
        # swapped for each chunk's master view; the placeholder only satisfies the constructor and is never
        # stepped. A bare float is a group's weight decay with the optimizer's other options.
        groups = [g if isinstance(g, dict) else {"weight_decay": g} for g in groups]
        self._placeholders = [torch.zeros(1, device=self.device, dtype=master_dtype) for _ in groups]
        self._optimizers = [
            build_optimizer(options, [{**g, "params": [p]}], self.device)
            for p, g in zip(self._placeholders, groups, strict=True)
        ]
        # each group's own lr (None: the optimizer's); the schedule turns them into this step's lrs
        # (sched.py LRSchedule.lrs_at), passed to step() as one lr per group.
        self.group_lrs = [None if g.get("lr") is None else float(g["lr"]) for g in groups]
        self._fused = bool(self._optimizers and self._optimizers[0].defaults.get("fused"))

    # ---- sizes ----------------------------------------------------------------------------------------
    def memory_bytes(self) -> dict[str, int]:
        """{"master", "optimizer"} bytes held in memory, + "nvme" (bytes on disk) for a swap file, whose
        host footprint is only the staging buffers (counted as "optimizer")."""
        if self.store is not None:
            return {"master": 0, "optimizer": self.store.buffer_bytes, "nvme": self.store.file_bytes}
        return {
            "master": 0 if self.master_is_external else _nbytes(self.master),
            "optimizer": _nbytes(t for s in self.state for t in s.values()),
        }

    def close(self) -> None:
        """Delete the swap file now (it is also removed at garbage collection and at exit)."""
        if self.store is not None:
            self.store.close()

    def copy_may_overlap(self, view: torch.Tensor) -> bool:
        """Whether a copy out of a view this optimizer handed to `on_stepped` may run without blocking: it
        must be pinned, and not an nvme buffer, which is refilled as soon as the callback returns."""
        return self.store is None and view.is_pinned()

    # ---- chunks ---------------------------------------------------------------------------------------
    def _views(
        self, order: Iterable[int] | None = None, *, read: bool = True, write: bool = True
    ) -> Iterator[tuple[int, dict]]:
        """(chunk index, {"master" and each state kind: fp32 view}) for every chunk of `order` (default: all,
        in list order); under nvme the views are valid until the next item (read ahead / written behind)."""
        order = range(len(self.chunks)) if order is None else order
        if self.store is not None:
            yield from self.store.sweep(order, read=read, write=write)
            return
        for c in order:
            chunk = self.chunks[c]
            sl = slice(chunk.offset, chunk.offset + chunk.numel)
            views = {"master": self.master[chunk.group][sl]}
            views.update({k: t[sl] for k, t in self.state[chunk.group].items()})
            yield c, views

    @torch.no_grad()
    def initialize(self, fill: Callable[[int, torch.Tensor], None]) -> None:
        """fill(chunk index, master view) writes each chunk's initial fp32 master (an external master holds
        it already); the state starts at 0."""
        for c, views in self._views(read=False):
            if not self.master_is_external:
                fill(c, views["master"])
            for kind in self.kinds:
                views[kind].zero_()

    @torch.no_grad()
    def step(
        self,
        grads: GradShards,
        lr: float | Sequence[float],
        on_stepped: Callable[[int, torch.Tensor], None],
        *,
        grad_multiplier: torch.Tensor | None = None,
        order: Iterable[int] | None = None,
        publish_into: Callable[[int], torch.Tensor | None] | None = None,
    ) -> None:
        """Step every chunk with its slice of `grads` (the grad shards on this device: fp32, or 16-bit,
        [Note: compute-dtype grads]) at its group's lr (`lr[group]`; one float: every group's),
        each grad first multiplied by `grad_multiplier` (a scalar tensor; None = 1; a bf16 master reads the
        product rounded to bf16, [Note: bf16 master]). The grads may be left scaled. on_stepped(chunk index,
        master view) runs after each chunk, while its view is valid. `order`: the chunk indices in the order
        to step them (default: list order; each exactly once). `publish_into(chunk index)`: with the fused
        step, a tensor of the chunk's shape the step also writes the new master into (any dtype; None: none),
        before on_stepped."""
        if not isinstance(lr, list | tuple):
            lr = [float(lr)] * len(self._optimizers)
        if self.fused_step:
            self._step_fused(grads, lr, on_stepped, grad_multiplier, order, publish_into)
        else:
            self._step_torch(grads, lr, on_stepped, grad_multiplier, order)
        self.step_count += 1

    def _step_torch(self, grads, lr, on_stepped, grad_multiplier, order) -> None:
        """The step of `step` through the torch optimizer of each chunk's group (fused where it has one)."""
        divisor = None
        rounded = self.master_dtype != torch.float32
        if grad_multiplier is not None:
            multiplier = grad_multiplier.to(self.device, torch.float32).reshape(1)
            # the fused kernels divide by grad_scale: one pass reads each grad once.
            divisor = (1.0 / multiplier) if self._fused and not rounded else None
        for c, views in self._views(order):
            chunk = self.chunks[c]
            # torch's optimizers step grads of the master's dtype: a bf16 master reads bf16 grads (rounded
            # from the fp32 shard, then clipped in bf16 as DeepSpeed does; [Note: bf16 master]), a copy
            grad = grads.window_view(chunk.group, chunk.offset, chunk.numel).to(self.master_dtype)
            if grad_multiplier is not None and rounded:
                grad = (grad.float() * multiplier).to(self.master_dtype)
            elif grad_multiplier is not None and divisor is None:
                grad.mul_(multiplier)
            self._step_chunk(chunk.group, views, grad, lr, divisor)
            on_stepped(c, views["master"])

    def _step_fused(self, grads, lr, on_stepped, grad_multiplier, order, publish_into) -> None:
        """The step of `step` through fused_step.adam_chunk ([Note: fused step]); each group's betas, eps and
        weight decay are those of its torch optimizer's param group, so both paths read one source."""
        kernel = adam_chunk_for(self.device)
        multiplier = None
        if grad_multiplier is not None:
            multiplier = grad_multiplier.to(self.device, torch.float32).reshape(())
        scalars: dict[int, tuple] = {}  # per group: lr and bias corrections of this step, made once
        with constants_traced():
            for c, views in self._views(order):
                chunk = self.chunks[c]
                group = self._optimizers[chunk.group].param_groups[0]
                beta1, beta2 = group["betas"]
                if chunk.group not in scalars:
                    scalars[chunk.group] = step_scalars(
                        lr[chunk.group], beta1, beta2, self.step_count + 1, self.device
                    )
                kernel(
                    views["master"],
                    grads.window_view(chunk.group, chunk.offset, chunk.numel),
                    views["exp_avg"],
                    views["exp_avg_sq"],
                    None if publish_into is None else publish_into(c),
                    multiplier,
                    *scalars[chunk.group],
                    beta1,
                    beta2,
                    group["eps"],
                    group["weight_decay"],
                    self._decoupled_decay,
                )
                on_stepped(c, views["master"])

    def _step_chunk(
        self, group: int, views: dict, grad: torch.Tensor, lr: Sequence[float], divisor: torch.Tensor | None
    ) -> None:
        opt = self._optimizers[group]
        param_group = opt.param_groups[0]
        master = views["master"]
        state = {kind: views[kind] for kind in self.kinds}
        if self.counts_steps:
            # a fill, not torch.tensor(..., device=cuda): no blocking host->device copy per chunk; fp32 whatever
            # the master's dtype (torch's fused kernels read the step count as fp32).
            step_device = master.device if self._fused else torch.device("cpu")
            state["step"] = torch.full((), float(self.step_count), dtype=torch.float32, device=step_device)
        master.grad = grad
        param_group["params"], param_group["lr"] = [master], lr[group]
        opt.state[master] = state
        opt.grad_scale = divisor  # read by torch's fused optimizers (None: no scaling)
        try:
            opt.step()
        finally:
            stepped = opt.state.pop(master)
            param_group["params"] = [self._placeholders[group]]
            master.grad = None
            opt.grad_scale = None
        for kind in self.kinds:
            if stepped[kind] is not views[kind]:  # an optimizer that replaced its state tensor
                views[kind].copy_(stepped[kind])

    # ---- random access (checkpoints, construction) ----------------------------------------------------
    def _pieces(self, group: int, offset: int, numel: int) -> Iterator[tuple[int, int, int, int]]:
        """(chunk index, start inside the chunk, start inside the range, numel) covering a range."""
        if not (0 <= offset and offset + numel <= self.group_numels[group]):
            raise IndexError(
                f"shard elements [{offset}, {offset + numel}) are outside group {group} "
                f"({self.group_numels[group]} elements)"
            )
        for c, chunk in enumerate(self.chunks):
            lo, hi = max(offset, chunk.offset), min(offset + numel, chunk.offset + chunk.numel)
            if chunk.group == group and lo < hi:
                yield c, lo - chunk.offset, lo - offset, hi - lo

    def read(self, kind: str, group: int, offset: int, numel: int) -> torch.Tensor:
        """`kind` ("master" or a state kind) elements [offset, offset + numel) of `group`'s shard: a view
        when resident, a new tensor under nvme."""
        if self.store is None:
            full = self.master[group] if kind == "master" else self.state[group][kind]
            return full[offset : offset + numel]
        out = torch.empty(numel, dtype=torch.float32)
        for c, start, at, n in self._pieces(group, offset, numel):
            out[at : at + n] = self.store.read(kind, c, start, n)
        return out

    @torch.no_grad()
    def write(self, kind: str, group: int, offset: int, values: torch.Tensor) -> None:
        """`kind` elements [offset, offset + values.numel()) of `group`'s shard <- values."""
        values = values.reshape(-1)
        if self.store is None:
            self.read(kind, group, offset, values.numel()).copy_(values)
            return
        for c, start, at, n in self._pieces(group, offset, values.numel()):
            self.store.write(kind, c, start, values[at : at + n])
