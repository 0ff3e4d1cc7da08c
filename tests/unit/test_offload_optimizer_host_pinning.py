"""Optimizer offload's pinned host buffers are page-locked in place at their exact size.

torch's pinned-memory cache rounds every block up to a power of two (a 1.29 GiB block takes 2 GiB): at 6.7B
with the optimizer on the CPU the process held 114.9 GiB against the estimate's 104 GiB. With
`offload_optimizer: {pin_memory: true}` and an accelerator present, the fp32 master, the host grad shards and
nvme's staging buffers are ordinary host memory of their own size, registered with the driver where they are
(a recording stand-in for the CUDA runtime: this machine has none), and unregistered when freed. When the
driver refuses, the buffer comes from torch's pinned allocator as before; a buffer made at every gather
(offload_param's nvme read) stays in torch's pinned cache. Leaves out: the stage-3 engine's release (see the
test's note).
"""

from __future__ import annotations

import gc

import pytest
import torch

import zerolaunch
from zerolaunch.zero import host_pinning, placement


class RecordingRuntime:
    def __init__(self, result: int = 0):
        self.result = result
        self.registered: dict[int, int] = {}
        self.unregistered: list[int] = []

    def cudaHostRegister(self, ptr, nbytes, flags):  # noqa: N802 (the CUDA runtime's names)
        if self.result == 0:
            self.registered[ptr] = nbytes
        return self.result

    def cudaHostUnregister(self, ptr):  # noqa: N802
        self.unregistered.append(ptr)
        return 0


def _runtime(monkeypatch, result: int = 0) -> RecordingRuntime:
    runtime = RecordingRuntime(result)
    monkeypatch.setattr(host_pinning, "accelerator_present", lambda: True)
    monkeypatch.setattr(host_pinning, "cudart", lambda: runtime)
    return runtime


def _storages(tensors) -> dict[int, int]:
    return {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for t in tensors}


@pytest.mark.parametrize("stage,device", [(2, "cpu"), (3, "cpu"), (2, "nvme")])
def test_offloaded_optimizer_buffers_are_registered_in_place(stage, device, monkeypatch, tmp_path):
    runtime = _runtime(monkeypatch)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(48, 40), torch.nn.GELU(), torch.nn.Linear(40, 24))
    numel = sum(p.numel() for p in model.parameters())
    offload = {"device": device, "pin_memory": True}
    if device == "nvme":
        offload.update(nvme_path=str(tmp_path), buffer_count=2)
    ds = {
        "train_micro_batch_size_per_gpu": 4,
        "gradient_accumulation_steps": 2,
        "zero_optimization": {"stage": stage, "offload_optimizer": offload},
        "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}},
    }
    engine = zerolaunch.initialize(model, ds, device="cpu")
    for _ in range(2):
        engine.backward(engine(torch.randn(4, 48)).square().mean())
        engine.step()
    sharding = engine.engine.sharding
    optimizer = sharding.shards
    held = _storages([*optimizer.master, *sharding.grad_shards.tensors])
    if optimizer.store is not None:
        held.update(_storages(optimizer.store.buffers))
    assert runtime.registered == held, "pinned host buffers not page-locked in place"
    # one rank: the fp32 master (in the swap file under nvme) and the grad shard hold every param once
    masters = 0 if optimizer.store is not None else 1
    grads = sum(_storages(sharding.grad_shards.tensors).values())
    assert grads == 4 * numel
    assert sum(runtime.registered.values()) >= (masters + 1) * 4 * numel
    if stage == 3:
        # a stage-3 engine outlives its last reference: each param's post-accumulate-grad hook holds the
        # schedule, a cycle through the C++ tensor that the garbage collector does not see
        return
    del engine, sharding, optimizer, model
    gc.collect()
    assert sorted(runtime.unregistered) == sorted(runtime.registered)


@pytest.mark.parametrize("make", [placement.zeros, placement.empty])
def test_exact_size_and_fallback_when_the_driver_refuses(make, monkeypatch):
    runtime = _runtime(monkeypatch)
    buffer = make(1000, torch.device("cpu"), pin=True, dtype=torch.bfloat16)
    ptr = buffer.untyped_storage().data_ptr()
    assert runtime.registered == {ptr: 2000}
    del buffer
    gc.collect()
    assert runtime.unregistered == [ptr]
    assert make(8, torch.device("cpu"), pin=False).numel() == 8
    assert len(runtime.registered) == 1  # not asked to pin: not registered

    refusing = _runtime(monkeypatch, result=1)
    asked = []
    allocate = getattr(torch, make.__name__)

    def recording(*args, pin_memory=False, **kwargs):
        asked.append(pin_memory)
        return allocate(*args, **kwargs)  # this machine has no pinned memory to give

    monkeypatch.setattr(torch, make.__name__, recording)
    fallback = make(1000, torch.device("cpu"), pin=True, dtype=torch.bfloat16)
    assert fallback.numel() == 1000 and asked[-1] is True  # torch's pinned allocator, as before
    assert refusing.registered == {} and refusing.unregistered == []


def test_a_buffer_made_per_gather_stays_in_torchs_pinned_cache(monkeypatch):
    # offload_param's nvme read buffer is made at every gather and dropped after its async copy: the cache
    # keeps a block from reuse until that copy is done, and spares a driver registration per gather
    runtime = _runtime(monkeypatch)
    asked = []
    allocate = torch.empty

    def recording(*args, pin_memory=False, **kwargs):
        asked.append(pin_memory)
        return allocate(*args, **kwargs)

    monkeypatch.setattr(torch, "empty", recording)
    placement.recycled_empty(64, torch.device("cpu"), pin=True, dtype=torch.bfloat16)
    placement.recycled_empty(64, torch.device("cpu"), pin=False, dtype=torch.bfloat16)
    assert asked == [True, False] and runtime.registered == {}
