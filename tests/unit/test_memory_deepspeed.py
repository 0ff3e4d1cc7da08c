"""Our model-state bytes against DeepSpeed's published ZeRO formulas: where they agree and why they differ.

DeepSpeed 0.19.8 (estimate_zero2_model_states_mem_needs in runtime/zero/stage_1_and_2.py, used for stages 1
and 2; estimate_zero3_model_states_mem_needs in runtime/zero/stage3.py), 16-bit params, fp32 Adam, N GPUs:
  ZeRO-1/2 per GPU 2Psi + 18Psi/N (16-bit params whole; 16-bit grads 2 + fp32 grads 4 + fp32 params 4 +
           Adam 8 divided by N), 2Psi with the optimizer offloaded; CPU per node x1.5.
  ZeRO-3   per GPU 4*largest_layer + 18Psi/N.
When deepspeed is importable the column is compared with its own functions; the three figures DeepSpeed
prints for 8 GPUs (PEERS.md: Llama-7B 26.67, Llama-13B 51.52, GPT-2-XL 6.17 GiB) are checked without it.
Leaves out: activations and buffers (DeepSpeed counts neither).
"""

from __future__ import annotations

import pytest
from _estimate_setup import bf16_setup

from zerolaunch.memory import estimate, synthetic_gpt
from zerolaunch.memory.deepspeed import deepspeed_bytes
from zerolaunch.memory.engine_layout import stage012_layout

PSI = 1_300_000_000


def _states(row) -> int:
    g = row.gpu
    return g["params"] + g["grads"] + g["master"] + g["optimizer"]


# Llama-7B / Llama-13B shapes (untied, 32000 vocab) and GPT-2-XL (tied, 50257 vocab, 1024 positions).
LLAMA_7B = 6_738_415_616
LLAMA_13B = 13_015_864_320
GPT2_XL = 1_557_611_200


@pytest.mark.parametrize(
    ("psi", "gib"), [(LLAMA_7B, 26.67), (LLAMA_13B, 51.52), (GPT2_XL, 6.17)], ids=["7b", "13b", "gpt2-xl"]
)
def test_zero2_column_matches_the_figures_deepspeed_prints(psi, gib):
    gpu, _ = deepspeed_bytes(psi, 10**6, 2, "none", bf16_setup(gpus_per_node=8))
    assert round(gpu / 2**30, 2) == gib


def _ds_zero2():
    pytest.importorskip("deepspeed")
    from deepspeed.runtime.zero.stage_1_and_2 import estimate_zero2_model_states_mem_needs

    return estimate_zero2_model_states_mem_needs


def _ds_zero3():
    pytest.importorskip("deepspeed")
    from deepspeed.runtime.zero.stage3 import estimate_zero3_model_states_mem_needs

    return estimate_zero3_model_states_mem_needs


SETUPS = [(1, 1), (8, 1), (3, 1), (4, 2), (8, 4)]


@pytest.mark.parametrize(("per_node", "nodes"), SETUPS)
@pytest.mark.parametrize("stage", [1, 2])
@pytest.mark.parametrize("offload", ["none", "optimizer-cpu"])
def test_zero12_column_equals_deepspeeds_function(per_node, nodes, stage, offload):
    fn = _ds_zero2()
    for psi in (PSI, LLAMA_7B, GPT2_XL, 12_345_677):
        cpu, gpu = fn(psi, per_node, nodes, cpu_offload=offload != "none")
        assert deepspeed_bytes(
            psi, 10**6, stage, offload, bf16_setup(gpus_per_node=per_node, nodes=nodes)
        ) == (
            gpu,
            cpu,
        )


@pytest.mark.parametrize(("per_node", "nodes"), SETUPS)
@pytest.mark.parametrize("offload", ["none", "optimizer-cpu", "optimizer+params-cpu"])
def test_zero3_column_equals_deepspeeds_function(per_node, nodes, offload):
    fn = _ds_zero3()
    for psi, largest in ((PSI, 10**8), (LLAMA_7B, 131_072_000), (12_345_677, 4_321)):
        cpu, gpu, _ = fn(
            psi,
            largest,
            per_node,
            nodes,
            cpu_offload=offload != "none",
            cpu_offload_params=offload == "optimizer+params-cpu",
            zero_init=True,
        )
        setup = bf16_setup(gpus_per_node=per_node, nodes=nodes)
        assert deepspeed_bytes(psi, largest, 3, offload, setup) == (gpu, cpu)


