"""zero/sched.py: DeepSpeed's WarmupLR / WarmupDecayLR / WarmupCosineLR formulas and the nanoGPT cosine.

The DeepSpeed schedules are checked against sequences DeepSpeed 0.19.8 printed (see DEEPSPEED_0_19_8). The
parity tests' own hand-written schedules (tests/dist/_reference.py) are held to the same literals, so the
reference the engine is compared with is right on its own, not because it agrees with zero/sched.py.
"""

import os
import sys

import pytest

from zerolaunch.zero.options import SchedulerOptions
from zerolaunch.zero.sched import LRSchedule


def test_none_is_constant():
    s = LRSchedule(SchedulerOptions(), 0.3)
    assert [s.lr_at(k) for k in range(3)] == [0.3, 0.3, 0.3]


# Printed once by DeepSpeed 0.19.8 itself (deepspeed/runtime/lr_schedules.py, DS_ACCELERATOR=cpu): a
# torch.optim.SGD with `lr`, the scheduler built on it, then per optimizer step: record param_groups[0]["lr"]
# (the lr that step uses), optimizer.step(), scheduler.step() -- the order DeepSpeed's engine uses
# (_take_model_step steps the scheduler after each applied optimizer step). Literals, not recomputed here.
DEEPSPEED_0_19_8 = {
    "WarmupLR_log": (
        dict(name="WarmupLR", warmup_min_lr=0.001, warmup_max_lr=0.01, warmup_num_steps=5),
        0.01,
        [
            0.001,
            0.001,
            0.0048760890226605385,
            0.007143455750373869,
            0.008752178045321076,
            0.010000000000000002,
            0.010000000000000002,
            0.010000000000000002,
        ],
    ),
    "WarmupLR_linear_default_max": (
        dict(name="WarmupLR", warmup_num_steps=4, warmup_type="linear"),
        0.02,
        [0.0, 0.0, 0.005, 0.01, 0.015, 0.02, 0.02],
    ),
    "WarmupLR_one_step_clamped_to_two": (
        dict(name="WarmupLR", warmup_max_lr=0.01, warmup_num_steps=1, warmup_type="linear"),
        0.01,
        [0.0, 0.0, 0.005, 0.01],
    ),
    "WarmupLR_warmup_longer_than_run": (
        dict(name="WarmupLR", warmup_max_lr=0.01, warmup_num_steps=100, warmup_type="linear"),
        0.01,
        [0.0, 0.0, 0.0001, 0.0002, 0.0003],
    ),
    "WarmupDecayLR_issue_20": (
        dict(name="WarmupDecayLR", total_num_steps=6, warmup_max_lr=0.01, warmup_num_steps=3),
        0.01,
        [0.0, 0.0, 0.0063092975357145736, 0.01, 0.01, 0.006666666666666666],
    ),
    "WarmupDecayLR_linear": (
        dict(
            name="WarmupDecayLR",
            total_num_steps=10,
            warmup_min_lr=0.001,
            warmup_max_lr=0.01,
            warmup_num_steps=4,
            warmup_type="linear",
        ),
        0.01,
        [
            0.001,
            0.001,
            0.0032500000000000003,
            0.0055000000000000005,
            0.007750000000000001,
            0.010000000000000002,
            0.0085,
            0.007,
            0.0055000000000000005,
            0.004,
            0.0025,
            0.001,
        ],
    ),
    "WarmupCosineLR_linear": (
        dict(
            name="WarmupCosineLR",
            total_num_steps=10,
            warmup_min_ratio=0.1,
            warmup_num_steps=3,
            cos_min_ratio=0.05,
            warmup_type="linear",
        ),
        0.02,
        [
            0.0,
            0.002,
            0.008,
            0.013999999999999999,
            0.019059204245072982,
            0.01642315311765797,
            0.012613948872584987,
            0.008386051127415013,
            0.004576846882342032,
            0.001940795754927019,
            0.001,
            0.001,
            0.001,
            0.001,
        ],
    ),
    "WarmupCosineLR_log": (
        dict(name="WarmupCosineLR", total_num_steps=6, warmup_num_steps=4),
        0.02,
        [
            0.0,
            0.0,
            0.01,
            0.015849625007211564,
            0.02,
            0.010001,
            2.0000000000000003e-06,
            2.0000000000000003e-06,
        ],
    ),
}


