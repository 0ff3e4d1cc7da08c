"""How numbers read on screen: bytes, token counts, durations, percentages, "n/a".

This module owns the text form of a number and nothing else, so the progress line and the end-of-run tables
print the same quantity the same way. Bytes (`fmt_bytes`) are util/sizes.py's: the disk-error paragraph, below
every layer, prints them too.
"""

from __future__ import annotations

import math

from zerolaunch.util.sizes import BINARY_UNITS, NA

GIB = 1024**3


def _usable(value) -> bool:
    return value is not None and not (isinstance(value, float) and not math.isfinite(value))


def fmt_gib(num_bytes: float | None) -> str:
    """Always GiB, as torchtitan's per-step memory: a fixed unit keeps a column of log lines comparable."""
    return NA if not _usable(num_bytes) else f"{num_bytes / GIB:.2f} GiB"


def byte_unit(values) -> tuple[str, int]:
    """One binary unit for a column of byte counts: the largest that keeps the biggest value >= 1."""
    largest = max((abs(v) for v in values if _usable(v)), default=0)
    for unit, size in BINARY_UNITS:
        if largest >= size:
            return unit, size
    return "B", 1


def fmt_decimal_bytes(num_bytes: float | None) -> str:
    """2.10 GB / 474.11 kB: decimal units, the ones link bandwidths are quoted in (comm volume per step)."""
    if not _usable(num_bytes):
        return NA
    for unit, size in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if abs(num_bytes) >= size:
            return f"{num_bytes / size:.2f} {unit}"
    return f"{num_bytes:.0f} B"


def fmt_count(value: float | None) -> str:
    """12,345 -- thousands separators, no decimals (token counts and token rates)."""
    return NA if not _usable(value) else f"{value:,.0f}"


def fmt_float(value: float | None, digits: int = 4) -> str:
    if value is None:
        return NA
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)  # "nan" / "inf" is information (a diverged loss), not a missing value
    return f"{value:.{digits}f}"


def fmt_tflops(value: float | None) -> str:
    """68.81 / 0.00214: two decimals from 1 up, three significant digits below (a CPU run is not 0.00)."""
    if not _usable(value):
        return NA
    return f"{value:.2f}" if abs(value) >= 1 else f"{value:.3g}"


def fmt_sci(value: float | None) -> str:
    """3.00e-04: learning rates and loss scales span many decades."""
    return NA if not _usable(value) else f"{value:.2e}"


def fmt_pct(fraction: float | None, digits: int = 1) -> str:
    """0.423 -> 42.3%."""
    return NA if not _usable(fraction) else f"{100 * fraction:.{digits}f}%"


def fmt_seconds(seconds: float | None) -> str:
    """Step-sized durations: 850 ms, 12.3 s."""
    if not _usable(seconds):
        return NA
    if seconds < 1:
        return f"{seconds * 1000:.0f} ms"
    return f"{seconds:.2f} s"


def fmt_eta(seconds: float | None) -> str:
    """Run-sized durations: 45s, 3m05s, 2h07m."""
    if not _usable(seconds) or seconds < 0:
        return NA
    total = int(round(seconds))
    hours, rest = divmod(total, 3600)
    minutes, secs = divmod(rest, 60)
    if hours:
        return f"{hours}h{minutes:02d}m"
    if minutes:
        return f"{minutes}m{secs:02d}s"
    return f"{secs}s"
