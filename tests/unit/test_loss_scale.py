"""zero/loss_scale.py against DeepSpeed's DynamicLossScaler rules (hysteresis, window, minimum, static)."""

import pytest

from zerolaunch.zero.loss_scale import LossScaler
from zerolaunch.zero.options import PrecisionOptions


def test_disabled_for_fp32_and_bf16():
    for dtype in ("fp32", "bf16"):
        s = LossScaler(PrecisionOptions(dtype=dtype))
        # no scaling, but a non-finite step is still skipped (DeepSpeed bf16 skips it too)
        assert s.scale == 1.0 and s.update(True) is True and s.update(False) is False and s.scale == 1.0


def test_static_scale_skips_but_never_moves():
    s = LossScaler(PrecisionOptions(dtype="fp16", loss_scale=128.0))
    assert s.update(True) is True and s.scale == 128.0
    assert s.update(False) is False and s.scale == 128.0


def test_hysteresis_then_halving_then_floor():
    s = LossScaler(PrecisionOptions(dtype="fp16", initial_scale_power=3, hysteresis=2, min_loss_scale=2.0))
    assert s.scale == 8.0
    assert s.update(True) and s.scale == 8.0  # hysteresis 2 -> 1
    assert s.update(True) and s.scale == 4.0
    assert s.update(True) and s.scale == 2.0  # hysteresis is not refilled without growth
    assert s.update(True) and s.scale == 2.0  # never below min_loss_scale


def test_growth_after_window_refills_hysteresis():
    s = LossScaler(PrecisionOptions(dtype="fp16", initial_scale_power=4, loss_scale_window=3, hysteresis=2))
    s.update(True)  # iter 0 overflow: hysteresis 1, scale 16
    scales = []
    for _ in range(6):
        s.update(False)
        scales.append(s.scale)
    # (cur_iter - last_overflow_iter) % window == 0 at iters 3 and 6
    assert scales == [16.0, 16.0, 32.0, 32.0, 32.0, 64.0]
    assert s.cur_hysteresis == 2
    assert s.update(True) and s.scale == 64.0  # the refilled hysteresis absorbs one overflow


def test_state_dict_round_trip():
    a = LossScaler(PrecisionOptions(dtype="fp16", initial_scale_power=5))
    a.update(True)
    a.update(True)
    b = LossScaler(PrecisionOptions(dtype="fp16"))
    b.load_state_dict(a.state_dict())
    assert (b.scale, b.cur_hysteresis, b.cur_iter) == (a.scale, a.cur_hysteresis, a.cur_iter)


@pytest.mark.parametrize(
    "kw,match",
    [
        ({"loss_scale": -1.0}, "loss_scale"),
        ({"hysteresis": 0}, "hysteresis"),
        ({"loss_scale_window": 0}, "loss_scale_window"),
    ],
)
def test_bad_options_name_the_key(kw, match):
    with pytest.raises(ValueError, match=match):
        LossScaler(PrecisionOptions(dtype="fp16", **kw))
