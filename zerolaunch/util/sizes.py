"""Parsing of human-sized inputs: byte sizes ("80GiB", for every command), counts ("7e9", "1.3B"), dtypes; and
the one on-screen form of a byte count (`fmt_bytes`), which the disk-error paragraph below every layer prints too.

Owns the wording of the errors for these inputs (each names the bad value and a form that works); it knows
nothing of models or the engine. Torch-free: the `--params` path must answer without importing torch.
"""

from __future__ import annotations

import math
import re

GIB = 1024**3
NA = "n/a"
"""How a missing or non-finite number reads on screen (report/format.py writes every other quantity so too)."""
BINARY_UNITS = (("GiB", 1024**3), ("MiB", 1024**2), ("KiB", 1024))

# The one size convention of every zerolaunch option (estimate-memory, convert-checkpoint, save_hf_pretrained):
# kB/MB/GB/TB are decimal (10**3 ...; Hugging Face's `max_shard_size` reads them so too), KiB/MiB/GiB/TiB
# binary (2**10 ...). A bare K/M/G/T is refused: users mean either, and guessing silently is a bug either way.
_BYTE_UNITS = {
    "": 1,
    "b": 1,
    "kb": 10**3,
    "mb": 10**6,
    "gb": 10**9,
    "tb": 10**12,
    "kib": 2**10,
    "mib": 2**20,
    "gib": 2**30,
    "tib": 2**40,
}
_AMBIGUOUS = {"k": "k", "m": "M", "g": "G", "t": "T"}
SIZE_HELP = "GB = 10^9 bytes, GiB = 2^30 bytes (also kB/MB/TB, KiB/MiB/TiB)"
_COUNT_SUFFIX = {"": 1, "k": 10**3, "m": 10**6, "b": 10**9, "g": 10**9, "t": 10**12}
_NUMBER = r"([+-]?[0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?)"

DTYPE_BYTES = {"fp32": 4, "bf16": 2, "fp16": 2}
_DTYPE_ALIASES = {
    "float32": "fp32",
    "float": "fp32",
    "fp32": "fp32",
    "bfloat16": "bf16",
    "bf16": "bf16",
    "float16": "fp16",
    "half": "fp16",
    "fp16": "fp16",
}


class EstimateError(ValueError):
    """Bad input to the estimate; the message names the problem and the fix. The CLI exits 2 on it."""


def parse_bytes(text: str | int | float, what: str = "--gpu-memory", example: str = "80GiB") -> int:
    """'80GiB' -> 80 * 2**30, '80GB' -> 80 * 10**9, '81920MiB', '85899345920' -> bytes (> 0)."""
    if isinstance(text, (int, float)) and not isinstance(text, bool):
        value, unit = float(text), ""
    else:
        m = re.fullmatch(_NUMBER + r"\s*([a-zA-Z]*)", str(text).strip())
        unit = m.group(2).lower() if m else ""
        if m and unit in _AMBIGUOUS:
            p = _AMBIGUOUS[unit]
            raise EstimateError(
                f"{what}: {text!r} is ambiguous; write {m.group(1)}{p}B ({p}B = 10^{_EXP[unit]} bytes) or "
                f"{m.group(1)}{p.upper()}iB ({p.upper()}iB = 2^{10 * _EXP[unit] // 3} bytes), e.g. {example}"
            )
        if not m or unit not in _BYTE_UNITS:
            raise EstimateError(
                f"{what}: cannot read {text!r} as a size; write a number with a unit, e.g. {example} "
                f"({SIZE_HELP})"
            )
        value = float(m.group(1))
    nbytes = value * _BYTE_UNITS[unit]
    if not math.isfinite(nbytes) or nbytes < 1:
        raise EstimateError(f"{what}: {text!r} is not a positive size; give e.g. {example}")
    return int(nbytes)


_EXP = {"k": 3, "m": 6, "g": 9, "t": 12}


def parse_count(text: str | int | float, what: str = "--params") -> int:
    """'7e9' / '7B' / '1.3b' / '350M' / '125000000' -> a positive integer count."""
    if isinstance(text, (int, float)) and not isinstance(text, bool):
        value, suffix = float(text), ""
    else:
        m = re.fullmatch(_NUMBER + r"\s*([a-zA-Z]?)", str(text).strip().replace("_", ""))
        if not m or m.group(2).lower() not in _COUNT_SUFFIX:
            raise EstimateError(f"{what}: cannot read {text!r} as a count; write e.g. 7e9, 7B, 1.3B or 350M")
        value, suffix = float(m.group(1)), m.group(2).lower()
    count = value * _COUNT_SUFFIX[suffix]
    if not math.isfinite(count) or count < 1:
        raise EstimateError(f"{what}: {text!r} must be a positive count, e.g. 7e9")
    return int(round(count))


def positive_int(value: int, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise EstimateError(f"{what} must be a whole number >= 1, got {value!r}")
    return value


def normalize_dtype(text: str, what: str = "--dtype") -> str:
    name = _DTYPE_ALIASES.get(str(text).strip().lower())
    if name is None:
        raise EstimateError(f"{what}: unknown dtype {text!r}; use one of bf16, fp16, fp32")
    return name


def gib(nbytes: float) -> float:
    return nbytes / GIB


def fmt_bytes(num_bytes: float | None) -> str:
    """1.25 GiB / 12.0 MiB / 512 B: the largest binary unit that keeps the number >= 1."""
    if num_bytes is None or not math.isfinite(num_bytes):
        return NA
    for unit, size in BINARY_UNITS:
        if abs(num_bytes) >= size:
            return f"{num_bytes / size:.2f} {unit}"
    return f"{num_bytes:.0f} B"
