"""The offloaded optimizer step of stages 1/2, run in a background thread while the next forward starts.

[Note: overlapped step]
With `offload_optimizer.overlap_step` (stages 1/2), `engine.step()` computes the norm and clip factor, then
hands the CPU step to one background thread and returns. The thread steps the chunks in forward order (the
buckets hold the params in reverse registration order, so the last bucket first) and sends each stepped
chunk to the device on its own copy stream; when a bucket's last chunk is sent it records an event and marks
the bucket ready. Meanwhile the next forward runs: a forward pre-hook on every module that owns params calls
`publish_through(b)` for the lowest bucket its params live in, which publishes, in one fixed order on every
rank (highest bucket index first), every bucket down to b: wait until it is ready, make the compute stream
wait for its copy event, all-gather it from the rank's updated slice (world size > 1). So the first layers
compute while the CPU still steps the last ones, and the collectives are issued in the same order on every
rank whatever the forward does. `wait_for_step()` publishes everything and joins the thread; the engine calls it
before anything else touches params, grads or optimizer state (backward, step, checkpoints, memory
accounting), and once the root module's forward ends.

What it cannot see: a parameter read outside the forward of the module that owns it (e.g. an EMA update over
`model.parameters()` after step(), or `F.linear(x, other_module.weight)` before that module ran) may still hold
the previous step's values; such code calls `engine.wait_for_step()` first, or leaves overlap_step off (the default).
`state_dict()` of any module is safe: a pre-hook waits for the step first (flat_sharding.py _register_publish_hooks).

Ordering with the device: the copy stream first waits for the compute stream as it was when the step began
(the previous backward has finished reading the params); the host master is written again only by the next
step, after wait_for_step() and the engine's device sync, by which point every copy was waited on.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor

import torch


class OverlappedStep:
    """One step in flight: `run(step_fn)` steps in the background; buckets are published on demand."""

    def __init__(
        self,
        num_buckets: int,
        device: torch.device,
        publish: Callable[[int], object],
        executor: ThreadPoolExecutor,
        threads: int,
        copy_stream: torch.cuda.Stream | None,
    ):
        """publish(bucket) issues the bucket's all-gather (or nothing) and returns work to wait on or None.
        threads: torch's CPU threads for the step (the engine leaves the training thread one core).
        copy_stream: the stream the step's host->device copies run on (None on the CPU); the engine keeps
        one for all steps, so the allocator's per-stream pools stay put."""
        self.device = device
        self.threads = threads
        self._publish = publish
        self._executor = executor
        self._ready = [threading.Event() for _ in range(num_buckets)]
        self._events: list[torch.cuda.Event | None] = [None] * num_buckets
        self._next = num_buckets - 1
        """Buckets above this index are published; publishing goes from the highest index down."""
        self._future: Future | None = None
        self.copy_stream = copy_stream

    def run(self, step_fn: Callable[[OverlappedStep], None]) -> None:
        """Start step_fn(self) in the background; it calls `bucket_sent(b)` as each bucket is complete."""
        start = None
        if self.copy_stream is not None:
            start = torch.cuda.current_stream(self.device).record_event()

        def body() -> None:
            torch.set_num_threads(self.threads)
            try:
                if self.copy_stream is None:
                    step_fn(self)
                    return
                with torch.cuda.device(self.device), torch.cuda.stream(self.copy_stream):
                    self.copy_stream.wait_event(start)
                    step_fn(self)
            finally:
                for ready in self._ready:  # never leave the main thread waiting on a step that failed
                    ready.set()

        self._future = self._executor.submit(body)

    def bucket_sent(self, bucket: int) -> None:
        """(background thread) every chunk of `bucket` was stepped and its copy to the device enqueued."""
        if self.copy_stream is not None:
            self._events[bucket] = self.copy_stream.record_event()
        self._ready[bucket].set()

    def publish_through(self, bucket: int) -> None:
        """Publish every bucket from the highest index down to `bucket` (main thread, forward hooks)."""
        while self._next >= bucket:
            b = self._next
            self._ready[b].wait()
            if self._future is not None and self._future.done() and self._future.exception() is not None:
                raise self._future.exception()
            event = self._events[b]
            if event is not None:
                torch.cuda.current_stream(self.device).wait_event(event)
            pending = self._publish(b)
            if pending is not None:
                pending.wait()
            self._next -= 1

    def wait_for_step(self) -> None:
        """Publish every bucket and wait for the background step (re-raises its exception)."""
        self.publish_through(0)
        if self._future is not None:
            self._future.result()
