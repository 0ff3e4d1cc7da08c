"""Calling the recipe's builders, and the forward convention of DESIGN.md "User contract".

Owns: building the model and the data iterable from `recipe.model` / `recipe.data`, moving a batch to the
device, calling the model on a batch (dict -> **batch, tuple/list -> *batch, tensor -> batch) and finding
the loss in what it returns (a scalar tensor, or an object / dict with `loss`). Knows no model internals.
"""

from __future__ import annotations

import contextlib
import pickle
import queue
import threading
import time
import traceback
from collections.abc import Iterator

import torch
import torch.utils.data

from zerolaunch.config import import_builder
from zerolaunch.config.schema import PREFETCH_MODES
from zerolaunch.util.errors import TrainError


@contextlib.contextmanager
def builder_errors(key: str, spec: str, args: dict):
    """A ValueError / TypeError raised while a builder runs is the recipe's to fix (a bad size, an unknown
    keyword in its args): re-raised as a TrainError (one paragraph, exit 2). Chained with `from`, so the
    original traceback stays in the rank's error record (logs/.../error.json); other exceptions pass as they
    are (a crash panel, exit 1)."""
    try:
        yield
    except (ValueError, TypeError) as err:
        frames = traceback.extract_tb(err.__traceback__)
        at = f" (raised at {frames[-1].filename}:{frames[-1].lineno})" if len(frames) > 1 else ""
        raise TrainError(
            f"{key} {spec!r} raised {type(err).__name__}: {err}{at}. Fix the builder or its args "
            f"({key.split('.')[0]}.args = {args!r:.200}); the full traceback is in this rank's error.json "
            "beside its log."
        ) from err


def build_model(recipe, *, meta_if_supported: bool = False) -> torch.nn.Module:
    """`model.builder(**model.args)`; on the meta device when asked and the builder sets `fn.meta_init`.

    `fn.meta_init = True` is a builder's promise that every parameter is initialised by a module's
    `reset_parameters()` (the built-in GPT's is), so a stage 3 engine can materialise it one unit at a time
    and no rank ever holds the whole model. Other builders run normally and the engine shards their weights.
    """
    fn = import_builder(recipe.model.builder, recipe.base_dir, key="model.builder")
    with builder_errors("model.builder", recipe.model.builder, recipe.model.args):
        if meta_if_supported and getattr(fn, "meta_init", False):
            with torch.device("meta"):
                model = fn(**recipe.model.args)
        else:
            model = fn(**recipe.model.args)
    if not isinstance(model, torch.nn.Module):
        raise TrainError(
            f"model.builder {recipe.model.builder!r} returned a {type(model).__name__}, not a torch.nn.Module"
        )
    return model


def build_data(recipe, rank: int, world_size: int):
    fn = import_builder(recipe.data.builder, recipe.base_dir, key="data.builder")
    with builder_errors("data.builder", recipe.data.builder, recipe.data.args):
        data = fn(
            rank=rank,
            world_size=world_size,
            micro_batch_size=recipe.train.micro_batch_size,
            seed=recipe.train.seed,
            **recipe.data.args,
        )
    if not hasattr(data, "__iter__"):
        raise TrainError(
            f"data.builder {recipe.data.builder!r} returned a {type(data).__name__}, not an iterable"
        )
    return data


