"""estimate-memory's model-state bytes equal what a real Engine holds (`engine.memory_bytes()`), exactly.

Tests: stages 0-3, 1 and 3 ranks (3: padding, numel not divisible), fp32 and bf16, small buckets (many
buckets, padding, numel not divisible by the world size), stage 2 with and without overlap (the staging
buffer count), Adam / SGD state, the awkward test net (tied, frozen, 1-D params) and the built-in GPT, CPU
optimizer offload (on CPU the "host" is the device, so gpu + host per key is compared), nvme optimizer offload
and nvme param offload (the swap files' bytes too). Each case runs one real step first, so optimizer state and staging buffers exist.
Leaves out: activations and the peak (they need a GPU: `estimate-memory --measure`).
"""

from __future__ import annotations

import os
import sys
import tempfile

import pytest
import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(__file__)), "dist"))

from _estimate_setup import bf16_setup  # noqa: E402
from _spawn import run_ranks  # noqa: E402
from _zero_models import Net  # noqa: E402

from zerolaunch.memory import STATE_KEYS, estimate  # noqa: E402
from zerolaunch.memory.shape import from_module  # noqa: E402
from zerolaunch.models.gpt import build as build_gpt  # noqa: E402
from zerolaunch.zero import Engine  # noqa: E402
from zerolaunch.zero.options import (  # noqa: E402
    EngineOptions,
    OffloadOptions,
    OptimizerOptions,
    PrecisionOptions,
    ZeroOptions,
)

# (model, stage, dtype, bucket, overlap, optimizer, offload[, decay_1d]); for stage 3, "bucket" is the
# persistence threshold (the GPT's blocks are smaller than the default 100_000: they would all stay resident).
# decay_1d (default False): one param group of every param instead of decay / no-decay.
CASES = [
    ("net", 0, "fp32", 100, None, "adamw", "none"),
    ("net", 1, "fp32", 100, None, "adamw", "none"),
    ("net", 1, "bf16", 64, None, "sgd", "optimizer-cpu"),
    ("net", 2, "fp32", 100, False, "adamw", "none"),
    ("net", 2, "bf16", 50, True, "adam", "none"),
    ("gpt", 1, "bf16", 5000, None, "adamw", "none"),
    ("gpt", 2, "bf16", 5000, None, "adamw", "optimizer-cpu"),
    ("gpt", 2, "fp32", 3000, True, "adamw", "none"),
    ("net", 3, "fp32", 100, None, "adamw", "none"),
    ("gpt", 3, "bf16", 100, None, "adamw", "none"),
    ("gpt", 3, "bf16", 100_000, False, "adamw", "optimizer-cpu"),
    ("gpt", 3, "fp32", 1000, None, "sgd", "optimizer+params-cpu"),
    ("net", 1, "bf16", 64, None, "sgd", "optimizer-nvme"),
    ("net", 2, "fp32", 100, True, "adamw", "optimizer-nvme"),
    ("gpt", 3, "bf16", 100, None, "adamw", "optimizer-nvme"),
    ("gpt", 3, "bf16", 100, None, "adamw", "optimizer+params-nvme"),
    ("net", 3, "fp32", 100, None, "sgd", "optimizer+params-nvme"),
    ("net", 1, "fp32", 100, None, "adamw", "none", True),
    ("gpt", 2, "fp32", 3000, False, "adamw", "none", True),
    ("gpt", 3, "bf16", 100, None, "adamw", "none", True),
    # LoRA (PEFT over the tiny GPT, r=3 on qkv and fc): a frozen base, sharded in its units at stage 3
    ("lora", 2, "bf16", 3000, True, "adamw", "none"),
    ("lora", 3, "bf16", 100, None, "adamw", "none"),
    ("lora", 3, "fp32", 200, None, "adamw", "optimizer-cpu"),
    ("lora", 3, "bf16", 100, None, "adamw", "optimizer+params-cpu"),
    ("lora", 3, "bf16", 100, None, "sgd", "optimizer+params-nvme"),
]


def _case(case):
    """The case with decay_1d filled in (False unless given)."""
    return (*case, False) if len(case) == 7 else case


def _model(name: str):
    torch.manual_seed(0)
    if name == "net":
        return Net()
    gpt = build_gpt(size="tiny", vocab_size=97, seq_len=19)
    if name == "lora":
        import peft

        return peft.get_peft_model(gpt, peft.LoraConfig(r=3, target_modules=["qkv", "fc"]))
    return gpt


