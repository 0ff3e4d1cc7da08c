"""Encoding of a rank's `extra` dict (RNG states, data position) into JSON plus named tensors.

The training loop hands `save_checkpoint` a nested dict whose leaves are tensors (torch RNG states) or
JSON values; tuples are kept as tuples (Python's `random.setstate` insists on them), which plain JSON would
turn into lists. Tensor leaves become `extra/{dotted.path}` tensors in the rank file. Anything else (a numpy
array, an object) is refused with the key that holds it, so resume never silently loses state.
"""

from __future__ import annotations

import torch

from zerolaunch.checkpoint.errors import CheckpointError

HF_CONFIG_KEY = "hf_config"
"""Key of rank 0's `extra` that holds a Hugging Face config dict, so convert-checkpoint can write config.json."""

HF_TOKENIZER_KEY = "hf_tokenizer"
"""Key of rank 0's `extra` that holds the absolute path of the recipe's tokenizer folder, so convert-checkpoint
copies its files into the output (checkpoint/hf_folder.py)."""

HF_PEFT_KEY = "hf_peft"
"""Key of rank 0's `extra` that holds a PEFT run's adapter config (models/peft.py
adapter_record), so convert-checkpoint writes the adapter folder or the merged model."""

_TENSOR = "__tensor__"
_TUPLE = "__tuple__"


def encode_extra(extra: dict) -> tuple[dict, dict[str, torch.Tensor]]:
    """-> (JSON-able tree, {tensor file key: tensor})."""
    tensors: dict[str, torch.Tensor] = {}

    def enc(value, path: str):
        if isinstance(value, torch.Tensor):
            key = f"extra/{path}"
            tensors[key] = value.detach().cpu()
            return {_TENSOR: key}
        if isinstance(value, dict):
            out = {}
            for k, v in value.items():
                if not isinstance(k, str) or "/" in k or k in (_TENSOR, _TUPLE):
                    raise CheckpointError(
                        f"extra key {path + '.' if path else ''}{k!r} must be a string "
                        f"without '/' (and not {_TENSOR}/{_TUPLE})"
                    )
                out[k] = enc(v, f"{path}.{k}" if path else k)
            return out
        if isinstance(value, tuple):
            return {_TUPLE: [enc(v, f"{path}.{i}") for i, v in enumerate(value)]}
        if isinstance(value, list):
            return [enc(v, f"{path}.{i}") for i, v in enumerate(value)]
        if value is None or isinstance(value, (bool, int, float, str)):
            return value
        raise CheckpointError(
            f"extra[{path!r}] is a {type(value).__name__}: only tensors, dicts, lists, "
            "tuples and JSON scalars can be saved (convert numpy state with torch.from_numpy)"
        )

    if not isinstance(extra, dict):
        raise CheckpointError(f"extra must be a dict, got {type(extra).__name__}")
    return enc(extra, ""), tensors


def decode_extra(tree, read_tensor) -> dict:
    """Inverse of encode_extra; read_tensor(key) returns the stored tensor."""

    def dec(value):
        if isinstance(value, dict):
            if set(value) == {_TENSOR}:
                return read_tensor(value[_TENSOR])
            if set(value) == {_TUPLE}:
                return tuple(dec(v) for v in value[_TUPLE])
            return {k: dec(v) for k, v in value.items()}
        if isinstance(value, list):
            return [dec(v) for v in value]
        return value

    return dec(tree)
