"""train.activation_offload: the tensors autograd saves in forward wait for backward in host memory.

[Note: activation offload]
Under `OffloadActivations` (a `torch.autograd.graph.saved_tensors_hooks`, the mechanism of torchtune's
OffloadActivations), each tensor autograd saves for backward that is on an offload device (CUDA), at least
`min_bytes` large and not a parameter or a view of one is copied into pinned host memory on a side stream as
forward runs, and the device copy is let go once that copy has finished (held by reference until its event
says so, so the allocator never reuses memory a copy still reads). Backward asks for the saved tensors in
about the reverse order they were saved: each unpack brings its tensor back on the side stream, plus the ones
saved just before it up to `prefetch_bytes`, so the next layers' tensors arrive while this layer computes;
the compute stream waits only for the copy of the tensor it reads. The values are the saved tensors' exact
copies: losses and grads equal those without offload. What it does not do: offload what activation
checkpointing already discards (torch.utils.checkpoint's own hooks take the tensors inside a checkpointed
block), or anything on a CPU-only run, where activations already live in host memory (`offload_types`
names the device types; tests pass "cpu" to exercise the copies).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable

import torch
from torch import nn

# the numbers estimate-memory prices this with (torch-free)
from zerolaunch.memory.activation_offload import MIN_OFFLOAD_BYTES, PREFETCH_BYTES


class _Saved:
    """One offloaded tensor: its host copy and the device it goes back to."""

    __slots__ = ("index", "host", "device", "nbytes")

    def __init__(self, index: int, host: torch.Tensor, device: torch.device, nbytes: int):
        self.index = index
        self.host = host
        self.device = device
        self.nbytes = nbytes


class OffloadActivations(torch.autograd.graph.saved_tensors_hooks):
    """Context manager: saved activations go to host memory in forward and come back ahead of backward."""

    def __init__(
        self,
        params: Iterable[torch.Tensor] = (),
        *,
        min_bytes: int = MIN_OFFLOAD_BYTES,
        prefetch_bytes: int = PREFETCH_BYTES,
        offload_types: tuple[str, ...] = ("cuda",),
    ):
        """params: the model's parameters (never offloaded: they stay on the device anyway)."""
        self.min_bytes = min_bytes
        self.prefetch_bytes = prefetch_bytes
        self.offload_types = offload_types
        self._param_ids = {id(p) for p in params}
        self._saved: list[_Saved] = []
        """In save order: what may still be brought back (prefetch walks it backwards)."""
        self._fetched: dict[int, tuple[torch.Tensor, torch.cuda.Event | None]] = {}
        """index -> (device tensor, the event of its copy): brought back ahead of its unpack."""
        self._fetched_bytes = 0
        self._unpacked: set[int] = set()
        self._prefetch_low: int | None = None
        """Nothing below this index has been prefetched yet (prefetch walks down from here)."""
        self._copying: list[tuple[torch.Tensor, torch.cuda.Event]] = []
        """Device tensors whose host copy may still run (let go once their event completed)."""
        self._stream: torch.cuda.Stream | None = None
        self.offloaded_bytes = 0
        """Bytes copied to the host since construction (tests and the bench read it)."""
        super().__init__(self._pack, self._unpack)

    # ---- forward: to the host --------------------------------------------------------------------------
    def _keep_on_device(self, t: torch.Tensor) -> bool:
        return (
            t.device.type not in self.offload_types
            or t.numel() * t.element_size() < self.min_bytes
            or isinstance(t, nn.Parameter)
            or id(t) in self._param_ids
            or (t._base is not None and (isinstance(t._base, nn.Parameter) or id(t._base) in self._param_ids))
            or not t.is_contiguous()
        )

    def _side_stream(self, device: torch.device) -> torch.cuda.Stream | None:
        if device.type != "cuda":
            return None
        if self._stream is None:
            self._stream = torch.cuda.Stream(device)
        return self._stream

    def _pack(self, t: torch.Tensor):
        if self._keep_on_device(t):
            return t
        self._release_copied()
        stream = self._side_stream(t.device)
        host = torch.empty(t.shape, dtype=t.dtype, pin_memory=stream is not None)
        with _on(stream, t.device):
            host.copy_(t, non_blocking=stream is not None)
        if stream is not None:
            event = stream.record_event()
            self._copying.append((t, event))  # the copy still reads t: held until the event completes
        nbytes = t.numel() * t.element_size()
        self.offloaded_bytes += nbytes
        saved = _Saved(len(self._saved), host, t.device, nbytes)
        self._saved.append(saved)
        return saved

    def _release_copied(self) -> None:
        while self._copying and self._copying[0][1].query():
            self._copying.pop(0)

    # ---- backward: back to the device ------------------------------------------------------------------
    def _unpack(self, saved):
        if not isinstance(saved, _Saved):
            return saved
        if self._copying:
            # backward reads these tensors' host copies: every forward copy must have landed
            self._copying[-1][1].synchronize()
            self._copying.clear()
        fetched = self._fetched.pop(saved.index, None)
        if fetched is None:
            fetched = self._bring_back(saved)
        else:
            self._fetched_bytes -= saved.nbytes
        self._unpacked.add(saved.index)
        self._prefetch_before(saved.index)
        tensor, event = fetched
        if event is not None:
            torch.cuda.current_stream(saved.device).wait_event(event)
        return tensor

    def _bring_back(self, saved: _Saved) -> tuple[torch.Tensor, torch.cuda.Event | None]:
        stream = self._side_stream(saved.device)
        if stream is None:
            return saved.host.to(saved.device, copy=True), None
        # allocated on the compute stream, which reads and frees it; the side stream waits for that stream
        # before it writes, so the block is free there too
        tensor = torch.empty(saved.host.shape, dtype=saved.host.dtype, device=saved.device)
        stream.wait_stream(torch.cuda.current_stream(saved.device))
        with torch.cuda.stream(stream):
            tensor.copy_(saved.host, non_blocking=True)
            event = stream.record_event()
        return tensor, event

    def _prefetch_before(self, index: int) -> None:
        """Bring back the tensors saved just before `index` (backward's next reads), up to prefetch_bytes."""
        low = len(self._saved) if self._prefetch_low is None else self._prefetch_low
        k = min(index, low) - 1
        while k >= 0 and self._fetched_bytes < self.prefetch_bytes:
            if k not in self._fetched and k not in self._unpacked:
                self._fetched[k] = self._bring_back(self._saved[k])
                self._fetched_bytes += self._saved[k].nbytes
            k -= 1
        self._prefetch_low = min(low, k + 1)


@contextlib.contextmanager
def _on(stream: torch.cuda.Stream | None, device: torch.device):
    """Run the block on `stream` after the compute stream's work so far (a no-op without a stream)."""
    if stream is None:
        yield
        return
    stream.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(stream):
        yield


def offload_activations(
    model: nn.Module, *, offload_types: tuple[str, ...] = ("cuda",)
) -> OffloadActivations:
    """The context for one forward of `model` (a fresh one per forward: it holds that forward's tensors)."""
    return OffloadActivations(model.parameters(), offload_types=offload_types)