@pytest.mark.parametrize("case", sorted(DEEPSPEED_0_19_8))
def test_step_for_step_equal_to_deepspeed(case):
    options, lr, expected = DEEPSPEED_0_19_8[case]
    s = LRSchedule(SchedulerOptions(**options), lr)
    assert [s.lr_at(k) for k in range(len(expected))] == pytest.approx(expected, rel=1e-12, abs=1e-15)


@pytest.mark.parametrize("case", sorted(DEEPSPEED_0_19_8))
def test_parity_reference_schedule_equals_deepspeed(case):
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(__file__)), "dist"))
    import _reference

    options, lr, expected = DEEPSPEED_0_19_8[case]
    got = _reference.learning_rates(SchedulerOptions(**options), lr, len(expected))
    assert got == pytest.approx(expected, rel=1e-12, abs=1e-15)


def test_first_steps_run_at_the_warmup_start_like_deepspeed():
    # The issue-20 symptom: the schedule ran one step ahead (second step already warming up).
    s = LRSchedule(SchedulerOptions(name="WarmupLR", warmup_min_lr=0.1, warmup_num_steps=10), 1.0)
    assert s.lr_at(0) == s.lr_at(1) == 0.1 and s.lr_at(2) > 0.1
    c = LRSchedule(SchedulerOptions(name="WarmupCosineLR", total_num_steps=9, warmup_min_ratio=0.5), 1.0)
    assert c.lr_at(0) == 0.0 and c.lr_at(1) == pytest.approx(0.5)


def test_cosine_nanogpt():
    o = SchedulerOptions(name="cosine", warmup_num_steps=3, total_num_steps=13, cos_min_ratio=0.1)
    s = LRSchedule(o, 1.0)
    assert [s.lr_at(k) for k in range(3)] == pytest.approx([0.25, 0.5, 0.75])
    assert s.lr_at(3) == pytest.approx(1.0)
    assert s.lr_at(8) == pytest.approx(0.1 + 0.5 * 0.9)
    assert s.lr_at(13) == s.lr_at(100) == pytest.approx(0.1)
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(__file__)), "dist"))
    import _reference  # the parity tests' nanoGPT get_lr, written separately

    assert _reference.learning_rates(o, 1.0, 101) == pytest.approx([s.lr_at(k) for k in range(101)])


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


def test_engine_applies_deepspeeds_lr_at_each_step():
    # The engine (one process, no process group) with SGD: each step moves the weight by exactly lr * grad,
    # so the lr it really applied is measured, and must be DeepSpeed's issue-20 sequence.
    import torch

    from zerolaunch.zero.engine import Engine
    from zerolaunch.zero.options import EngineOptions, OptimizerOptions, ZeroOptions

    options, lr, expected = DEEPSPEED_0_19_8["WarmupDecayLR_issue_20"]
    engine_options = EngineOptions(
        zero=ZeroOptions(stage=1),
        optimizer=OptimizerOptions(name="sgd", lr=lr),
        scheduler=SchedulerOptions(**options),
        gradient_clipping=0.0,
    )
    model = torch.nn.Linear(1, 1, bias=False)
    engine = Engine(model, engine_options)
    applied = []
    for _ in range(len(expected)):
        before = model.weight.detach().clone()
        loss = model(torch.ones(1, 1)).sum()  # d loss / d w = 1
        engine.backward(loss)
        info = engine.step()
        applied.append(float(before - model.weight.detach()))
        assert info.lr == pytest.approx(applied[-1], abs=1e-7)
    assert applied == pytest.approx(expected, abs=1e-7)


