"""ConsoleLines: rank 0's echoed stdout reaches a rich Console as whole lines (printed above a live bar).

Leaves out the bar itself (tests/unit/test_report_follow.py) and the real launcher (tests/e2e)."""

from io import StringIO

from rich.console import Console

from zerolaunch.launch.logs import ConsoleLines


def test_partial_writes_are_joined_into_whole_lines():
    out = StringIO()
    lines = ConsoleLines(Console(file=out, width=200, force_terminal=False, color_system=None))
    lines.write("step 1 | loss [5.5]")  # no newline yet: nothing printed
    assert out.getvalue() == ""
    lines.write(" | lr 1e-3\nstep 2")
    lines.write(" | loss 5.1\n")
    # markup off: "[5.5]" is text, not a rich style tag
    assert out.getvalue().splitlines() == ["step 1 | loss [5.5] | lr 1e-3", "step 2 | loss 5.1"]
