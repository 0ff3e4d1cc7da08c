"""memory's name for zerolaunch/util/sizes.py (size, count and dtype parsing), which checkpoint/ uses too."""

from zerolaunch.util.sizes import (
    DTYPE_BYTES,
    GIB,
    SIZE_HELP,
    EstimateError,
    gib,
    normalize_dtype,
    parse_bytes,
    parse_count,
    positive_int,
)

__all__ = [
    "DTYPE_BYTES",
    "GIB",
    "SIZE_HELP",
    "EstimateError",
    "gib",
    "normalize_dtype",
    "parse_bytes",
    "parse_count",
    "positive_int",
]