class BatchSource:
    """An endless supply of batches from the data iterable, re-iterating it when an epoch ends."""

    def __init__(self, data, builder: str, *, micro_batches_per_step: int = 1, steps: int | None = None):
        """`micro_batches_per_step` (gradient accumulation) and `steps` (train.steps) only word the error of
        a data iterable that runs out."""
        self.data = data
        self.builder = builder
        self.consumed = 0
        """Micro-batches handed out so far on this rank (the data position a checkpoint records)."""
        self._it: Iterator | None = None
        self._micro_batches_per_step = micro_batches_per_step
        self._steps = steps

    def next(self):
        if self._it is None:
            self._it = iter(self.data)
        try:
            batch = next(self._it)
        except StopIteration:
            self._it = iter(self.data)
            try:
                batch = next(self._it)
            except StopIteration:
                raise self._ran_out() from None
        self.consumed += 1
        return batch

    def _ran_out(self) -> TrainError:
        if self.consumed == 0:
            return TrainError(f"data.builder {self.builder!r} yields no batches on this rank")
        # a generator or iterator is spent after one pass: iter() hands back the same, empty object
        full_steps = self.consumed // self._micro_batches_per_step
        steps = f" (now {self._steps})" if self._steps is not None else ""
        return TrainError(
            f"data.builder {self.builder!r} ran out after {self.consumed} batches, at step {full_steps + 1}: it "
            f"returned a {type(self.data).__name__}, which cannot start a second pass. Make it repeat (loop "
            "inside the generator, or return a list or an object whose __iter__ starts a new pass), or lower "
            f"train.steps{steps} to at most {full_steps}."
        )

    def state(self) -> dict:
        state = {"consumed": self.consumed}
        if hasattr(self.data, "state_dict"):
            state["data"] = self.data.state_dict()
        return state

    def restore(self, state: dict) -> None:
        """Continue after `state["consumed"]` batches: load_state_dict, else skip(n), else read and drop."""
        consumed = int(state.get("consumed", 0))
        if "data" in state and hasattr(self.data, "load_state_dict"):
            self.data.load_state_dict(state["data"])
            self._it = None
        elif hasattr(self.data, "skip"):
            self.data.skip(consumed)
            self._it = None
        else:
            # keep the iterator these reads advanced: a fresh one would start the epoch over
            self._it = None
            for _ in range(consumed):
                self.next()
        self.consumed = consumed


_FAILED = object()
_POLL_SECONDS = 0.1


def prefetch_mode(setting: str, device: torch.device) -> str:
    """The producer ("thread" or "process") for `data.prefetch` on `device`.

    [Note: prefetch process] A thread shares the training thread's GIL: a builder written in Python (the
    synthetic Markov walk is 16k Python steps a batch at seq 2048, about 10-20 ms) delays every kernel
    launch of the step it overlaps, and on a GPU those delays are step time (bench/train_gap.py, bench/RESULTS.md:
    1.076x the bare engine on a thread, 1.011x in a process). One forked worker process has its own interpreter. It is the default on CUDA only:
    on the CPU the step itself is the bottleneck and a second process would take a core from it.
    """
    if setting == "auto":
        return "process" if device.type == "cuda" else "thread"
    if setting not in PREFETCH_MODES:
        raise ValueError(f"data.prefetch must be one of {', '.join(PREFETCH_MODES)}, got {setting!r}")
    return setting


