"""PrefetchingSource: batches drawn ahead on a thread, position counted in consumed batches."""

from __future__ import annotations

import time

import pytest
import torch

from zerolaunch.data.stream import BatchStream
from zerolaunch.train.batches import BatchSource, PrefetchingSource, TrainError

CPU = torch.device("cpu")


def _stream() -> BatchStream:
    # batch i is a pure function of i, so the expected values are written independently of the stream
    return BatchStream(lambda i: {"input_ids": torch.full((2, 3), i)}, description="counting")


def _ids(batch) -> int:
    return int(batch["input_ids"][0, 0])


def _wait_until(cond, timeout=60.0):
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, "the prefetch thread did not run ahead in time"
        time.sleep(0.01)


def test_batches_in_order_and_state_counts_consumed_not_produced():
    inner = BatchSource(_stream(), "counting")
    src = PrefetchingSource(inner, CPU, depth=3)
    try:
        assert [_ids(src.next()) for _ in range(4)] == [0, 1, 2, 3]
        # the thread has drawn ahead (queue of 3 plus one in hand) ...
        _wait_until(lambda: inner.consumed >= 4 + 3)
        # ... but the checkpointed position is the loop's
        assert src.state() == {"consumed": 4, "data": {"position": 4}}
    finally:
        src.close()


def test_restore_continues_exactly_where_the_consumed_count_says():
    first = PrefetchingSource(BatchSource(_stream(), "counting"), CPU, depth=2)
    for _ in range(5):
        first.next()
    _wait_until(lambda: first.source.consumed >= 7)
    state = first.state()
    first.close()

    resumed = PrefetchingSource(BatchSource(_stream(), "counting"), CPU, depth=2)
    resumed.restore(state)
    try:
        assert resumed.consumed == 5
        assert [_ids(resumed.next()) for _ in range(3)] == [5, 6, 7]
    finally:
        resumed.close()


def test_restore_of_a_plain_list_reads_and_drops_and_wraps_epochs():
    data = [{"input_ids": torch.full((1, 2), i)} for i in range(3)]
    src = PrefetchingSource(BatchSource(data, "list"), CPU, depth=2)
    src.restore({"consumed": 2})
    try:
        assert [_ids(src.next()) for _ in range(4)] == [2, 0, 1, 2]
        assert src.state() == {"consumed": 6}
    finally:
        src.close()


def test_empty_data_raises_the_loops_error_on_the_callers_thread():
    src = PrefetchingSource(BatchSource([], "pkg.mod:empty"), CPU)
    with pytest.raises(TrainError, match="yields no batches"):
        src.next()
    src.close()


def test_a_builder_exception_reaches_the_caller():
    def broken():
        yield {"input_ids": torch.zeros(1, 1)}
        raise OSError("disk gone")

    class Once:
        def __iter__(self):
            return broken()

    src = PrefetchingSource(BatchSource(Once(), "pkg.mod:broken"), CPU)
    assert _ids(src.next()) == 0
    with pytest.raises(OSError, match="disk gone"):
        src.next()
    src.close()


def test_wait_seconds_accumulate_and_depth_is_checked():
    src = PrefetchingSource(BatchSource(_stream(), "counting"), CPU)
    src.next()
    assert src.wait_seconds >= 0.0
    src.close()
    with pytest.raises(ValueError, match="depth"):
        PrefetchingSource(BatchSource(_stream(), "counting"), CPU, depth=0)