# Printed once by DeepSpeed 0.19.8 as DEEPSPEED_0_19_8, on an SGD of two param groups with their own lr
# (0.01, 0.02): each step's [group 0 lr, group 1 lr]. WarmupLR without warmup_max_lr warms each group up to
# its own lr; a warmup_max_lr (scalar: `_format_param` broadcasts it) is every group's peak, their own lrs
# ignored; WarmupCosineLR scales each group's own lr (`org_lrs`) by one ratio.
DEEPSPEED_0_19_8_GROUPS = {
    "WarmupLR_own_lr": (
        dict(name="WarmupLR", warmup_min_lr=0.001, warmup_num_steps=4),
        [
            [0.001, 0.001],
            [0.001, 0.001],
            [0.0055000000000000005, 0.010499999999999999],
            [0.008132331253245204, 0.016057143756850984],
            [0.010000000000000002, 0.02],
            [0.010000000000000002, 0.02],
        ],
    ),
    "WarmupLR_max_lr": (
        dict(
            name="WarmupLR", warmup_min_lr=0.001, warmup_max_lr=0.05, warmup_num_steps=4, warmup_type="linear"
        ),
        [
            [0.001] * 2,
            [0.001] * 2,
            [0.013250000000000001] * 2,
            [0.025500000000000002] * 2,
            [0.037750000000000006] * 2,
        ]
        + [[0.05] * 2] * 3,
    ),
    "WarmupDecayLR": (
        dict(
            name="WarmupDecayLR",
            total_num_steps=7,
            warmup_min_lr=0.001,
            warmup_max_lr=0.05,
            warmup_num_steps=3,
        ),
        [[0.001] * 2, [0.001] * 2, [0.031915557925001406] * 2, [0.05] * 2, [0.05] * 2]
        + [[0.037750000000000006] * 2, [0.025500000000000002] * 2, [0.013250000000000001] * 2],
    ),
    "WarmupCosineLR": (
        dict(
            name="WarmupCosineLR",
            total_num_steps=7,
            warmup_min_ratio=0.1,
            warmup_num_steps=3,
            cos_min_ratio=0.01,
        ),
        [
            [0.0, 0.0],
            [0.001, 0.002],
            [0.006678367782143115, 0.01335673556428623],
            [0.01, 0.02],
            [0.00855017856687341, 0.01710035713374682],
            [0.00505, 0.0101],
            [0.0015498214331265902, 0.0030996428662531804],
            [0.0001, 0.0002],
        ],
    ),
}


@pytest.mark.parametrize("case", sorted(DEEPSPEED_0_19_8_GROUPS))
def test_per_group_lrs_match_deepspeed(case):
    options, expected = DEEPSPEED_0_19_8_GROUPS[case]
    s = LRSchedule(SchedulerOptions(**options), 0.01)
    got = [s.lrs_at(k, [None, 0.02]) for k in range(len(expected))]
    for mine, theirs in zip(got, expected, strict=True):
        assert mine == pytest.approx(theirs, rel=1e-12, abs=1e-15)
    # a group given the optimizer's lr explicitly is the group that left it out
    assert [s.lrs_at(k, [0.01])[0] for k in range(len(expected))] == [
        s.lr_at(k) for k in range(len(expected))
    ]


def test_no_schedule_and_cosine_keep_each_groups_lr():
    assert LRSchedule(SchedulerOptions(), 0.01).lrs_at(5, [None, 0.02]) == [0.01, 0.02]
    o = SchedulerOptions(name="cosine", warmup_num_steps=3, total_num_steps=13, cos_min_ratio=0.1)
    s = LRSchedule(o, 0.01)
    first, second = s.lrs_at(6, [None, 0.02])
    assert first == s.lr_at(6) and second == pytest.approx(2 * first, rel=1e-12)


