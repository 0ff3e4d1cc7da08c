"""plan.StagingPool, the stage-2 staging buffer policy that flat.BackwardReducer and estimate-memory both drive.

Tests: hand-counted decisions (allocate, reuse, complete the oldest first) and buffer counts for small
arrival orders, with and without overlap, the bucket-index issue order, and reuse across backwards. Leaves
out: the tensors (tests/unit/test_memory_engine.py holds the estimate equal to a real Engine's bytes).
"""

from __future__ import annotations

from zerolaunch.zero.plan import StagingPool, StagingTake


def _backward(pool: StagingPool, arrival: list[int]) -> list[tuple[str, int, StagingTake | bool | None]]:
    """Drive the pool as BackwardReducer does; the log of its answers."""
    log = []

    def issue(b: int) -> None:
        log.append(("take", b, pool.take(b)))
        log.append(("issue", b, pool.issue(b)))

    for b in arrival:
        log.append(("take", b, pool.take(b)))
        for ready in pool.grad_ready(b):
            issue(ready)
    for b in pool.unissued():
        issue(b)
    while pool.in_flight:
        pool.complete_oldest()
    pool.end_backward()
    return log


NEW, REUSE, AFTER_OLDEST = StagingTake(False, True), StagingTake(False, False), StagingTake(True, False)


def test_overlap_keeps_two_buffers_and_completes_the_oldest_to_reuse_one():
    pool = StagingPool([1, 1, 1, 1], overlap=True, max_in_flight=2)
    takes = [t for kind, _, t in _backward(pool, [0, 1, 2, 3]) if kind == "take"]
    # each bucket is issued at its only grad (the issue's own take finds it held: None)
    assert takes == [NEW, None, NEW, None, AFTER_OLDEST, None, AFTER_OLDEST, None]
    assert pool.allocated == 2
    assert _backward(pool, [0])[0] == ("take", 0, REUSE)  # the next backward reuses: still 2
    assert pool.allocated == 2


def test_without_overlap_each_bucket_completes_at_issue_and_one_buffer_cycles():
    pool = StagingPool([1, 1, 1], overlap=False, max_in_flight=2)
    log = _backward(pool, [0, 1, 2])
    assert [t for kind, _, t in log if kind == "take"] == [NEW, None, REUSE, None, REUSE, None]
    assert [t for kind, _, t in log if kind == "issue"] == [True, True, True]
    assert pool.allocated == 1


def test_a_bucket_waiting_for_its_second_grad_holds_its_buffer_and_blocks_the_later_ones():
    # bucket 0 (say a no-decay bucket) gets its second grad last: 1 and 2 cannot be issued before it,
    # nothing is in flight to complete, so each takes a new buffer, with or without overlap.
    for overlap in (True, False):
        pool = StagingPool([2, 1, 1], overlap=overlap, max_in_flight=2)
        log = _backward(pool, [0, 1, 2, 0])
        assert [(b, t) for kind, b, t in log if kind == "take"][:4] == [
            (0, NEW),
            (1, NEW),
            (2, NEW),
            (0, None),
        ]
        assert [b for kind, b, _ in log if kind == "issue"] == [0, 1, 2]
        assert pool.allocated == 3


def test_missing_grads_are_issued_at_the_end_in_index_order():
    pool = StagingPool([1, 1, 1], overlap=True, max_in_flight=2)
    pool.take(2)
    assert pool.grad_ready(2) == []  # bucket 0 comes first
    assert pool.busy and pool.unissued() == [0, 1, 2]
    takes = []
    for b in pool.unissued():
        takes.append(pool.take(b))
        assert pool.issue(b) is False
    # 0 takes the second buffer; 1 finds both taken and completes 0 to reuse its buffer; 2 holds its own
    assert takes == [NEW, AFTER_OLDEST, None]
    assert list(pool.in_flight) == [1, 2] and pool.allocated == 2
    while pool.in_flight:
        pool.complete_oldest()
    pool.end_backward()
    assert not pool.busy and pool.free == 2