class PrefetchingSource:
    """Batches `depth` ahead of the loop, drawn from a `BatchSource` by a background thread (mode="thread")
    or by one forked worker process (mode="process", torch's DataLoader machinery: shared-memory tensors, a
    pinning thread, a worker that exits when this process dies); see [Note: prefetch process]. On CUDA
    `next()` copies the (pinned) batch with `non_blocking` on a side stream and makes the current stream
    wait on that copy's event, so neither the batch's construction nor its copy holds up the step.

    The data position is counted in batches CONSUMED by the loop, not produced ahead: `state()` returns the
    consumed count and the data iterable's `state_dict()` as it was right after the last consumed batch was
    drawn (the producer ships that snapshot with each batch), so a checkpoint resumes bit-exactly however far
    ahead the producer had got. The producer starts on the first `next()`, after any `restore()`.
    """

    def __init__(self, source: BatchSource, device: torch.device, depth: int = 2, mode: str = "thread"):
        if isinstance(depth, bool) or not isinstance(depth, int) or depth < 1:
            raise ValueError(f"prefetch depth must be an int >= 1, got {depth!r}")
        if mode not in ("thread", "process"):
            raise ValueError(f"prefetch mode must be 'thread' or 'process', got {mode!r}")
        self.source = source
        self.device = device
        self.depth = depth
        self.mode = mode
        self.consumed = source.consumed
        self.wait_seconds = 0.0
        """Total time `next()` blocked waiting for the producer (the loop's "data wait")."""
        self._data_state = self._snapshot()
        self._producer = None
        self._cuda = device.type == "cuda"
        self._copy_stream = torch.cuda.Stream(device) if self._cuda else None

    def _snapshot(self):
        return _state_of(self.source.data)

    def next(self):
        """The next batch, on the device."""
        if self._producer is None:
            make = _ThreadProducer if self.mode == "thread" else _ProcessProducer
            self._producer = make(self.source, self.depth, pin=self._cuda)
        t0 = time.perf_counter()
        batch, data_state = self._producer.get()
        self.wait_seconds += time.perf_counter() - t0
        self.consumed += 1
        self._data_state = data_state
        if not self._cuda:
            return to_device(batch, self.device)
        with torch.cuda.stream(self._copy_stream):
            on_device = to_device(batch, self.device)
            copied = self._copy_stream.record_event()
        current = torch.cuda.current_stream(self.device)
        current.wait_event(copied)
        # allocated on the copy stream, used on the current one: keep the allocator from reusing it early
        _record_stream(on_device, current)
        return on_device

    def state(self) -> dict:
        state = {"consumed": self.consumed}
        if self._data_state is not None:
            state["data"] = self._data_state
        return state

    def restore(self, state: dict) -> None:
        self.close()
        self.source.restore(state)
        self.consumed = self.source.consumed
        self._data_state = self._snapshot()

    def close(self) -> None:
        """Stop the producer (any batches it drew ahead are dropped; the position is the consumed one)."""
        if self._producer is not None:
            self._producer.close()
            self._producer = None


def _state_of(data):
    return data.state_dict() if hasattr(data, "state_dict") else None


class _ThreadProducer:
    """`source.next()` on a daemon thread, `depth` (batch, data state) pairs queued ahead."""

    def __init__(self, source: BatchSource, depth: int, pin: bool):
        self._source, self._pin = source, pin
        self._queue: queue.Queue = queue.Queue(maxsize=depth)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._produce, name="zerolaunch-data", daemon=True)
        self._thread.start()

    def _produce(self) -> None:
        q, stop = self._queue, self._stop
        while not stop.is_set():
            try:
                batch = self._source.next()
                item = (_pin(batch) if self._pin else batch, _state_of(self._source.data))
            except BaseException as exc:  # handed to the loop's thread, which raises it
                item = (_FAILED, exc)
            while not stop.is_set():
                try:
                    q.put(item, timeout=_POLL_SECONDS)
                    break
                except queue.Full:
                    continue
            if item[0] is _FAILED:
                return

    def get(self):
        while True:
            try:
                batch, data_state = self._queue.get(timeout=_POLL_SECONDS)
                break
            except queue.Empty:
                if not self._thread.is_alive():
                    raise RuntimeError("the data prefetch thread ended without a batch or an error") from None
        if batch is _FAILED:
            raise data_state
        return batch, data_state

    def close(self) -> None:
        self._stop.set()
        self._thread.join()


class _Drawn(torch.utils.data.IterableDataset):
    """What the worker process iterates: (batch, data state right after it) from its copy of the source."""

    def __init__(self, source: BatchSource):
        self.source = source

    def __iter__(self):
        while True:
            try:
                batch = self.source.next()
            except BaseException as exc:  # sent as an item, so the loop raises the builder's own exception
                yield _FAILED_IN_WORKER, _portable(exc), traceback.format_exc()
                return
            yield batch, _state_of(self.source.data)