def _batch(name: str):
    g = torch.Generator().manual_seed(1)
    if name == "net":
        return (torch.randn(3, 31, generator=g),), torch.randn(3, 5, generator=g)
    ids = torch.randint(0, 97, (2, 19), generator=g)
    return {"input_ids": ids, "labels": ids}, None


def _one_step(name, engine) -> None:
    inputs, target = _batch(name)
    if name == "net":
        out = engine(*(x.to(engine.dtype) for x in inputs))
        loss = torch.nn.functional.mse_loss(out.float(), target)
    else:
        loss = engine(**inputs).loss
    engine.backward(loss)
    engine.step()


def _options(stage, dtype, bucket, overlap, optimizer, offload, decay_1d=False) -> EngineOptions:
    param_offload = OffloadOptions(device="cpu" if offload == "optimizer+params-cpu" else "none")
    if offload.endswith("nvme"):
        folder = tempfile.mkdtemp(prefix="zl-nvme-")
        opt_offload = OffloadOptions(device="nvme", nvme_path=folder)
        if offload == "optimizer+params-nvme":
            param_offload = OffloadOptions(device="nvme", nvme_path=folder)
    else:
        opt_offload = OffloadOptions(device="cpu" if offload != "none" else "none")
    return EngineOptions(
        zero=ZeroOptions(
            stage=stage,
            reduce_bucket_size=bucket if stage < 3 else 500_000_000,
            stage3_param_persistence_threshold=bucket if stage == 3 else 100_000,
            overlap_comm=overlap,
            offload_optimizer=opt_offload,
            offload_param=param_offload,
        ),
        precision=PrecisionOptions(dtype=dtype),
        optimizer=OptimizerOptions(
            name=optimizer, lr=1e-3, momentum=0.9 if optimizer == "sgd" else 0.0, decay_1d=decay_1d
        ),
    )


def _measure_cases(rank: int, world_size: int, cases) -> list[dict]:
    out = []
    for name, stage, dtype, bucket, overlap, optimizer, offload, decay_1d in map(_case, cases):
        engine = Engine(_model(name), _options(stage, dtype, bucket, overlap, optimizer, offload, decay_1d))
        _one_step(name, engine)
        out.append(engine.memory_bytes())
        engine.close()
        folder = engine.options.zero.offload_optimizer.nvme_path
        if folder:
            os.rmdir(folder)  # empty: close() deleted the swap file
    return out


def _estimated(case, world_size: int) -> dict:
    name, stage, dtype, bucket, overlap, optimizer, offload, decay_1d = _case(case)
    setup = bf16_setup(
        decay_1d=decay_1d,
        gpus_per_node=world_size,
        dtype=dtype,
        reduce_bucket_size=bucket if stage < 3 else 500_000_000,
        stage3_param_persistence_threshold=bucket if stage == 3 else 100_000,
        overlap_comm=overlap,
        name=optimizer,
        momentum=0.9 if optimizer == "sgd" else 0.0,
    )
    row = estimate(from_module(_model(name), source=name), setup).row(stage, offload)
    return {**{k: row.gpu[k] + row.host[k] for k in STATE_KEYS}, "nvme": row.nvme_bytes}


def _check(world_size: int, measured: list[dict]) -> None:
    mismatches = []
    for case, got in zip(CASES, measured, strict=True):
        want = _estimated(case, world_size)
        if want != {**{k: got[k] for k in STATE_KEYS}, "nvme": got.get("nvme", 0)}:
            mismatches.append(f"world {world_size} {case}: estimate {want} != engine {got}")
    assert not mismatches, "\n".join(mismatches)


def test_estimate_equals_engine_memory_one_rank():
    _check(1, _measure_cases(0, 1, CASES))


@pytest.mark.dist
@pytest.mark.parametrize("world_size", [3])
def test_estimate_equals_engine_memory_on_ranks(world_size):
    results = run_ranks(_measure_cases, world_size, CASES, timeout_s=240)
    # every rank holds the same bytes (equal shards by construction); check rank 0 and that they agree
    assert all(r == results[0] for r in results)
    _check(world_size, results[0])


