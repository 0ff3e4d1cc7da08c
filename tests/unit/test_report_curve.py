"""The terminal loss curve (zerolaunch.report.curve): binning and drawing with block characters."""

import math

import pytest

from zerolaunch.report.curve import bin_series, draw_curve, render_curve


def test_bins_cover_every_value_once_and_average():
    assert bin_series([1.0, 3.0, 5.0, 7.0], 2) == [2.0, 6.0]
    assert bin_series([1.0, 2.0, 3.0], 10) == [1.0, 2.0, 3.0]  # fewer values than columns: one each
    # 7 values in 3 bins: slices [0:2], [2:4], [4:7]
    assert bin_series([1, 1, 2, 2, 3, 3, 3], 3) == [1.0, 2.0, 3.0]


def test_nonfinite_values_are_left_out_of_their_bin():
    assert bin_series([1.0, math.nan, math.inf, math.inf], 2) == [1.0, None]


def test_draw_fixed_size_and_monotone_heights():
    rows = draw_curve([10 - i for i in range(100)], width=40, height=5)
    assert len(rows) == 5
    assert all(len(r) == 40 for r in rows)
    # Column height (count of non-space cells, top row full when highest) decreases left to right.
    heights = [sum(r[c] != " " for r in rows) for c in range(40)]
    assert heights == sorted(heights, reverse=True)
    assert rows[0][0] == "█" and rows[-1][-1] != " "  # the max fills the column, the min is still drawn
    assert set("".join(rows)) <= set(" ▁▂▃▄▅▆▇█")


def test_flat_series_drawn_at_half_height():
    rows = draw_curve([2.0] * 5, width=12, height=4)
    assert rows == [" " * 10, " " * 10, "█" * 10, "█" * 10]  # 5 values x 2 columns each


def test_short_series_is_stretched_to_the_width():
    rows = draw_curve([3.0, 1.0], width=60, height=2)
    assert all(len(r) == 60 for r in rows)
    assert rows[0] == "█" * 30 + " " * 30


def test_render_labels_and_empty_input():
    lines = render_curve([1, 2, 3], [3.0, 2.0, 1.0], width=60, height=3)
    assert lines[0] == "loss curve (3 steps)"
    assert lines[1].startswith("3 │") and lines[3].startswith("1 │")
    assert render_curve(list(range(1, 121)), [1.0] * 120, width=60)[0] == (
        "loss curve (120 steps, each column the mean of ~2.0 steps)"
    )
    assert "step 1" in lines[-1] and "step 3" in lines[-1]
    assert render_curve([1], [math.nan]) == ["loss curve: no finite loss was logged"]


def test_bad_size_is_an_error():
    with pytest.raises(ValueError, match="width must be >= 1"):
        draw_curve([1.0], width=0)
