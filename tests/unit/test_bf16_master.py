"""Pure bf16: a bf16 master and bf16 optimizer state (precision.master_dtype bf16; DeepSpeed's
bf16.bf16_master_weights_and_grads + bf16_optimizer_states), one rank.

Tests ([Note: bf16 master] in zero/optim/shard_optimizer.py): (1) values: stages 0-3, torch's step gives the
weights of plain torch training the same model in pure bf16 (bf16 params, torch.optim.AdamW fused, the same
batches) bit for bit over several steps (stage 3 with its params offloaded to cpu or nvme too); the fused
step computes the same arithmetic in another order (fused_step.adam_chunk), so it is compared within one bf16
rounding (on a random 4096-element chunk one step of each differs by an ulp in a few elements; on this model
they happen to be equal); with clipping both stay within bf16 rounding of plain torch (torch clips with a
factor computed in bf16, the engine with an fp32 one); (2) memory: master and moments are 2 bytes
an element, grads bf16, and at one rank (stages 0-2) the params are the master; (3) a checkpoint round trip
resumes exactly, and an fp32 master's checkpoint resumes rounded to bf16; (4) the recipe: both DeepSpeed keys give
it (`recipe show`), and each way to ask for what does not exist is exit 2 at its line (one key alone, an fp32
model, offload: tests/_option_cases.py); (5) estimate-memory counts the engine's bytes and shows no offload rows.
Leaves out: several ranks (tests/dist/test_bf16_master_ranks.py) and the GPU (bench/run.py's -purebf16 rows).
"""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(__file__)), "dist"))

from _zero_models import Net, micro_batch  # noqa: E402

from zerolaunch.checkpoint.load import load_checkpoint  # noqa: E402
from zerolaunch.checkpoint.save import save_checkpoint  # noqa: E402
from zerolaunch.zero import Engine  # noqa: E402
from zerolaunch.zero.options import (  # noqa: E402
    EngineOptions,
    OffloadOptions,
    OptimizerOptions,
    PrecisionOptions,
    ZeroOptions,
)

LR, WD = 1e-2, 0.1


def _options(stage, fused=False, clip=0.0) -> EngineOptions:
    return EngineOptions(
        zero=ZeroOptions(stage=stage, reduce_bucket_size=100, stage3_param_persistence_threshold=0),
        precision=PrecisionOptions(dtype="bf16", master_dtype="bf16"),
        # one param group, every param decayed: the reference's torch.optim.AdamW(model.parameters())
        optimizer=OptimizerOptions(name="adamw", lr=LR, weight_decay=WD, decay_1d=True, fused_step=fused),
        gradient_clipping=clip,
    )


def _batch(step):
    x, y = micro_batch(step, 0, 1)
    return x.bfloat16(), y


def _plain_torch_bf16(steps, clip=0.0):
    """The reference: the model in bf16, torch's fused AdamW over its params, torch's clip_grad_norm_."""
    model = Net(0).to(torch.bfloat16)
    opt = torch.optim.AdamW(model.parameters(), lr=LR, weight_decay=WD, fused=True)
    for step in range(steps):
        x, y = _batch(step)
        F.mse_loss(model(x).float(), y).backward()
        if clip:
            torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
        opt.step()
        opt.zero_grad()
    return {n: p.detach() for n, p in model.named_parameters()}, opt


def _train(options, steps):
    engine = Engine(Net(0), options)
    infos = []
    for step in range(steps):
        x, y = _batch(step)
        engine.backward(F.mse_loss(engine(x).float(), y))
        infos.append(engine.step())
    return engine, infos


