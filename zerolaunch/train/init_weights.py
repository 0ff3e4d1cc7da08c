"""`model.init_from`: start training from saved weights instead of the builder's initialisation.

Owns reading model weights (no optimizer state: the optimizer starts fresh) into the freshly built model,
before the engine wraps it. Accepted: a `.safetensors` file, a folder with `model.safetensors` or HF-style
shards (`model.safetensors.index.json`, what `zerolaunch convert-checkpoint` writes), a torch state-dict
file (loaded with weights_only=True: never unpickles code), and a checkpoint -- a DeepSpeed ZeRO save dir or
tag folder (stages 1-3, any world size) or a zerolaunch checkpoint (folder or root with `latest`). A
checkpoint is read through convert-checkpoint's sources (checkpoint/convert.py, checkpoint/deepspeed.py):
one consolidated fp32 tensor at a time straight into the model, with no converted copy on disk. Names must
match exactly; a tied parameter may be stored under any one of its names.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from zerolaunch.checkpoint.convert import open_source
from zerolaunch.checkpoint.errors import CheckpointError
from zerolaunch.models.hf_load import CheckpointInit, weight_files
from zerolaunch.util.errors import TrainError

INDEX_NAME = "model.safetensors.index.json"


def _is_weights_folder(path: Path) -> bool:
    return (path / "model.safetensors").is_file() or (path / INDEX_NAME).is_file()


def _read_state(path: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    if path.is_dir():
        if (path / "model.safetensors").is_file():
            return load_file(str(path / "model.safetensors"))
        shards = sorted(set(json.loads((path / INDEX_NAME).read_text())["weight_map"].values()))
        state: dict[str, torch.Tensor] = {}
        for shard in shards:
            state.update(load_file(str(path / shard)))
        return state
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


class _StateSource:
    """A loaded {name: tensor} state dict behind the tensors()/read() interface of convert's sources."""

    def __init__(self, state: dict[str, torch.Tensor]):
        self._state = state

    def names(self) -> list[str]:
        return list(self._state)

    def read(self, name: str) -> torch.Tensor:
        return self._state[name]

    def close(self) -> None:
        self._state = {}


class _CheckpointSource:
    """A DeepSpeed or zerolaunch checkpoint, read tensor by tensor (convert-checkpoint's sources)."""

    def __init__(self, source):
        self._source = source
        self._by_name = {t.name: t.source for t in source.tensors()}

    def names(self) -> list[str]:
        return list(self._by_name)

    def read(self, name: str) -> torch.Tensor:
        return self._source.read(self._by_name[name])

    def close(self) -> None:
        self._source.close()


def _open(path: Path, init_from: str, verify: bool = True):
    if path.is_dir() and not _is_weights_folder(path):
        try:
            return _CheckpointSource(open_source(path, verify=verify))
        except CheckpointError as err:
            raise TrainError(
                f"model.init_from {init_from!r} is a folder without model.safetensors or {INDEX_NAME}, and "
                f"not a readable DeepSpeed / zerolaunch checkpoint: {err}"
            ) from None
    return _StateSource(_read_state(path))


def load_initial_weights(model: torch.nn.Module, init_from: str, verify: bool = True) -> None:
    """Copy the weights at `init_from` into `model` (all of them, shapes checked) in place; `verify=False`
    (train --no-verify) reads a zerolaunch checkpoint without its crc32 check."""
    path = Path(init_from)
    if not path.exists():
        raise TrainError(f"model.init_from {init_from!r} does not exist; give a weights file or folder")
    source = _open(path, init_from, verify)
    try:
        _copy_into(model, source, init_from)
    finally:
        source.close()


def safetensors_files(init_from: str) -> dict[str, Path] | None:
    """{tensor name: file} when `init_from` is a safetensors file or a weights folder (read a tensor at a
    time by the stage-3 engine), else None (a torch file or a checkpoint: loaded into a whole model)."""
    path = Path(init_from)
    if path.is_dir() and _is_weights_folder(path):
        return weight_files(path)
    if path.is_file() and path.suffix == ".safetensors":
        from safetensors import safe_open

        with safe_open(str(path), framework="pt") as f:
            return dict.fromkeys(f.keys(), path)
    return None


class _ShapeSource:
    """The names of safetensors files and each tensor's shape (from the headers: nothing is read)."""

    def __init__(self, files: dict[str, Path]):
        from safetensors import safe_open

        self.shapes: dict[str, list[int]] = {}
        for file in sorted(set(files.values())):
            with safe_open(str(file), framework="pt") as f:
                self.shapes.update((n, f.get_slice(n).get_shape()) for n in f.keys())

    def names(self) -> list[str]:
        return list(self.shapes)


def attach_initial_weights(model: torch.nn.Module, files: dict[str, Path], init_from: str) -> None:
    """Stage 3, an HF model built on the meta device: the engine reads each unit's tensors from `files` as it
    shards it (models/hf_load.py CheckpointInit), so no rank holds the whole model. Names and shapes are
    checked here first, against the files' headers, as load_initial_weights checks them."""
    shapes = _ShapeSource(files)
    _check_names(model, shapes.names(), init_from)
    targets = dict(model.named_parameters(remove_duplicate=False)) | dict(model.named_buffers())
    for name, shape in shapes.shapes.items():
        if tuple(targets[name].shape) != tuple(shape):
            raise TrainError(
                f"model.init_from {init_from!r}: {name} has shape {list(shape)}, the model "
                f"{list(targets[name].shape)}"
            )
    model.zerolaunch_init_fn = CheckpointInit(model, files)


def _check_names(model: torch.nn.Module, names: list[str], init_from: str) -> None:
    available = set(names)
    names_of: dict[int, list[str]] = {}
    for name, p in model.named_parameters(remove_duplicate=False):
        names_of.setdefault(id(p), []).append(name)
    targets = dict(model.named_parameters(remove_duplicate=False)) | dict(model.named_buffers())
    missing = [
        group[0]
        for group in names_of.values()
        if not any(n in available for n in group)  # a tied param needs any one of its names
    ]
    persistent = model.state_dict().keys()
    missing += [n for n, _ in model.named_buffers() if n not in available and n in persistent]
    unexpected = [n for n in names if n not in targets]
    if missing or unexpected:
        raise TrainError(
            f"model.init_from {init_from!r} does not match the model: missing {missing[:5]}, unexpected "
            f"{unexpected[:5]}; is model.args the same as for the model that saved it?"
        )


def _copy_into(model: torch.nn.Module, source, init_from: str) -> None:
    names = source.names()
    _check_names(model, names, init_from)
    targets = dict(model.named_parameters(remove_duplicate=False)) | dict(model.named_buffers())
    with torch.no_grad():
        for name in names:  # one tensor in memory at a time (checkpoint sources read on demand)
            tensor = source.read(name)
            target = targets[name]
            if tuple(target.shape) != tuple(tensor.shape):
                raise TrainError(
                    f"model.init_from {init_from!r}: {name} has shape {list(tensor.shape)}, the model "
                    f"{list(target.shape)}"
                )
            target.copy_(tensor)
