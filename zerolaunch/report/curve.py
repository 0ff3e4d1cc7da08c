"""The loss curve drawn in the terminal at the end of a run, with unicode block characters.

This module owns the binning of a loss series into a fixed number of columns and its drawing as rows of
text; it needs no plotting library and returns plain strings, so the same lines go to a terminal or a log.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

# Eighths of a cell, empty to full: each column's height is resolved to 1/8 of a row.
_BLOCKS = " ▁▂▃▄▅▆▇█"


def bin_series(values: Sequence[float], width: int) -> list[float | None]:
    """Mean of each of `min(len(values), width)` contiguous bins; None for a bin with no finite value.

    Bins are as equal as integer division allows (bin i covers values[i*n//w : (i+1)*n//w]), so every value
    lands in exactly one bin and the curve's x axis is linear in steps.
    """
    if width < 1:
        raise ValueError(f"curve width must be >= 1, got {width}")
    n = len(values)
    columns = min(n, width)
    binned: list[float | None] = []
    for i in range(columns):
        chunk = [v for v in values[i * n // columns : (i + 1) * n // columns] if math.isfinite(v)]
        binned.append(sum(chunk) / len(chunk) if chunk else None)
    return binned


def draw_curve(values: Sequence[float], *, width: int = 60, height: int = 8) -> list[str]:
    """Rows of block characters (top row first); [] when there is nothing to draw.

    More values than `width`: one column per bin. Fewer: each value is repeated over width // n columns,
    so a short run still fills most of the width. The y axis spans [min, max] of the binned values; a flat
    series is drawn at half height so it is visible. A bin that held only nan/inf stays blank.
    """
    if height < 1:
        raise ValueError(f"curve height must be >= 1, got {height}")
    binned = bin_series(values, width)
    finite = [v for v in binned if v is not None]
    if not finite:
        return []
    low, high = min(finite), max(finite)
    levels = height * 8
    column_eighths = []
    for v in binned:
        if v is None:
            column_eighths.append(0)
        elif high == low:
            column_eighths.append(levels // 2)
        else:
            # At least one eighth, so the minimum is drawn rather than left blank like a missing bin.
            column_eighths.append(max(1, round((v - low) / (high - low) * levels)))
    repeat = max(1, width // len(column_eighths))
    column_eighths = [e for e in column_eighths for _ in range(repeat)]
    rows = []
    for row in range(height):
        floor_eighths = (height - 1 - row) * 8
        rows.append("".join(_BLOCKS[min(8, max(0, e - floor_eighths))] for e in column_eighths))
    return rows


def render_curve(
    steps: Sequence[int], losses: Sequence[float], *, width: int = 60, height: int = 8
) -> list[str]:
    """A title, the drawn curve with its axes labelled (max / min loss on the left, first / last step below)."""
    rows = draw_curve(losses, width=width, height=height)
    if not rows:
        return ["loss curve: no finite loss was logged"]
    averaged = f", each column the mean of ~{len(losses) / width:.1f} steps" if len(losses) > width else ""
    title = f"loss curve ({len(losses)} steps{averaged})"
    finite = [v for v in bin_series(losses, width) if v is not None]
    top, bottom = f"{max(finite):.4g}", f"{min(finite):.4g}"
    label_width = max(len(top), len(bottom))
    lines = [title]
    for i, row in enumerate(rows):
        label = top if i == 0 else bottom if i == len(rows) - 1 else ""
        lines.append(f"{label:>{label_width}} │{row}")
    columns = len(rows[0])
    first, last = f"step {steps[0]}", f"step {steps[-1]}"
    axis = first + " " * max(1, columns - len(first) - len(last)) + last
    lines.append(" " * label_width + " └" + "─" * columns)
    lines.append(" " * (label_width + 2) + axis)
    return lines
