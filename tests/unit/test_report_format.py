"""Number formatting shared by the progress line and the tables (zerolaunch.report.format)."""

import math

from zerolaunch.report.format import (
    byte_unit,
    fmt_decimal_bytes,
    fmt_eta,
    fmt_float,
    fmt_gib,
    fmt_pct,
    fmt_seconds,
    fmt_tflops,
)
from zerolaunch.util.sizes import fmt_bytes


def test_bytes_binary_and_decimal():
    assert fmt_bytes(512) == "512 B"
    assert fmt_bytes(3 * 1024**2) == "3.00 MiB"
    assert fmt_bytes(1.5 * 1024**3) == "1.50 GiB"
    assert fmt_gib(1024**3 // 4) == "0.25 GiB"
    assert fmt_decimal_bytes(2_100_000_000) == "2.10 GB"
    assert fmt_decimal_bytes(474_112) == "474.11 kB"
    assert fmt_decimal_bytes(None) == "n/a"


def test_one_unit_for_a_column():
    assert byte_unit([10, 2 * 1024**3, None]) == ("GiB", 1024**3)
    assert byte_unit([10, 20]) == ("B", 1)
    assert byte_unit([]) == ("B", 1)


def test_durations_and_percentages():
    assert fmt_seconds(0.0504) == "50 ms" and fmt_seconds(12.345) == "12.35 s"
    assert fmt_eta(45) == "45s" and fmt_eta(185) == "3m05s" and fmt_eta(7620) == "2h07m"
    assert fmt_eta(None) == "n/a" and fmt_eta(-1) == "n/a"
    assert fmt_pct(0.4234) == "42.3%" and fmt_pct(math.nan) == "n/a"


def test_nonfinite_loss_is_shown_not_hidden():
    assert fmt_float(math.nan) == "nan" and fmt_float(math.inf) == "inf" and fmt_float(None) == "n/a"


def test_tflops_small_values_keep_significant_digits():
    assert fmt_tflops(68.814) == "68.81" and fmt_tflops(0.002143) == "0.00214" and fmt_tflops(None) == "n/a"
