"""Where the master starts (zero/sharding.py master_start): bf16 compute over an fp32 master starts from the
model's values rounded through bf16 at every stage, as DeepSpeed's, whose master is made from the module it
cast to bf16 (tests/dist/test_ds_bf16_master.py compares with DeepSpeed itself); fp32 training and pure bf16
start from the exact init. One process, CPU, no step taken.

Tests: a model built in fp32 (tied weights, a frozen layer) at stages 1, 2, 3 and stage 3 with
offload_optimizer cpu or nvme or offload_param cpu: the fp32 master is the init rounded through bf16 (the frozen layer, which has no master,
holds the same rounded values), and fp32 / pure bf16 give the exact init; stage 3 built on the meta device (each
unit's reset_parameters) starts its master from the 16-bit params it holds; an HF model saved in fp32, loaded
unit by unit at stage 3 from its files, starts from the master a stage-2 engine gets from from_pretrained.
Leaves out: several ranks (tests/dist/test_ds_bf16_master.py).
"""

from __future__ import annotations

import os
import sys

import pytest
import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(__file__)), "dist"))

from _zero_models import Net  # noqa: E402

from zerolaunch.zero import Engine  # noqa: E402
from zerolaunch.zero.options import (  # noqa: E402
    EngineOptions,
    OffloadOptions,
    OptimizerOptions,
    PrecisionOptions,
    ZeroOptions,
)

BF16_OVER_FP32 = PrecisionOptions(dtype="bf16")
PURE_BF16 = PrecisionOptions(dtype="bf16", master_dtype="bf16")
FP32 = PrecisionOptions()


def _options(stage: int, precision: PrecisionOptions, offload: str = "none", nvme_path=None) -> EngineOptions:
    """offload: "none", "cpu" or "nvme" for the optimizer; "param-cpu" offloads the params (and optimizer)."""
    optimizer_device = "cpu" if offload == "param-cpu" else offload
    path = None if nvme_path is None else str(nvme_path)
    return EngineOptions(
        zero=ZeroOptions(
            stage=stage,
            reduce_bucket_size=100,
            stage3_param_persistence_threshold=0,
            offload_optimizer=OffloadOptions(device=optimizer_device, nvme_path=path),
            offload_param=OffloadOptions(device="cpu" if offload == "param-cpu" else "none"),
        ),
        precision=precision,
        optimizer=OptimizerOptions(name="adamw", lr=1e-2),
    )


def _master(engine: Engine, names) -> dict[str, torch.Tensor]:
    """The fp32 master of a 16-bit model (fp32 asked of the engine), else the params as held, in fp32."""
    full = {n: t.clone() for n, t in engine.iter_full_state(torch.float32)}
    return {n: full[n] for n in names}


STAGES = [(1, "none"), (2, "none"), (3, "none"), (3, "cpu"), (3, "nvme"), (3, "param-cpu")]
STAGE_IDS = [
    "stage1",
    "stage2",
    "stage3",
    "stage3-offload-cpu",
    "stage3-offload-nvme",
    "stage3-offload-param",
]


@pytest.mark.parametrize(("stage", "offload"), STAGES, ids=STAGE_IDS)
def test_an_fp32_master_starts_from_the_model_rounded_through_bf16(stage, offload, tmp_path):
    init = dict(Net(0).named_parameters())
    engine = Engine(Net(0), _options(stage, BF16_OVER_FP32, offload, tmp_path))
    master = _master(engine, init)
    rounded = {n: p.detach().bfloat16().float() for n, p in init.items()}
    assert any(not torch.equal(rounded[n], p) for n, p in init.items())  # the rounding shows
    for name in init:
        assert torch.equal(master[name], rounded[name]), name


# pure bf16 does not offload (zero/option_rules.py)
EXACT = [pytest.param(FP32, s, o, id=f"fp32-{i}") for (s, o), i in zip(STAGES, STAGE_IDS, strict=True)] + [
    pytest.param(PURE_BF16, s, o, id=f"pure-bf16-{i}")
    for (s, o), i in zip(STAGES, STAGE_IDS, strict=True)
    if o == "none"
]


@pytest.mark.parametrize(("precision", "stage", "offload"), EXACT)
def test_fp32_and_pure_bf16_start_from_the_exact_init(precision, stage, offload, tmp_path):
    dtype = torch.float32 if precision is FP32 else torch.bfloat16
    init = {n: p.detach().to(dtype) for n, p in Net(0).named_parameters()}
    engine = Engine(Net(0).to(dtype), _options(stage, precision, offload, tmp_path))
    master = _master(engine, init)
    for name, exact in init.items():
        assert torch.equal(master[name], exact.float()), name


def test_stage3_built_on_meta_starts_from_its_16bit_params():
    with torch.device("meta"):
        model = torch.nn.Sequential(torch.nn.Linear(31, 17), torch.nn.LayerNorm(17), torch.nn.Linear(17, 5))
    engine = Engine(model, _options(3, BF16_OVER_FP32))
    names = [n for n, _ in engine.module.named_parameters()]
    master = _master(engine, names)
    held = {n: t.clone() for n, t in engine.iter_full_state()}  # the 16-bit params, gathered
    for name in names:
        assert held[name].dtype == torch.bfloat16
        assert torch.equal(master[name], held[name].float()), name


def test_an_hf_model_loaded_at_stage3_starts_from_stage2s_master(tmp_path):
    pytest.importorskip("transformers")
    from _helpers import tiny_llama
    from transformers import AutoModelForCausalLM

    from zerolaunch.models import hf
    from zerolaunch.models.hf import meta_init_fn

    torch.manual_seed(0)
    hf.build(config=tiny_llama()).save_pretrained(tmp_path / "model")  # fp32 weights
    whole = AutoModelForCausalLM.from_pretrained(tmp_path / "model", local_files_only=True)
    names = [n for n, _ in whole.named_parameters()]
    assert any(not torch.equal(p, p.bfloat16().float()) for p in whole.parameters())  # the rounding shows
    stage2 = _master(Engine(whole, _options(2, BF16_OVER_FP32)), names)

    options = _options(3, BF16_OVER_FP32)
    model = hf.build(path=str(tmp_path / "model"), meta=True)
    stage3 = _master(Engine(model, options, init_fn=meta_init_fn(model, options)), names)
    for name in names:
        assert torch.equal(stage3[name], stage2[name]), name