_FAILED_IN_WORKER = "zerolaunch: the data worker failed"


def _portable(exc: BaseException) -> BaseException:
    """`exc` if it survives pickling (the trip back from the worker), else a RuntimeError naming it."""
    try:
        pickle.loads(pickle.dumps(exc))
        return exc
    except Exception:
        return RuntimeError(f"{type(exc).__name__}: {exc}")


class _ProcessProducer:
    """One forked DataLoader worker runs `source.next()`; its batches arrive in order, pinned when asked.

    Forked, so the worker starts from this process's source as it is now (after any restore) and a builder
    needs nothing picklable; the worker must not touch CUDA (a forked child cannot), which the built-in
    builders and any CPU-side data code meet; a builder that makes CUDA tensors needs data.prefetch: thread.
    An error in the worker travels as an item (_Drawn) and is re-raised here, the builder's own exception
    with the worker's traceback as a note, at its place in order.
    The loader gets its own generator so that starting it draws nothing from this process's torch RNG.
    """

    def __init__(self, source: BatchSource, depth: int, pin: bool):
        loader = torch.utils.data.DataLoader(
            _Drawn(source),
            batch_size=None,
            num_workers=1,
            prefetch_factor=depth,
            pin_memory=pin,
            multiprocessing_context="fork",
            generator=torch.Generator().manual_seed(0),
        )
        self._it = iter(loader)

    def get(self):
        item = next(self._it)
        if len(item) == 3 and isinstance(item[0], str) and item[0] == _FAILED_IN_WORKER:
            _, exc, where = item
            exc.add_note(f"raised in the data prefetch process (data.prefetch: process):\n{where.rstrip()}")
            raise exc
        return item

    def close(self) -> None:
        shutdown = getattr(self._it, "_shutdown_workers", None)
        if shutdown is not None:
            shutdown()
        self._it = None


def _pin(batch):
    if isinstance(batch, torch.Tensor):
        return batch.pin_memory() if batch.device.type == "cpu" else batch
    if isinstance(batch, dict):
        return {k: _pin(v) for k, v in batch.items()}
    if isinstance(batch, (list, tuple)):
        return type(batch)(_pin(v) for v in batch)
    return batch


def _record_stream(batch, stream) -> None:
    if isinstance(batch, torch.Tensor):
        if batch.device.type == "cuda":
            batch.record_stream(stream)
    elif isinstance(batch, dict):
        for v in batch.values():
            _record_stream(v, stream)
    elif isinstance(batch, (list, tuple)):
        for v in batch:
            _record_stream(v, stream)


def to_device(batch, device: torch.device):
    if isinstance(batch, torch.Tensor):
        return batch.to(device, non_blocking=True)
    if isinstance(batch, dict):
        return {k: to_device(v, device) for k, v in batch.items()}
    if isinstance(batch, (list, tuple)):
        return type(batch)(to_device(v, device) for v in batch)
    return batch


def forward(engine, batch):
    if isinstance(batch, dict):
        return engine(**batch)
    if isinstance(batch, (list, tuple)):
        return engine(*batch)
    return engine(batch)


def loss_of(out) -> torch.Tensor:
    loss = out
    if isinstance(out, dict):
        loss = out.get("loss")
    elif not isinstance(out, torch.Tensor):
        loss = getattr(out, "loss", None)
    if not isinstance(loss, torch.Tensor) or loss.dim() != 0:
        raise TrainError(
            f"the model returned {type(out).__name__} without a scalar loss; return a scalar tensor, or an "
            "object / dict with `loss` (give the data `labels` if the model computes the loss from them)"
        )
    return loss


def tokens_in(batch) -> int | None:
    """Tokens of a batch with `input_ids` (for tokens/s and MFU); None when the batch has no such notion."""
    if isinstance(batch, dict) and isinstance(batch.get("input_ids"), torch.Tensor):
        return int(batch["input_ids"].numel())
    return None
