"""The dtype names a recipe or a command line may write, for code outside zero/.

The names are zero/options.py's (`DTYPE_NAMES`, torch-free, so config/ can validate names without torch);
`torch_dtype` maps a name with zero/protocol.py's map, imported only when torch is wanted.
"""

from __future__ import annotations

from typing import Any

from zerolaunch.zero.options import DTYPE_NAMES as DTYPES

__all__ = ["DTYPES", "torch_dtype"]


def torch_dtype(name: str) -> Any:
    from zerolaunch.zero.protocol import DTYPES as TORCH_DTYPES

    return TORCH_DTYPES[name]
