"""Where the fp32 master, its gradients and the optimizer state live when the optimizer is offloaded.

This module owns the host side of optimizer offload (offload_optimizer.device "cpu", and the host grad
shards of "nvme", whose swap files are optim/nvme_store.py's):
allocating host buffers (pinned when asked and when there is an accelerator to pin for; those held for the
run at their exact size), and the ordering rule that the host may only read device->host copies once the
device stream that issued them is done.
On a CPU-only machine the "host" is the compute device and the copies are plain same-device copies: the
code path is the same, which is what the tests exercise.
"""

from __future__ import annotations

import torch

from . import host_pinning
from .options import OffloadOptions


def master_device(offload: OffloadOptions, device: torch.device) -> torch.device:
    """Device of the fp32 master, fp32 grad shards and optimizer state."""
    if offload.device in ("cpu", "nvme"):
        # nvme: the grad shards stay on the host; master + state stream through host buffers (nvme_store.py).
        return torch.device("cpu")
    return device


def zeros(numel: int, device: torch.device, *, pin: bool, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """A zeroed flat buffer held for the run; page-locked at its exact size when on the host, asked for, and
    an accelerator exists (host_pinning.py: torch's pinned cache would round it up to a power of two)."""
    return host_pinning.zeros(numel, device, pin=pin, dtype=dtype)


def empty(numel: int, device: torch.device, *, pin: bool, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """An uninitialized flat buffer held for the run, pinned as `zeros` is."""
    return host_pinning.empty(numel, device, pin=pin, dtype=dtype)


def recycled_empty(
    numel: int, device: torch.device, *, pin: bool, dtype: torch.dtype = torch.float32
) -> torch.Tensor:
    """An uninitialized flat buffer made and dropped again and again while training: pinned blocks come
    from torch's host cache, which hands a block out again only once the copy that read it has completed."""
    return torch.empty(numel, dtype=dtype, device=device, pin_memory=host_pinning.pinnable(device, pin))


def to_host(
    dst: torch.Tensor, src: torch.Tensor, *, accumulate: bool, staging: torch.Tensor | None = None
) -> None:
    """dst (host fp32) <- / += src (device, any float dtype); non-blocking when dst is pinned.

    accumulate=True across devices lands src in `staging` (a reusable fp32 host buffer of >= src.numel()
    elements, ideally pinned) before the add; without one, a temporary is allocated (slow: pageable, and
    first-touch page faults on every call).
    """
    if dst.device == src.device:
        if accumulate:
            dst.add_(src)
        else:
            dst.copy_(src)
        return
    if not accumulate:
        # one (possibly async) copy straight into dst; the host reads it only after sync() in step().
        dst.copy_(src, non_blocking=dst.is_pinned())
        return
    if staging is None:
        staged = src.to(dst.device, dtype=torch.float32)
    else:
        staged = staging[: src.numel()]
        staged.copy_(src, non_blocking=staging.is_pinned())
        # the add reads `staged` on the host: the async copy must have landed first.
        sync(src.device)
    dst.add_(staged)


def sync(device: torch.device) -> None:
    """Block the host until the device's current stream has finished (before the host step reads grads)."""
    if device.type == "cuda":
        torch.cuda.current_stream(device).synchronize()
