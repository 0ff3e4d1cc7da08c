"""The consolidated 16-bit model a checkpoint carries when `stage3_gather_16bit_weights_on_model_save` is on.

DeepSpeed's `save_16bit_model` gathers the ZeRO-3 shards into one state dict on rank 0 and `torch.save`s it as
`pytorch_model.bin`; Hugging Face's Trainer calls it at each save when that flag is set. zerolaunch writes the
same tensors into the step folder as `model.safetensors` (no pickle; `safetensors.torch.load_file` and
`from_pretrained` read it), streamed: the header is built from the engine's param specs up front, then the
engine's `iter_full_state` gathers one stage-3 unit (or bucket) at a time and rank 0 writes each tensor as it
arrives, so no rank ever holds the whole model, in 16 bits or in fp32.

Owns: the file's name and content. Not: when it is written (save.py) or the byte format (tensorfile.py).
"""

from __future__ import annotations

from pathlib import Path

import torch

from zerolaunch.checkpoint.contract import CheckpointEngine, Model16Engine
from zerolaunch.checkpoint.tensorfile import SafetensorsWriter, dtype_from_name

MODEL16_NAME = "model.safetensors"


def wants_16bit_model(engine: CheckpointEngine) -> bool:
    """Whether the engine's options ask for the consolidated model at save (False for engines without it)."""
    zero = getattr(getattr(engine, "options", None), "zero", None)
    return bool(getattr(zero, "stage3_gather_16bit_weights_on_model_save", False))


def frozen_names(engine: CheckpointEngine) -> set[str]:
    """The params with requires_grad False (and their tied aliases): what DeepSpeed's
    `exclude_frozen_parameters=True` leaves out of a saved model state."""
    return {n for spec in engine.param_specs() if not spec.trainable for n in (spec.name, *spec.aliases)}


def _entries(
    engine: Model16Engine, dtype: torch.dtype, skip: set[str] = frozenset()
) -> list[tuple[str, tuple[int, ...], torch.dtype]]:
    """(name, shape, dtype) in `iter_full_state` order: every param once (tied aliases are not repeated,
    as in DeepSpeed's consolidated state dict), then the buffers; none of `skip`."""
    entries = []
    names = set(skip)
    for spec in engine.param_specs():
        if spec.name in skip:
            continue
        source = dtype_from_name(spec.dtype) if isinstance(spec.dtype, str) else spec.dtype
        entries.append((spec.name, tuple(spec.shape), dtype if source.is_floating_point else source))
        names.add(spec.name)
    for name, t in engine.replicated_state().items():
        if name not in names:  # replicated_state is frozen params + buffers; the params are listed above
            entries.append((name, tuple(t.shape), dtype if t.is_floating_point() else t.dtype))
    return entries


def write_16bit_model(
    engine: Model16Engine,
    folder: Path,
    *,
    rank: int,
    name: str = MODEL16_NAME,
    exclude_frozen_parameters: bool = False,
) -> Path | None:
    """COLLECTIVE (every rank calls it): rank 0 writes `folder/name`; returns its path there.

    The tensors are the model's weights in its compute dtype (bf16 / fp16; fp32 for an fp32 run, as
    DeepSpeed's file holds the module's own dtype). If rank 0's write fails, it still takes part in every
    gather that follows (the other ranks are in them), then raises. exclude_frozen_parameters: as
    DeepSpeed's, the params with requires_grad False are left out of the file.
    """
    dtype = engine.dtype
    skip = frozen_names(engine) if exclude_frozen_parameters else set()
    writer = None
    error: BaseException | None = None
    path = Path(folder) / name
    if rank == 0:
        writer = SafetensorsWriter(path, _entries(engine, dtype, skip), metadata={"format": "pt"})
    for name, tensor in engine.iter_full_state(dtype=dtype):  # every rank iterates it all: it gathers
        if writer is None or error is not None or name in skip:
            continue
        try:
            writer.write(name, tensor if not tensor.is_floating_point() else tensor.to(dtype))
        except Exception as e:  # re-raised after the gathers: the other ranks must not be left waiting
            error = e
    if writer is None:
        return None
    if error is not None:
        writer.abort()
        raise error
    writer.close()
    return path
