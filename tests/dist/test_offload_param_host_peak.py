"""offload_param's host side while a stage-3 LoRA model is built on meta unit by unit: at most the base once.

A bf16 Llama (about 180 MB of frozen base, 8 decoder layers, a small root unit) with PEFT LoRA on every decoder
linear is built on the meta device and wrapped at stage 3 with `offload_param: {device: cpu, pin_memory: true}`,
on 1 and on 2 gloo ranks. Checked per rank:

- the build's peak resident memory (VmHWM, reset just before the engine) rises by at most this rank's 1/N of
  the base, plus the largest unit's transient init buffers (fp32 values + the compute-dtype full buffer: on the
  CPU the compute device is the host too), plus the adapter's master, optimizer state and grads, plus 48 MiB
  (measured: 286.5 MiB at N=1 for a 176 MiB base, 191.3 MiB per rank at N=2);
- with an accelerator present, each unit's host shard is page-locked in place at its exact size (a recording
  stand-in for the CUDA runtime: this machine has none), never through torch's pinned cache, which rounds
  every block up to a power of two (the 34B bench held 97 GiB of pinned blocks for a 63 GiB base); the
  registration ends when the shard's storage is freed.
"""

from __future__ import annotations

import gc

import pytest
from _spawn import run_ranks

pytest.importorskip("peft")
pytest.importorskip("transformers")

LAYERS = 8
SLACK = 48 * 2**20


class RecordingRuntime:
    def __init__(self):
        self.registered: dict[int, int] = {}
        self.unregistered: list[int] = []

    def cudaHostRegister(self, ptr, nbytes, flags):  # noqa: N802 (the CUDA runtime's names)
        self.registered[ptr] = nbytes
        return 0

    def cudaHostUnregister(self, ptr):  # noqa: N802
        self.unregistered.append(ptr)
        return 0


def _status_bytes(key: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1]) * 1024
    raise KeyError(key)


def _build(rank, world_size):
    import peft
    import torch
    import transformers

    import zerolaunch
    from zerolaunch.zero import host_pinning

    runtime = RecordingRuntime()
    host_pinning.accelerator_present = lambda: True
    host_pinning.cudart = lambda: runtime
    config = transformers.LlamaConfig(
        hidden_size=1024,
        intermediate_size=2816,
        num_hidden_layers=LAYERS,
        num_attention_heads=8,
        num_key_value_heads=2,
        vocab_size=1024,
        tie_word_embeddings=False,
    )
    with torch.device("meta"):
        model = transformers.LlamaForCausalLM._from_config(config, dtype=torch.bfloat16)
    targets = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
    model = peft.get_peft_model(model, peft.LoraConfig(r=8, lora_alpha=16, target_modules=targets))
    base_bytes = sum(2 * p.numel() for p in model.parameters() if not p.requires_grad)
    layer_numel = sum(p.numel() for p in model.base_model.model.model.layers[0].parameters())
    ds = {
        "train_micro_batch_size_per_gpu": 1,
        "gradient_accumulation_steps": 1,
        "bf16": {"enabled": True},
        "zero_optimization": {"stage": 3, "offload_param": {"device": "cpu", "pin_memory": True}},
        "optimizer": {"type": "AdamW", "params": {"lr": 1e-4}},
    }
    gc.collect()
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # VmHWM := the resident size now
    before = _status_bytes("VmRSS")
    engine = zerolaunch.initialize(model, ds, device="cpu")
    rise = _status_bytes("VmHWM") - before
    owned = engine.memory_bytes()
    flats = [f for f in engine.engine.sharding.flats if f is not None and f.shard is not None]
    shards = {f.shard.untyped_storage().data_ptr(): f.shard.untyped_storage().nbytes() for f in flats}
    return {
        "base_bytes": base_bytes,
        "layer_numel": layer_numel,
        "rise": rise,
        "adapter_state": owned["master"] + owned["optimizer"] + owned["grads"],
        "shards": shards,
        "registered": dict(runtime.registered),
    }


@pytest.mark.parametrize("world_size", [1, 2])
def test_offload_param_build_holds_the_base_once(world_size, monkeypatch):
    # glibc keeps freed heap blocks below its (adaptive, up to 32 MiB) mmap threshold for reuse: with every
    # tensor of 1 MiB and up mapped on its own, the resident figures are the tensors the build holds
    monkeypatch.setenv("MALLOC_MMAP_THRESHOLD_", str(2**20))
    for rank, r in enumerate(run_ranks(_build, world_size, timeout_s=300)):
        base_share = r["base_bytes"] / world_size
        transient = 6 * r["layer_numel"]  # fp32 init values + the bf16 full buffer of one decoder layer
        bound = base_share + transient + r["adapter_state"] + SLACK
        assert r["rise"] <= bound, (
            f"rank {rank}: the build's peak rose by {r['rise'] / 2**20:.0f} MiB for a base share of "
            f"{base_share / 2**20:.0f} MiB"
        )
        assert r["registered"] == r["shards"], f"rank {rank}: host shards not page-locked in place"
        shard_bytes = sum(r["shards"].values())
        assert base_share <= shard_bytes <= base_share * 1.01 + 2**20


def test_registration_ends_with_the_storage(monkeypatch):
    import torch

    from zerolaunch.zero import host_pinning

    runtime = RecordingRuntime()
    monkeypatch.setattr(host_pinning, "accelerator_present", lambda: True)
    monkeypatch.setattr(host_pinning, "cudart", lambda: runtime)
    shard = host_pinning.zeros(1000, torch.device("cpu"), pin=True, dtype=torch.bfloat16)
    ptr = shard.untyped_storage().data_ptr()
    assert runtime.registered == {ptr: 2000}
    view = shard[10:]
    del shard
    gc.collect()
    assert runtime.unregistered == []  # a view still holds the storage
    del view
    gc.collect()
    assert runtime.unregistered == [ptr]
    assert not host_pinning.zeros(8, torch.device("cpu"), pin=False, dtype=torch.float32).any()
    assert len(runtime.registered) == 1  # not asked to pin: not registered
