"""estimate-memory --measure's tables are narrow (3 or 4 columns); their title and caption (the bandwidths,
what was assumed) used to wrap at the table's width, 43 columns, on any terminal. They wrap at the console's.
Leaves out: the numbers (test_offload_cost.py)."""

from __future__ import annotations

import io

from _estimate_setup import bf16_setup
from rich.console import Console

from zerolaunch.cli.estimate import print_narrow_table, render_offload_cost
from zerolaunch.memory import estimate, synthetic_gpt
from zerolaunch.memory.offload_cost import Bandwidths

NOTE = (
    "no CUDA: host<->device assumed as fast as a host memcpy (measured); on a GPU host PCIe is usually slower, "
    "so the offload costs shown are lower bounds"
)


def _printed(width: int) -> list[str]:
    est = estimate(synthetic_gpt(1_300_000_000), bf16_setup(gpus_per_node=8, dtype="bf16"))
    buf = io.StringIO()
    print_narrow_table(
        Console(file=buf, width=width), render_offload_cost(est, Bandwidths(2e10, 1e10, notes=[NOTE]))
    )
    return buf.getvalue().splitlines()


def test_title_and_caption_wrap_at_the_console_width():
    for width in (80, 120):
        lines = _printed(width)
        assert all(len(line) <= width for line in lines)
        title = [line for line in lines if "offload cost per step" in line]
        assert title and len(title[0].rstrip()) > 60, lines  # not cut at the table's ~43 columns
        start = next(i for i, line in enumerate(lines) if line.startswith("no CUDA"))
        caption = [line.rstrip() for line in lines[start:] if line.strip()]
        assert " ".join(caption) == NOTE
        assert len(caption) <= len(NOTE) // (width - 20) + 1, caption  # lines of the console's width
