"""PrefetchingSource: batches drawn ahead on a thread or in a worker process, position counted in consumed
batches; both producers give the same batches, states and errors."""

from __future__ import annotations

import time

import pytest
import torch

from zerolaunch.data.stream import BatchStream
from zerolaunch.train.batches import BatchSource, PrefetchingSource, TrainError, prefetch_mode

CPU = torch.device("cpu")
MODES = pytest.mark.parametrize("mode", ["thread", "process"])


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


@MODES
def test_restore_continues_exactly_where_the_consumed_count_says(mode):
    first = PrefetchingSource(BatchSource(_stream(), "counting"), CPU, depth=2, mode=mode)
    assert [_ids(first.next()) for _ in range(5)] == [0, 1, 2, 3, 4]
    if mode == "thread":
        _wait_until(lambda: first.source.consumed >= 7)
    else:
        time.sleep(0.2)  # give the worker time to run ahead; the state must not follow it
    state = first.state()
    assert state == {"consumed": 5, "data": {"position": 5}}
    first.close()

    resumed = PrefetchingSource(BatchSource(_stream(), "counting"), CPU, depth=2, mode=mode)
    resumed.restore(state)
    try:
        assert resumed.consumed == 5
        assert [_ids(resumed.next()) for _ in range(3)] == [5, 6, 7]
    finally:
        resumed.close()


@MODES
def test_restore_of_a_plain_list_reads_and_drops_and_wraps_epochs(mode):
    data = [{"input_ids": torch.full((1, 2), i)} for i in range(3)]
    src = PrefetchingSource(BatchSource(data, "list"), CPU, depth=2, mode=mode)
    src.restore({"consumed": 2})
    try:
        assert [_ids(src.next()) for _ in range(4)] == [2, 0, 1, 2]
        assert src.state() == {"consumed": 6}
    finally:
        src.close()


@MODES
def test_empty_data_raises_the_loops_error_on_the_callers_thread(mode):
    src = PrefetchingSource(BatchSource([], "pkg.mod:empty"), CPU, mode=mode)
    with pytest.raises(TrainError, match="yields no batches"):
        src.next()
    src.close()


@MODES
def test_a_builder_exception_reaches_the_caller(mode):
    def broken():
        yield {"input_ids": torch.zeros(1, 1)}
        raise OSError("disk gone")

    class Once:
        def __iter__(self):
            return broken()

    src = PrefetchingSource(BatchSource(Once(), "pkg.mod:broken"), CPU, mode=mode)
    assert _ids(src.next()) == 0
    with pytest.raises(OSError, match="disk gone") as raised:
        src.next()
    if mode == "process":
        # the worker's traceback travels with the builder's own exception
        assert "in broken" in "\n".join(raised.value.__notes__)
    src.close()


def test_wait_seconds_accumulate_and_depth_is_checked():
    src = PrefetchingSource(BatchSource(_stream(), "counting"), CPU)
    src.next()
    assert src.wait_seconds >= 0.0
    src.close()
    with pytest.raises(ValueError, match="depth"):
        PrefetchingSource(BatchSource(_stream(), "counting"), CPU, depth=0)


class _Unpicklable(Exception):
    def __init__(self, a, b):  # two required args: pickle cannot rebuild it from its args
        super().__init__(f"{a}/{b}")

    def __reduce__(self):
        raise TypeError("no pickling")


def test_an_exception_that_cannot_cross_the_process_boundary_is_named():
    def broken():
        raise _Unpicklable("x", "y")
        yield

    class Once:
        def __iter__(self):
            return broken()

    src = PrefetchingSource(BatchSource(Once(), "pkg.mod:broken"), CPU, mode="process")
    with pytest.raises(RuntimeError, match="_Unpicklable: x/y"):
        src.next()
    src.close()


def test_the_worker_process_leaves_the_torch_rng_alone():
    # the loader gets its own generator: starting it must not move the training process's RNG (dropout,
    # init), or a run would differ with the prefetch mode
    torch.manual_seed(7)
    expected = torch.rand(3)
    torch.manual_seed(7)
    src = PrefetchingSource(BatchSource(_stream(), "counting"), CPU, mode="process")
    assert _ids(src.next()) == 0
    assert torch.equal(torch.rand(3), expected)
    src.close()


def test_auto_is_a_process_on_cuda_and_a_thread_on_the_cpu():
    assert prefetch_mode("auto", torch.device("cuda", 0)) == "process"
    assert prefetch_mode("auto", CPU) == "thread"
    assert prefetch_mode("thread", torch.device("cuda", 0)) == "thread"
    with pytest.raises(ValueError, match="data.prefetch"):
        prefetch_mode("fork", CPU)
    with pytest.raises(ValueError, match="mode"):
        PrefetchingSource(BatchSource(_stream(), "counting"), CPU, mode="auto")


def test_a_generator_that_runs_out_says_so_and_when():
    def three():
        for i in range(3):
            yield {"input_ids": torch.full((1, 1), i)}

    src = BatchSource(three(), "pkg.mod:three", micro_batches_per_step=1, steps=20)
    for _ in range(3):
        src.next()
    with pytest.raises(TrainError) as err:
        src.next()
    message = err.value.message
    assert message.startswith(
        "data.builder 'pkg.mod:three' ran out after 3 batches, at step 4: it returned a generator"
    )
    assert "Make it repeat" in message and "lower train.steps (now 20) to at most 3" in message
    assert "yields no batches" not in message