@pytest.mark.parametrize("stage", [0, 1, 2, 3])
@pytest.mark.parametrize("fused", [False, True], ids=["torch-step", "fused-step"])
def test_the_weights_of_plain_torch_in_pure_bf16(stage, fused):
    want, _ = _plain_torch_bf16(steps=5)
    engine, infos = _train(_options(stage, fused), steps=5)
    assert all(i.stepped for i in infos)
    got = dict(engine.iter_full_state())
    # torch's step: the very kernel plain torch runs; the fused step: within a bf16 ulp (2**-8 relative)
    rtol, atol = (2**-7, LR * 2**-5) if fused else (0, 0)
    for name, w in want.items():
        assert got[name].dtype == torch.bfloat16
        torch.testing.assert_close(got[name], w, rtol=rtol, atol=atol, msg=name)
    assert engine.shards.master[0].dtype == torch.bfloat16
    assert {t.dtype for t in engine.shards.state[0].values()} == {torch.bfloat16}


@pytest.mark.parametrize("device", ["cpu", "nvme"])
def test_stage3_with_its_params_offloaded_too(device, tmp_path):
    # offload_param keeps the units' bf16 shards off the device; the master and its state stay on it
    options = _options(3)
    offload = OffloadOptions(device=device, nvme_path=str(tmp_path) if device == "nvme" else None)
    options = replace(options, zero=replace(options.zero, offload_param=offload))
    want, _ = _plain_torch_bf16(steps=5)
    engine, _ = _train(options, steps=5)
    got = dict(engine.iter_full_state())
    for name, w in want.items():
        torch.testing.assert_close(got[name], w, rtol=0, atol=0, msg=name)
    engine.close()


@pytest.mark.parametrize("stage", [1, 3])
def test_with_clipping_it_tracks_plain_torch_within_bf16_rounding(stage):
    clip = 0.05
    want, _ = _plain_torch_bf16(steps=5, clip=clip)
    engine, infos = _train(_options(stage, clip=clip), steps=5)
    assert all(i.grad_norm > clip for i in infos)  # every step clipped
    got = dict(engine.iter_full_state())
    unclipped, _ = _plain_torch_bf16(steps=5)
    for name, w in want.items():
        # a bf16 ulp of the weights (2**-8 relative; 1e-3 at 0.25) where a rounding of the grads flipped
        torch.testing.assert_close(got[name].float(), w.float(), rtol=2**-7, atol=LR * 2**-3, msg=name)
    # and the clipping mattered: some weight is further from the unclipped run than the tolerance (up to 7e-3)
    assert any(
        not torch.allclose(got[n].float(), unclipped[n].float(), rtol=2**-7, atol=LR * 2**-3) for n in want
    )


@pytest.mark.parametrize("stage", [0, 2, 3])
def test_two_bytes_of_master_and_of_each_moment(stage):
    engine, _ = _train(_options(stage), steps=1)
    shard = sum(t.numel() for t in engine.shards.master)
    mem = engine.memory_bytes()
    assert mem["optimizer"] == 2 * 2 * shard
    assert mem["grads"] == 2 * shard  # one rank: the grad shard is bf16 ([Note: compute-dtype grads])
    frozen = 2 * sum(p.numel() for p in engine.module.parameters() if not p.requires_grad)
    if stage == 3:  # the units are gathered from the master: no other copy of the params is kept
        assert mem["master"] == 2 * shard and mem["params"] == frozen
    else:  # [Note: master is params]: plain torch's 8 bytes per param in all (2 params, 2 grads, 4 moments)
        assert mem["master"] == 0 and mem["params"] == 2 * shard + frozen
        flat = engine.sharding.flat_params.buffers
        assert all(m.data_ptr() == b.data_ptr() for m, b in zip(engine.shards.master, flat, strict=True))


def test_a_checkpoint_round_trip_resumes_exactly(tmp_path):
    options = _options(2)
    engine, _ = _train(options, steps=3)
    save_checkpoint(engine, tmp_path / "ck", step=3)
    resumed = Engine(Net(1), options)  # other initial weights: everything must come from the checkpoint
    load_checkpoint(resumed, tmp_path / "ck")
    for step in range(3, 6):
        for e in (engine, resumed):
            x, y = _batch(step)
            e.backward(F.mse_loss(e(x).float(), y))
            e.step()
    want, got = dict(engine.iter_full_state()), dict(resumed.iter_full_state())
    for name, w in want.items():
        torch.testing.assert_close(got[name], w, rtol=0, atol=0, msg=name)
    for kind in ("exp_avg", "exp_avg_sq"):
        assert torch.equal(resumed.shards.state[0][kind], engine.shards.state[0][kind])


