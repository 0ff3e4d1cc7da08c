"""zero/sched.py: DeepSpeed's WarmupLR / WarmupDecayLR / WarmupCosineLR formulas and the nanoGPT cosine.

Expected values are written out from DeepSpeed's definitions (deepspeed/runtime/lr_schedules.py), with
last_batch_iteration = the step index.
"""

import math

import pytest

from zerolaunch.zero.options import SchedulerOptions
from zerolaunch.zero.sched import LRSchedule


def test_none_is_constant():
    s = LRSchedule(SchedulerOptions(), 0.3)
    assert [s.lr_at(k) for k in range(3)] == [0.3, 0.3, 0.3]


def test_warmup_lr_log_and_linear():
    log = LRSchedule(
        SchedulerOptions(name="WarmupLR", warmup_min_lr=0.1, warmup_max_lr=1.1, warmup_num_steps=10), 9
    )
    for k in range(10):
        assert log.lr_at(k) == pytest.approx(0.1 + 1.0 * math.log(k + 1) / math.log(10))
    assert log.lr_at(10) == log.lr_at(500) == pytest.approx(1.1)
    lin = LRSchedule(SchedulerOptions(name="WarmupLR", warmup_num_steps=4, warmup_type="linear"), 2.0)
    assert [lin.lr_at(k) for k in range(6)] == pytest.approx([0.0, 0.5, 1.0, 1.5, 2.0, 2.0])


def test_warmup_steps_clamped_to_two_like_deepspeed():
    s = LRSchedule(SchedulerOptions(name="WarmupLR", warmup_num_steps=0), 1.0)
    assert s.lr_at(0) == 0.0 and s.lr_at(1) == pytest.approx(math.log(2) / math.log(2))


def test_warmup_decay_lr():
    o = SchedulerOptions(name="WarmupDecayLR", warmup_num_steps=4, warmup_type="linear", total_num_steps=12)
    s = LRSchedule(o, 1.0)
    assert s.lr_at(3) == pytest.approx(0.75)
    assert s.lr_at(4) == pytest.approx(1.0)  # (12 - 4) / (12 - 4)
    assert s.lr_at(8) == pytest.approx(0.5)
    assert s.lr_at(12) == 0.0 and s.lr_at(20) == 0.0


def test_warmup_cosine_lr():
    o = SchedulerOptions(
        name="WarmupCosineLR",
        warmup_num_steps=4,
        warmup_type="linear",
        total_num_steps=14,
        warmup_min_ratio=0.2,
        cos_min_ratio=0.1,
    )
    s = LRSchedule(o, 2.0)
    assert s.lr_at(0) == pytest.approx(2.0 * 0.2)
    assert s.lr_at(2) == pytest.approx(2.0 * (0.2 + 0.5 * 0.8))
    # DeepSpeed: real_last_step = k - warmup + 1, real_total = total - warmup
    for k in (4, 8, 13):
        ratio = 0.1 + 0.9 * (1 + math.cos(math.pi * (k - 4 + 1) / 10)) / 2
        assert s.lr_at(k) == pytest.approx(2.0 * ratio)


def test_cosine_nanogpt():
    o = SchedulerOptions(name="cosine", warmup_num_steps=3, total_num_steps=13, cos_min_ratio=0.1)
    s = LRSchedule(o, 1.0)
    assert [s.lr_at(k) for k in range(3)] == pytest.approx([0.25, 0.5, 0.75])
    assert s.lr_at(3) == pytest.approx(1.0)
    assert s.lr_at(8) == pytest.approx(0.1 + 0.5 * 0.9)
    assert s.lr_at(13) == s.lr_at(100) == pytest.approx(0.1)


def test_state_round_trip_and_errors():
    s = LRSchedule(SchedulerOptions(name="WarmupLR"), 1.0)
    s.lr_at(7)
    t = LRSchedule(SchedulerOptions(name="WarmupLR"), 1.0)
    t.load_state_dict(s.state_dict())
    assert t.last_step == 7
    with pytest.raises(ValueError, match="total_num_steps"):
        LRSchedule(SchedulerOptions(name="cosine"), 1.0)
    with pytest.raises(ValueError, match="scheduler.name"):
        LRSchedule(SchedulerOptions(name="Bogus"), 1.0)
    with pytest.raises(ValueError, match="scheduler"):
        LRSchedule(SchedulerOptions(name="cosine", total_num_steps=5), 1.0).load_state_dict(s.state_dict())