@pytest.mark.parametrize("n_gpus", [1, 3, 8])
def test_stage1_holds_full_16bit_grads_deepspeed_shards(n_gpus):
    # Our stage 1 keeps the full 16-bit grads (2Psi); DeepSpeed's figure divides them by N.
    shape = synthetic_gpt(PSI)
    setup = bf16_setup(gpus_per_node=n_gpus, dtype="bf16", reduce_bucket_size=50_000_000)
    row = estimate(shape, setup).row(1)
    lay = stage012_layout(shape.specs, 1, n_gpus, setup.engine.zero.reduce_bucket_size)
    # each bucket pads by < N elements; each padded element costs 2+2 (params, grads) + 16/N bytes; plus
    # rounding of the int() in DeepSpeed's 18Psi/N and ours.
    slack = 20 * n_gpus * len(lay.buckets) + 8
    ours, theirs = _states(row), row.deepspeed_gpu_bytes
    assert theirs == 2 * PSI + int(18 * PSI / n_gpus)
    expected = theirs + 2 * PSI - 2 * PSI // n_gpus
    if n_gpus == 1:
        # one GPU: no 16-bit grads at all, each grad goes straight to the fp32 shard (zero/flat/reducer.py)
        expected = theirs - 2 * PSI
    assert 0 <= ours - expected <= slack


def test_stage2_holds_buckets_instead_of_a_16bit_grad_shard():
    # DeepSpeed's ZeRO-2 figure keeps 2Psi/N of 16-bit grads; our stage 2 frees each grad into a staging
    # bucket as it arrives, so it holds the staging buckets ("buckets") instead.
    n = 8
    row = estimate(
        synthetic_gpt(PSI), bf16_setup(gpus_per_node=n, dtype="bf16", reduce_bucket_size=50_000_000)
    ).row(2)
    ours = _states(row) + row.gpu["buckets"]
    expected = row.deepspeed_gpu_bytes - 2 * PSI // n + row.gpu["buckets"]
    assert abs(ours - expected) <= 20 * n * 200 + 8


def test_stage3_sharded_part_equals_deepspeeds_18_psi_over_n():
    # DeepSpeed holds 18 bytes per parameter / N (2 bf16 shard + 4 fp32 grad + 4 master + 8 Adam), we hold 16:
    # without offload a unit gathers from its fp32 master, no bf16 shard ([Note: gather from master] in
    # zero/stage3/unit_buffers.py). DeepSpeed adds 4 x largest layer for the gathered layer and its grad; we
    # count the gathered units + prefetch + staging separately (buffer_peak_bytes) and keep the small
    # persistent params whole on every rank.
    n = 8
    setup = bf16_setup(gpus_per_node=n, dtype="bf16", stage3_param_persistence_threshold=0)
    est = estimate(synthetic_gpt(PSI), setup)
    row = est.row(3)
    ours = _states(row)
    ds_sharded = row.deepspeed_gpu_bytes - 4 * est.largest_layer_numel
    assert ds_sharded == int(18 * PSI / n)
    units = len(synthetic_gpt(PSI).units)
    sharded = ds_sharded * 16 // 18
    assert 0 <= ours - sharded <= 16 * units * 2 + 8  # < N padding per group per unit
    assert row.buffer_peak_bytes > 2 * est.largest_layer_numel  # more than one gathered layer in flight


def test_deepspeed_offload_and_cpu_figures():
    setup = bf16_setup(gpus_per_node=4, nodes=2)
    gpu, cpu = deepspeed_bytes(PSI, 10**7, 2, "optimizer-cpu", setup)
    assert gpu == 2 * PSI and cpu == int(PSI * max(4 * 8, 16) * 1.5)
    gpu, cpu = deepspeed_bytes(PSI, 10**7, 3, "optimizer+params-cpu", setup)
    assert gpu == 4 * 10**7 and cpu == int(PSI * 18 / 2 * 1.5)
    gpu, cpu = deepspeed_bytes(PSI, 10**7, 3, "optimizer-cpu", setup)
    assert gpu == 4 * 10**7 + int(2 * PSI / 8) and cpu == int(PSI * 16 / 2 * 1.5)
    assert deepspeed_bytes(PSI, 10**7, 0, "none", setup) == (None, None)
    assert deepspeed_bytes(PSI, 10**7, 3, "optimizer-nvme", setup) == (None, None)


def test_column_counts_a_frozen_base_as_deepspeeds_model_to_params_does():
    # DeepSpeed's estimate functions take model_to_params(model): every param, frozen ones included (its
    # formulas know no frozen base). A LoRA model (PEFT over the tiny GPT) gets the column of that count.
    pytest.importorskip("deepspeed")
    peft = pytest.importorskip("peft")
    from deepspeed.runtime.zero.stage3 import model_to_params

    from zerolaunch.memory.shape import from_module
    from zerolaunch.models.gpt import build

    gpt = build(size="tiny", vocab_size=97, seq_len=19)
    model = peft.get_peft_model(gpt, peft.LoraConfig(r=3, target_modules=["qkv", "fc"]))
    total, largest = model_to_params(model)
    est = estimate(from_module(model, source="lora"), bf16_setup(gpus_per_node=4))
    assert est.numel + est.frozen_numel == total and est.frozen_numel > 10 * est.numel
    setup = bf16_setup(gpus_per_node=4)
    for stage, offload in ((2, "none"), (3, "none"), (3, "optimizer+params-cpu")):
        row = est.row(stage, offload)
        assert (row.deepspeed_gpu_bytes, row.deepspeed_cpu_node_bytes) == deepspeed_bytes(
            total, largest, stage, offload, setup
        )