def test_an_fp32_master_checkpoint_resumes_in_pure_bf16_rounded(tmp_path):
    options = _options(2)
    fp32_run, _ = _train(replace(options, precision=PrecisionOptions(dtype="bf16")), steps=2)
    save_checkpoint(fp32_run, tmp_path / "ck", step=2)
    resumed = Engine(Net(1), options)
    load_checkpoint(resumed, tmp_path / "ck")
    want = dict(fp32_run.iter_full_state(torch.float32))
    for name, got in resumed.iter_full_state():
        if name in want:  # params: the fp32 master rounded once
            assert torch.equal(got, want[name].to(torch.bfloat16)), name
    assert resumed.shards.step_count == 2
    moment = fp32_run.shards.state[0]["exp_avg"]
    assert torch.equal(resumed.shards.state[0]["exp_avg"], moment.to(torch.bfloat16))


def test_more_than_the_options_allow_is_refused():
    with pytest.raises(ValueError, match="precision.master_dtype is bf16, but the model computes in fp32"):
        Engine(Net(0), replace(_options(2), precision=PrecisionOptions(dtype="fp32", master_dtype="bf16")))


RECIPE = """\
model: {builder: zerolaunch.models.gpt:build, args: {size: tiny, vocab_size: 256, seq_len: 64}}
data: {builder: zerolaunch.data.synthetic:build, args: {vocab_size: 256, seq_len: 64}}
train: {steps: 2, micro_batch_size: 2}
deepspeed:
  bf16: {enabled: ENABLED, bf16_master_weights_and_grads: MASTER, bf16_optimizer_states: STATES}
  zero_optimization: {stage: 2}
"""


def _recipe_show(tmp_path, enabled="true", master="true", states="true"):
    path = tmp_path / "r.yaml"
    path.write_text(RECIPE.replace("ENABLED", enabled).replace("MASTER", master).replace("STATES", states))
    return subprocess.run(
        [sys.executable, "-m", "zerolaunch", "recipe", "show", str(path), "--json"],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=Path(__file__).resolve().parents[2],
    )


def test_the_deepspeed_keys_give_a_bf16_master(tmp_path):
    proc = _recipe_show(tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert '"master_dtype": "bf16"' in proc.stdout
    assert _recipe_show(tmp_path, master="false", states="false").stdout.count('"master_dtype": "fp32"') == 1


@pytest.mark.parametrize(
    "enabled, master, states, needle",
    [
        ("true", "false", "true", "`deepspeed.bf16.bf16_optimizer_states` is true, but bf16_master_weights"),
        ("true", "true", "false", "without bf16_optimizer_states"),
        ("false", "true", "true", "the model trains in fp32"),
    ],
)
def test_what_does_not_exist_is_exit_2_at_its_line(tmp_path, enabled, master, states, needle):
    proc = _recipe_show(tmp_path, enabled, master, states)
    assert proc.returncode == 2
    assert "r.yaml line 5" in proc.stderr and needle in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr


@pytest.mark.parametrize("stage", [2, 3])
def test_estimate_memory_counts_the_engines_bytes(stage):
    from zerolaunch.memory import STATE_KEYS, Setup, estimate
    from zerolaunch.memory.shape import from_module

    options = _options(stage)
    engine, _ = _train(options, steps=1)
    got = engine.memory_bytes()
    zero = replace(options.zero, stage3_param_persistence_threshold=0)
    est = estimate(from_module(Net(0), source="net"), Setup(engine=replace(options, zero=zero)))
    row = est.row(stage, "none")
    assert {k: row.gpu[k] for k in STATE_KEYS} == {k: got[k] for k in STATE_KEYS}
    assert {r.offload for r in est.rows} == {"none"}  # a bf16 master is never offloaded