class _Blocks(torch.nn.Module):
    """A root (inp, head) and four block units of different sizes."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.inp = torch.nn.Linear(7, 16)
        self.blocks = torch.nn.ModuleList(
            torch.nn.Sequential(
                torch.nn.Linear(16, 16 + 8 * i), torch.nn.Tanh(), torch.nn.Linear(16 + 8 * i, 16)
            )
            for i in range(4)
        )
        self.head = torch.nn.Linear(16, 3)

    def forward(self, x):
        h = self.inp(x)
        for block in self.blocks:
            h = block(h)
        return self.head(h).pow(2).mean()


@pytest.fixture
def stage3_hooks(monkeypatch):
    """Keep stage 3's forward hooks at world size 1, where every unit aliases its source and the engine would
    otherwise run the forward without them ([Note: hook-free forward]): the hooks are what this checks."""
    from zerolaunch.zero.stage3.unit_sharding import UnitSharding

    monkeypatch.setattr(UnitSharding, "_forward_without_hooks", lambda self: False)


@pytest.mark.parametrize(
    "reuse, max_live", [(0, 10**9), (1, 10**9), (700, 10**9), (10**9, 10**9), (10**9, 3000)]
)
def test_reuse_replay_keeps_the_units_the_engine_keeps(reuse, max_live, stage3_hooks):
    """memory/stage3.py's replay of the engine's max_reuse_distance rule against the engine (one process,
    stage 3, no prefetch): the units kept per forward, and with every unit kept the peak of gathered
    elements exactly."""
    from zerolaunch.memory.stage3 import gathered_peak_numel, reuse_kept
    from zerolaunch.zero.stage3.partition import ROOT

    zero = ZeroOptions(
        stage=3,
        stage3_param_persistence_threshold=0,
        stage3_prefetch_bucket_size=0,
        stage3_max_live_parameters=max_live,
        stage3_max_reuse_distance=reuse,
    )
    engine = Engine(_Blocks(), EngineOptions(zero=zero))
    steps = 2
    for step in range(steps):
        engine.backward(engine(torch.randn(4, 7, generator=torch.Generator().manual_seed(step))))
        engine.step()
    schedule, flats = engine.sharding.schedule, engine.sharding.flats
    root = flats[ROOT].padded_numel
    blocks = [f.padded_numel for k, f in enumerate(flats) if f is not None and k != ROOT and not f.resident]
    kept = reuse_kept(blocks, root, reuse, max_live)
    assert schedule.reuse_kept == steps * sum(kept)
    peak = gathered_peak_numel([root, *blocks], 0, max_live, reuse)
    assert schedule.peak_live_numel <= peak
    if all(kept):
        assert schedule.peak_live_numel == peak == root + sum(blocks)


@pytest.mark.parametrize("stage", [2, 3])
def test_grads_under_the_backward_peak_are_the_engines_largest_segment(stage, monkeypatch):
    # estimate-memory places, just after the loss, only the first grad segments backward allocates: per param
    # group the largest segment (stage 2), the largest unit's (stage 3), read here from the engine's own
    # segments (zero/grad_shards.py), one rank, no offload.
    from zerolaunch.memory.estimate import _states
    from zerolaunch.zero import plan

    monkeypatch.setattr(plan, "GRAD_SEGMENT_NUMEL", 2000)  # several segments in the tiny GPT at stage 2
    case = ("gpt", stage, "bf16", 3000 if stage == 2 else 100, None, "adamw", "none")
    engine = Engine(_model("gpt"), _options(*case[1:]))
    segments = engine.sharding.grad_shards.segments
    assert len(segments) > 3
    name, stage, dtype, bucket, overlap, optimizer, offload = case
    setup = bf16_setup(
        gpus_per_node=1,
        dtype=dtype,
        reduce_bucket_size=bucket if stage < 3 else 500_000_000,
        stage3_param_persistence_threshold=bucket if stage == 3 else 100_000,
        name=optimizer,
    )
    *_, released, in_backward = _states(from_module(_model(name), source=name), setup, stage, offload)
    assert released == engine.sharding.grad_shards.capacity_bytes
    if stage == 2:
        groups = {s.group for s in segments}
        first = sum(max(s.numel for s in segments if s.group == g) for g in groups)
    else:
        flats = [f for f in engine.sharding.flats if f is not None]
        first = max(sum(segments[i].numel for i in f.grad_segments) for f in flats)
    assert in_backward == 4 * first
