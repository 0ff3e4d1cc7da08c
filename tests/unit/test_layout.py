"""zero/layout.py: bucket packing, padding, ownership and fragments; zero/plan.py: the bucket order, default
groups and direct path the engine and estimate-memory share (pure arithmetic, no torch)."""

import pytest

from zerolaunch.zero import plan
from zerolaunch.zero.layout import ParamSpec, plan_layout


def _specs():
    return [
        ParamSpec("a", (17, 31)),
        ParamSpec("b", (17,)),
        ParamSpec("c", (5, 3)),
        ParamSpec("d", (7,), group=1),
    ]


@pytest.mark.parametrize("world_size", [1, 2, 3, 4])
@pytest.mark.parametrize("bucket_numel", [1, 20, 540, 10**6])
def test_fragments_cover_every_element_exactly_once(world_size, bucket_numel):
    layout = plan_layout(_specs(), world_size, bucket_numel)
    covered = {s.name: [0] * s.numel for s in _specs()}
    for rank in range(world_size):
        shard_used = {g: 0 for g in range(layout.num_groups)}
        for f in layout.owned_fragments(rank):
            for i in range(f.start, f.stop):
                covered[f.name][i] += 1
            assert f.shard_offset + f.numel <= layout.shard_numel(f.group)
            shard_used[f.group] += f.numel
    assert all(c == 1 for counts in covered.values() for c in counts)
    for b in layout.buckets:
        assert b.padded_numel % world_size == 0 and 0 <= b.padded_numel - b.numel < world_size
        assert b.numel <= bucket_numel or len(layout.slots_in(b)) == 1  # a big param gets its own bucket


def test_buckets_keep_order_and_groups_apart():
    layout = plan_layout(_specs(), 2, 544)
    assert [(s.name, s.bucket, s.offset) for s in layout.params] == [
        ("a", 0, 0),
        ("b", 0, 527),
        ("c", 1, 0),
        ("d", 2, 0),
    ]
    assert [b.group for b in layout.buckets] == [0, 0, 1]
    assert layout.buckets[1].group_offset == layout.buckets[0].padded_numel == 544
    assert layout.shard_numel(0) == (544 + 16) // 2
    assert layout.bucket_shard_offset(layout.buckets[1]) == 272


def test_shard_offsets_of_fragments_are_contiguous_in_shard_order():
    layout = plan_layout(_specs(), 3, 100)
    for rank in range(3):
        frags = [f for f in layout.owned_fragments(rank) if f.group == 0]
        offsets = [f.shard_offset for f in frags]
        assert offsets == sorted(offsets)


def test_zero_size_params_are_skipped_and_bad_sizes_rejected():
    layout = plan_layout([ParamSpec("e", (0, 4)), ParamSpec("a", (3,))], 2, 10)
    assert [s.name for s in layout.params] == ["a"]
    with pytest.raises(ValueError, match="world_size"):
        plan_layout(_specs(), 0, 10)
    with pytest.raises(ValueError, match="bucket_numel"):
        plan_layout(_specs(), 2, 0)


# ---- zero/plan.py: the decisions the engine and estimate-memory share --------------------------------------
def test_plan_bucket_order_reverses_registration_order_within_each_group():
    specs = [ParamSpec("w1", (4, 4), 0), ParamSpec("b1", (4,), 1), ParamSpec("w2", (4, 4), 0)]
    specs.append(ParamSpec("b2", (4,), 1))
    assert [s.name for s in plan.bucket_order(specs)] == ["w2", "w1", "b2", "b1"]


def test_plan_default_groups_split_on_dims_unless_decay_1d():
    specs = [ParamSpec("w", (3, 2)), ParamSpec("b", (3,)), ParamSpec("s", ())]
    assert [s.group for s in plan.default_specs(specs, decay_1d=False)] == [0, 1, 1]
    assert [s.group for s in plan.default_specs(specs, decay_1d=True)] == [0, 0, 0]
    assert (plan.default_num_groups(False), plan.default_num_groups(True)) == (2, 1)


def test_plan_flat_layout_plans_stage_0_for_one_rank():
    specs = plan.default_specs([ParamSpec("w", (5, 3)), ParamSpec("b", (5,))], decay_1d=False)
    assert plan.flat_layout(specs, 0, 4, 100).world_size == 1
    stage1 = plan.flat_layout(specs, 1, 4, 100)
    assert stage1.world_size == 4 and [s.name for s in stage1.params] == ["w", "b"]
    assert all(b.padded_numel % 4 == 0 for b in stage1.buckets)


def test_plan_unit_layout_is_one_bucket_per_group():
    specs = plan.default_specs(
        [ParamSpec("w", (50, 30)), ParamSpec("v", (7, 3)), ParamSpec("b", (5,))], False
    )
    lay = plan.unit_layout(specs, 3)
    assert [b.group for b in lay.buckets] == [0, 1]


def test_plan_direct_accumulation_only_where_bit_identical():
    assert plan.accumulates_directly(2, 1, False, "bf16", "bf16", 4)
    assert not plan.accumulates_directly(1, 1, False, "bf16", "fp32", 4)  # bf16 micro-step sums would differ
    assert plan.accumulates_directly(1, 1, False, "bf16", "fp32", 1)
    assert not plan.accumulates_directly(2, 1, False, "bf16", "fp16", 1)  # fp16 comm would round
    assert not plan.accumulates_directly(2, 2, False, "fp32", "fp32", 1)
    assert not plan.accumulates_directly(2, 1, True, "fp32", "fp32", 1)
