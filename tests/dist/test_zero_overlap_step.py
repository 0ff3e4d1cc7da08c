"""offload_optimizer.overlap_step: the offloaded CPU step runs while the next forward starts.

Tests (one process, CPU, no process group): the first module's forward starts before the background step has
stepped its last chunk (each chunk is slowed by a sleep so the order is observable) and the weights still equal
those of the same engine without overlap_step; params read outside a forward are the previous step's until
wait_for_step(); an error inside the background step surfaces at the next engine call. Parity with plain AdamW on 2-3
gloo ranks, stages 1 and 2, is in test_zero12_parity.py; the recipe key and its refusal outside stages 1/2 in
tests/unit/test_config_deepspeed.py. Leaves out: CUDA copy streams (bench/ on the device).
"""

from __future__ import annotations

import time

import pytest
import torch
import torch.nn.functional as F
from _zero_models import Net, micro_batch, train_engine

from zerolaunch.zero import Engine
from zerolaunch.zero.optim import shard_optimizer
from zerolaunch.zero.options import EngineOptions, OffloadOptions, OptimizerOptions, ZeroOptions


def _options(stage: int, overlap_step: bool) -> EngineOptions:
    return EngineOptions(
        zero=ZeroOptions(
            stage=stage,
            reduce_bucket_size=100,
            offload_optimizer=OffloadOptions(device="cpu", overlap_step=overlap_step),
        ),
        optimizer=OptimizerOptions(name="adamw", lr=1e-2, weight_decay=0.1),
        gradient_clipping=0.05,
    )


def _slow_chunks(engine, log: list, seconds: float) -> None:
    step_chunk = engine.shards._step_chunk

    def slow(*args, **kwargs):
        time.sleep(seconds)
        step_chunk(*args, **kwargs)
        log.append(("chunk", time.perf_counter()))

    engine.shards._step_chunk = slow


@pytest.mark.parametrize("stage", [1, 2])
def test_next_forward_starts_before_the_step_ends_and_weights_match(monkeypatch, stage):
    monkeypatch.setattr(shard_optimizer, "HOST_CHUNK_NUMEL", 64)
    plain = Engine(Net(0), _options(stage, False))
    overlapped = Engine(Net(0), _options(stage, True))
    log: list = []
    _slow_chunks(overlapped, log, 0.02)
    overlapped.module.inp.register_forward_pre_hook(lambda *_: log.append(("inp", time.perf_counter())))
    train_engine(plain, 0, 1, 3)
    train_engine(overlapped, 0, 1, 3)
    overlapped.wait_for_step()
    chunks = len(overlapped.shards.chunks)
    assert chunks > 4
    # step 1's chunks end before forward 2's first module; from then on the first module (its bucket is
    # stepped first) starts while later chunks of the same step are still to come.
    kinds = [k for k, _ in log]
    second_forward = kinds.index("inp", 1)
    assert "chunk" in kinds[second_forward + 1 : second_forward + chunks], kinds
    for (name, a), b in zip(plain.module.named_parameters(), overlapped.module.parameters(), strict=True):
        torch.testing.assert_close(b, a, rtol=0, atol=0, msg=name)
    overlapped.close()


def _stepping_in_background(monkeypatch):
    """(engine, the head's weight before the step) with step() just returned and the CPU still stepping."""
    monkeypatch.setattr(shard_optimizer, "HOST_CHUNK_NUMEL", 64)
    engine = Engine(Net(0), _options(2, True))
    _slow_chunks(engine, [], 0.05)  # the head's bucket is stepped last: ~0.5 s after step() returns
    x, y = micro_batch(0, 0, 1)
    engine.backward(F.mse_loss(engine(x), y))
    old = engine.module.head.weight.detach().clone()
    assert engine.step().stepped
    return engine, old


def test_params_outside_forward_are_stale_until_wait_for_step(monkeypatch):
    engine, old = _stepping_in_background(monkeypatch)
    assert torch.equal(engine.module.head.weight, old)  # step() returned; the CPU is still stepping
    engine.wait_for_step()
    new = engine.module.head.weight.detach().clone()
    assert not torch.equal(new, old)
    engine.wait_for_step()  # idempotent
    assert torch.equal(engine.module.head.weight, new)
    engine.close()


@pytest.mark.parametrize("owner", ["root", "head"])
def test_state_dict_waits_for_the_step_first(monkeypatch, owner):
    # torch.save(model.state_dict()) right after step() must write this step's weights, from the root or
    # from the module that owns them, though the CPU is still stepping when step() returns.
    engine, old = _stepping_in_background(monkeypatch)
    if owner == "root":
        saved = engine.module.state_dict()["head.weight"].clone()
    else:
        saved = engine.module.head.state_dict()["weight"].clone()
    engine.wait_for_step()
    assert not torch.equal(saved, old)
    assert torch.equal(saved, engine.module.head.weight)
    engine.close()


def test_an_error_in_the_background_step_surfaces_at_the_next_call():
    engine = Engine(Net(0), _options(1, True))

    def broken(*_args, **_kwargs):
        raise RuntimeError("disk on fire")

    engine.shards._step_chunk = broken
    train_engine(engine, 0, 1, 1)  # the step starts in the background and fails there
    with pytest.raises(RuntimeError, match="disk on fire"):
        engine.wait_for_step()
    engine.close()


@pytest.mark.parametrize(
    ("stage", "device"), [(3, "cpu"), (2, "none"), (1, "none")], ids=["stage3", "stage2-no-offload", "stage1"]
)
def test_refused_outside_offloaded_stages_1_and_2(stage, device):
    options = EngineOptions(
        zero=ZeroOptions(stage=stage, offload_optimizer=OffloadOptions(device=device, overlap_step=True))
    )
    with pytest.raises(
        ValueError, match="overlap_step runs an offloaded optimizer step .* for ZeRO stages 1 and 2"
    ):
        Engine(Net(0), options)
