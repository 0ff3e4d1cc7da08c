"""The dtype names a recipe or a command line may write, defined once.

Torch-free at import so config/ can validate names without torch; `torch_dtype` maps a name when torch is
wanted. (zero/ keeps its own map: it imports only torch and itself.)
"""

from __future__ import annotations

from typing import Any

DTYPES = ("fp32", "bf16", "fp16")


def torch_dtype(name: str) -> Any:
    import torch

    return {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}[name]
