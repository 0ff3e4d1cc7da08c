"""train/nonfinite.py: a streak of non-finite steps (loss on any rank, or the global grad norm) opens, a
finite step closes it, max_nonfinite_steps in a row raise NonFiniteStop naming steps, ranks and values;
0 never stops."""

import math

import pytest

from zerolaunch.train.nonfinite import NonFiniteGuard, NonFiniteStop

NAN, INF = math.nan, math.inf


def test_a_finite_step_ends_the_streak():
    g = NonFiniteGuard(3)
    assert g.record(1, [1.0, 2.0], 0.5) is None and not g.open
    assert g.record(2, [1.0, NAN], NAN) is not None and g.open
    assert g.record(3, [1.0, 1.0], INF) is not None and g.open  # grad norm alone counts
    assert g.record(4, [1.0, 1.0], 0.3) is None and not g.open
    assert g.record(5, [INF, 1.0], None) is not None  # off-boundary norm (None): the loss decides
    assert g.record(6, [1.0, 1.0], 0.3) is None


def test_the_limit_stops_with_steps_ranks_and_values():
    g = NonFiniteGuard(2)
    g.record(7, [NAN, 1.0, INF], NAN)
    with pytest.raises(NonFiniteStop) as err:
        g.record(8, [1.0, NAN, 1.0], 2.0)
    msg = str(err.value)
    assert "2 optimizer steps in a row" in msg and "train.max_nonfinite_steps = 2" in msg
    assert "step 7: rank 0 loss nan, rank 2 loss inf; grad norm nan" in msg
    assert "step 8: rank 1 loss nan" in msg and "step 8: rank 1 loss nan; grad" not in msg
    assert "from step 7 on" in msg and "--resume auto" in msg


def test_zero_never_stops():
    g = NonFiniteGuard(0)
    for step in range(1, 50):
        assert g.record(step, [NAN], NAN) is not None
    assert g.open and len(g.streak) == 49