# Printed once by DeepSpeed 0.19.8 as DEEPSPEED_0_19_8_GROUPS (SGD, groups' own lrs 0.01 and 0.02), with LISTS
# for warmup_min_lr / warmup_max_lr: `_format_param` keeps a list of one value per group, so each group runs
# from its own min to its own max. Each step's [group 0 lr, group 1 lr]; literals, not recomputed here.
DEEPSPEED_0_19_8_LISTS = {
    "WarmupLR_log_both_lists": (
        dict(name="WarmupLR", warmup_min_lr=(0.0, 1e-4), warmup_max_lr=(1e-2, 5e-3), warmup_num_steps=4),
        [
            [0.0, 0.0001],
            [0.0, 0.0001],
            [0.005, 0.0025499999999999997],
            [0.007924812503605782, 0.003983158126766833],
            [0.01, 0.005],
            [0.01, 0.005],
        ],
    ),
    "WarmupLR_min_list_own_max": (
        dict(name="WarmupLR", warmup_min_lr=(0.001, 0.002), warmup_num_steps=4, warmup_type="linear"),
        [
            [0.001, 0.002],
            [0.001, 0.002],
            [0.0032500000000000003, 0.006500000000000001],
            [0.0055000000000000005, 0.011000000000000001],
            [0.007750000000000001, 0.015500000000000002],
            [0.010000000000000002, 0.020000000000000004],
        ],
    ),
    "WarmupDecayLR_min_list_scalar_max": (
        dict(
            name="WarmupDecayLR",
            total_num_steps=7,
            warmup_min_lr=(0.001, 0.0),
            warmup_max_lr=0.05,
            warmup_num_steps=3,
            warmup_type="linear",
        ),
        [
            [0.001, 0.0],
            [0.001, 0.0],
            [0.017333333333333333, 0.016666666666666666],
            [0.033666666666666664, 0.03333333333333333],
            [0.05, 0.05],
            [0.037750000000000006, 0.037500000000000006],
            [0.025500000000000002, 0.025],
            [0.013250000000000001, 0.0125],
        ],
    ),
}


@pytest.mark.parametrize("case", sorted(DEEPSPEED_0_19_8_LISTS))
def test_per_group_lists_match_deepspeed_exactly(case):
    options, expected = DEEPSPEED_0_19_8_LISTS[case]
    s = LRSchedule(SchedulerOptions(**options), 0.01)
    assert [s.lrs_at(k, [None, 0.02]) for k in range(len(expected))] == expected  # DeepSpeed's very floats


def test_list_of_another_length_is_refused_naming_key_and_counts():
    from zerolaunch.zero.sched import groups_description

    o = SchedulerOptions(name="WarmupLR", warmup_min_lr=(0.0, 1e-4, 0.0), warmup_num_steps=4)
    s = LRSchedule(o, 0.01)
    with pytest.raises(ValueError, match=r"warmup_min_lr is a list of 3 values .* has 2 param groups"):
        s.check_groups(2, groups_description(None, False))
    with pytest.raises(ValueError, match=r"2, decay and no-decay; 1 with train.weight_decay_1d: true"):
        s.check_groups(2, groups_description(None, False))
    with pytest.raises(ValueError, match=r"has 1 param group \(.*weight_decay_1d is true"):
        s.check_groups(1, groups_description(None, True))
    with pytest.raises(ValueError, match=r"has 2 param groups \(the groups of model_parameters\)"):
        s.check_groups(2, groups_description([{}, {}], False))
    s.check_groups(3, "three")  # fits
    with pytest.raises(ValueError, match="warmup_max_lr is a list of 1 value "):
        LRSchedule(
            SchedulerOptions(name="WarmupDecayLR", warmup_max_lr=(0.1,), total_num_steps=5), 0.1
        ).check_groups(2, "two")
    with pytest.raises(ValueError, match=r"warmup_min_lr is a list of 3 values .* has 2 param groups"):
        s.lrs_at(1, [None, None])  # the same check as check_groups, not a second one


def test_engine_refuses_a_list_that_does_not_fit_its_groups():
    import torch

    from zerolaunch.zero.engine import Engine
    from zerolaunch.zero.options import EngineOptions, OptimizerOptions, ZeroOptions

    options = EngineOptions(
        zero=ZeroOptions(stage=1),
        optimizer=OptimizerOptions(name="sgd", lr=0.01),
        scheduler=SchedulerOptions(name="WarmupLR", warmup_max_lr=(0.01, 0.02, 0.03), warmup_num_steps=4),
    )
    model = torch.nn.Linear(2, 2)  # default groups: weight (decay), bias (no decay)
    with pytest.raises(
        ValueError, match=r"warmup_max_lr is a list of 3 values .* 2 param groups \(the default"
    ):
        Engine(model, options)
