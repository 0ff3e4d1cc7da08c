"""`model.init_from`: start training from saved weights instead of the builder's initialisation.

Owns reading model weights (no optimizer state) into the freshly built model, before the engine wraps it:
a `.safetensors` file, a folder with `model.safetensors` or HF-style shards (`model.safetensors.index.json`,
what `zerolaunch convert-checkpoint` writes), or a torch state-dict file (loaded with weights_only=True:
never unpickles code). Names must match exactly; a tied parameter may be stored under any one of its
names. A zerolaunch or DeepSpeed checkpoint folder is not read here: resume it with --resume, or convert it.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from zerolaunch.train.batches import TrainError

INDEX_NAME = "model.safetensors.index.json"


def _read_state(path: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    if path.is_dir():
        if (path / "model.safetensors").is_file():
            return load_file(str(path / "model.safetensors"))
        if (path / INDEX_NAME).is_file():
            shards = sorted(set(json.loads((path / INDEX_NAME).read_text())["weight_map"].values()))
            state: dict[str, torch.Tensor] = {}
            for shard in shards:
                state.update(load_file(str(path / shard)))
            return state
        raise TrainError(
            f"model.init_from {str(path)!r} is a folder without model.safetensors or {INDEX_NAME}; for a "
            "zerolaunch / DeepSpeed checkpoint use --resume PATH, or `zerolaunch convert-checkpoint` it first"
        )
    if path.suffix == ".safetensors":
        return load_file(str(path))
    try:
        state = torch.load(str(path), map_location="cpu", weights_only=True, mmap=True)
    except Exception as err:  # a pickle with code in it, or not a torch file at all
        raise TrainError(
            f"model.init_from {str(path)!r} is not a safetensors or torch state-dict file: {err}"
        ) from None
    if isinstance(state, dict) and "state_dict" in state and isinstance(state["state_dict"], dict):
        state = state["state_dict"]
    if not isinstance(state, dict) or not all(isinstance(v, torch.Tensor) for v in state.values()):
        raise TrainError(f"model.init_from {str(path)!r} does not hold a {{name: tensor}} state dict")
    return state


def load_initial_weights(model: torch.nn.Module, init_from: str) -> None:
    """Copy the weights at `init_from` into `model` (all of them, shapes checked) in place."""
    path = Path(init_from)
    if not path.exists():
        raise TrainError(f"model.init_from {init_from!r} does not exist; give a weights file or folder")
    state = _read_state(path)
    names_of: dict[int, list[str]] = {}
    for name, p in model.named_parameters(remove_duplicate=False):
        names_of.setdefault(id(p), []).append(name)
    targets = dict(model.named_parameters(remove_duplicate=False)) | dict(model.named_buffers())
    missing = [
        names[0]
        for names in names_of.values()
        if not any(n in state for n in names)  # a tied param needs any one of its names
    ]
    missing += [n for n, _ in model.named_buffers() if n not in state and n in model.state_dict()]
    unexpected = [n for n in state if n not in targets]
    if missing or unexpected:
        raise TrainError(
            f"model.init_from {init_from!r} does not match the model: missing {missing[:5]}, unexpected "
            f"{unexpected[:5]}; is model.args the same as for the model that saved it?"
        )
    with torch.no_grad():
        for name, tensor in state.items():
            target = targets[name]
            if tuple(target.shape) != tuple(tensor.shape):
                raise TrainError(
                    f"model.init_from {init_from!r}: {name} has shape {list(tensor.shape)}, the model "
                    f"{list(target.shape)}"
                )
            target.copy_(tensor)
