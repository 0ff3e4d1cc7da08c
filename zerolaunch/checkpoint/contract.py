"""What an engine must provide for a zerolaunch checkpoint: save, load, and (through the files) reshard.

Structural (`typing.Protocol`): the stage 0-2 engine, the stage 3 engine and tests/_fake_engine.py's
FakeEngine all meet it without inheriting from it, so `zero/` stays free of checkpoint imports. The
checkpoint code (save.py, load.py, model16.py) types its `engine` argument against these classes, and
tests/unit/test_checkpoint_contract.py reads that code to check that every `engine.<member>` it touches is
declared here, so the contract cannot silently fall behind the code.

Three levels:
- `CheckpointEngine`: every engine. Offline resharding (reshard.py) needs no engine at all: it re-plans the
  fragments from the manifest, which holds what these methods wrote.
- `Model16Engine`: also `dtype` and `iter_full_state`, used only when the options ask for the consolidated
  16-bit model (`stage3_gather_16bit_weights_on_model_save`, model16.py).
- `OPTIONAL_MEMBERS`: read with `getattr(engine, name, default)`; an engine without them still saves.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Protocol, runtime_checkable

if TYPE_CHECKING:
    import torch


@runtime_checkable
class ParamSpecLike(Protocol):
    """One model parameter as a checkpoint records it (zero.layout.TensorSpec): every param once."""

    name: str
    shape: Sequence[int]
    dtype: object
    """A torch.dtype or its name without the prefix ("float32")."""
    trainable: bool
    # `aliases` (tied names) is optional: read with getattr, default ().


@runtime_checkable
class FragmentLike(Protocol):
    """Elements [start, stop) of the flattened param `name` this rank owns (zero.layout.Fragment)."""

    name: str
    start: int
    stop: int


ReadFn = Callable[[str, str, int, int], "torch.Tensor"]
"""read(kind, name, start, stop) -> flat fp32 tensor ("step" kinds: 1 element), checkpoint/reader.py."""


@runtime_checkable
class CheckpointEngine(Protocol):
    """The members save_checkpoint / load_checkpoint use, with the meaning they rely on."""

    def param_specs(self) -> Sequence[ParamSpecLike]:
        """Every parameter once (trainable and frozen), in a fixed order; checked against the checkpoint's
        names, shapes and trainability before anything loads."""
        ...

    def owned_fragments(self) -> Iterable[FragmentLike]:
        """The fragments of trainable params whose optimizer state this rank holds. Several ranks may list
        the same fragment (stage 0); the manifest reads it from the first."""
        ...

    def fragment_state(self) -> dict[str, torch.Tensor]:
        """{"kind/name/start": flat tensor} for each owned fragment and each kind (master, exp_avg, ...): the
        fragment's numel elements, or 1 for scalar kinds ("step")."""
        ...

    def load_fragment_state(self, read: ReadFn) -> None:
        """Fill every owned fragment of every kind the engine keeps from `read`, whatever layout saved it."""
        ...

    def replicated_state(self) -> dict[str, torch.Tensor]:
        """Frozen params + buffers, identical on every rank (rank 0's copy is saved)."""
        ...

    def load_replicated_state(self, state: dict[str, torch.Tensor]) -> None: ...

    def state_meta(self) -> dict:
        """JSON-able engine meta, stored verbatim in the manifest and handed back to load_state_meta: the
        engines keep global_steps, micro_steps, the optimizer step, scheduler and loss-scaler state here."""
        ...

    def load_state_meta(self, meta: dict) -> None: ...


@runtime_checkable
class Model16Engine(CheckpointEngine, Protocol):
    """An engine that can also write the consolidated 16-bit model at save (model16.py)."""

    dtype: torch.dtype
    """The compute dtype the consolidated model is written in."""

    def iter_full_state(self, dtype: torch.dtype | None = None) -> Iterable[tuple[str, torch.Tensor]]:
        """COLLECTIVE: (name, full tensor) for every param once, then the buffers, gathered one unit or
        bucket at a time (every rank iterates it; rank 0 writes)."""
        ...


OPTIONAL_MEMBERS: dict[str, str] = {
    "device": "torch.device for the success flags' all-reduce (default cpu)",
    "stage": "ZeRO stage; 0 = replicated optimizer, only rank 0 writes its fragments",
    "module": "the nn.Module, to mark non-persistent buffers in the manifest",
    "frozen_fragment_state": "{'name/start': tensor} of the frozen params this rank shards (stage 3), saved "
    "as frozen fragments; without it frozen params are in replicated_state",
    "load_frozen_state": "load_frozen_state(read_frozen): fill the frozen params this rank shards from "
    "read_frozen(name, start, stop) (None: keep the model's values)",
    "options": "EngineOptions: zero.stage and zero.bucket_numel go into the manifest (resharding re-plans "
    "with the bucket size); zero.stage3_gather_16bit_weights_on_model_save asks for the 16-bit model",
}
"""Members the checkpoint code reads with getattr(engine, name, default), so engines may lack them."""
