"""Page-locked host buffers of exactly their own size, for what lives on the host for the whole run.

torch's pinned-memory allocator (`torch.empty(..., pin_memory=True)`, `tensor.pin_memory()`) serves every
request from a cache of power-of-two blocks: a 1.29 GiB unit shard takes a 2 GiB block, so offload_param's
host shards of a 34B bf16 base (48 decoder layers of 1.29 GiB) held 97 GiB for 63 GiB of weights, and
optimizer offload's fp32 master and grad shards (placement.py) rounded the same way. Here the
buffer is ordinary host memory of its own size, page-locked in place by the driver (cudaHostRegister: what
torch's allocator does under `pinned_use_cuda_host_register`, without the rounding); it reads as pinned
(`is_pinned()`), so copies from it to the device run without blocking, and it is unregistered when its storage
is freed. Without an accelerator, or when the driver refuses, the buffer is what torch's allocator gives.

It does not decide what is pinned (the offload options do) and does not free anything early. A short-lived
buffer that a non-blocking copy reads belongs in torch's pinned cache instead (placement.recycled_empty):
registering costs a driver call per buffer, and the cache keeps a block from reuse until its copy is done.
"""

from __future__ import annotations

import weakref

import torch

REGISTER_DEFAULT = 0  # cudaHostRegisterDefault, as torch's own host-register path passes


def accelerator_present() -> bool:
    return torch.cuda.is_available()


def cudart():
    """The CUDA runtime bindings torch ships (cudaHostRegister / cudaHostUnregister)."""
    return torch.cuda.cudart()


def pinnable(device: torch.device, pin: bool) -> bool:
    """Whether a buffer on `device` asked to be pinned can be: a host buffer, with an accelerator to pin for."""
    return pin and device.type == "cpu" and accelerator_present()


def zeros(numel: int, device: torch.device, *, pin: bool, dtype: torch.dtype) -> torch.Tensor:
    """A zeroed flat buffer on `device`; on the host and asked to pin, with an accelerator present:
    page-locked at its exact size."""
    return _buffer(torch.zeros, numel, device, pin=pin, dtype=dtype)


def empty(numel: int, device: torch.device, *, pin: bool, dtype: torch.dtype) -> torch.Tensor:
    """An uninitialized flat buffer, placed and page-locked as `zeros` is."""
    return _buffer(torch.empty, numel, device, pin=pin, dtype=dtype)


def _buffer(factory, numel: int, device: torch.device, *, pin: bool, dtype: torch.dtype) -> torch.Tensor:
    """factory (torch.zeros or torch.empty) of numel elements, page-locked in place where `pinnable`."""
    if not pinnable(device, pin):
        return factory(numel, dtype=dtype, device=device)
    buffer = factory(numel, dtype=dtype)
    if not _register_in_place(buffer):
        del buffer  # not two copies at once
        return factory(numel, dtype=dtype, pin_memory=True)  # pinned as before, rounded up
    return buffer


def _register_in_place(buffer: torch.Tensor) -> bool:
    """Page-lock `buffer`'s storage where it is, until the storage is freed; False when the driver refuses."""
    storage = buffer.untyped_storage()
    if storage.nbytes() == 0:
        return True
    runtime = cudart()
    ptr = storage.data_ptr()
    if int(runtime.cudaHostRegister(ptr, storage.nbytes(), REGISTER_DEFAULT)) != 0:
        return False
    # the registration must end before the memory goes back to the C allocator (which may hand the pages
    # to a later buffer that registers them again)
    weakref.finalize(storage, runtime.cudaHostUnregister, ptr)
    return True
