"""MFU arithmetic (zerolaunch.report.mfu): the peak table lookup and the GPT FLOPs-per-token formula.

Leaves out: anything measured (see test_report_reporter.py for rates computed from logged steps).
"""

import pytest

from zerolaunch.report.mfu import (
    dtype_column,
    find_device,
    flops_per_second,
    gpt_flops_per_token,
    mfu,
    peak_flops,
)


@pytest.mark.parametrize(
    ("device_name", "dtype", "tflops"),
    [
        ("NVIDIA H100 80GB HBM3", "bf16", 989.0),
        ("NVIDIA H200", "bf16", 989.0),
        ("NVIDIA H100 PCIe", "bf16", 756.0),
        ("NVIDIA A100-SXM4-80GB", "bf16", 312.0),
        ("NVIDIA A100 80GB PCIe", "torch.bfloat16", 312.0),
        ("NVIDIA L40S", "fp16", 362.0),
        ("NVIDIA A10G", "bf16", 125.0),
        ("NVIDIA GeForce RTX 4090", "bf16", 165.0),
        ("NVIDIA A100-SXM4-40GB", "fp32", 19.5),
        ("NVIDIA H100 80GB HBM3", "float32", 67.0),
    ],
)
def test_peak_flops_known_devices(device_name, dtype, tflops):
    assert peak_flops(device_name, dtype) == pytest.approx(tflops * 1e12)


def test_specific_names_win_over_generic_substrings():
    # "A10" must not catch an A100 or an A10G; "H100" must not catch the PCIe part.
    assert find_device("NVIDIA A100-SXM4-80GB").name == "A100"
    assert find_device("NVIDIA A10G").name == "A10G"
    assert find_device("NVIDIA A10").name == "A10"
    assert find_device("NVIDIA H100 PCIe").name == "H100 PCIe"
    assert find_device("NVIDIA L4").name == "L4"
    assert find_device("NVIDIA L40S").name == "L40S"


@pytest.mark.parametrize("device_name", ["cpu", "", "Some Future Accelerator 9000"])
def test_unknown_device_has_no_peak(device_name):
    assert peak_flops(device_name, "bf16") is None


def test_no_bf16_on_v100_gives_none_not_a_guess():
    assert peak_flops("Tesla V100-SXM2-32GB", "bf16") is None
    assert peak_flops("Tesla V100-SXM2-32GB", "fp16") == pytest.approx(125e12)


def test_unknown_dtype_is_a_clear_error():
    with pytest.raises(ValueError, match="unknown dtype 'int8'.*bf16"):
        dtype_column("int8")


def test_gpt_flops_per_token_formula():
    # 6N + 12*L*H*d_head*T, numbers worked by hand: 6*124e6 + 12*12*12*64*1024.
    assert gpt_flops_per_token(124_000_000, 12, 12, 64, 1024) == 744_000_000 + 113_246_208
    assert gpt_flops_per_token(0, 1, 1, 1, 1) == 12


def test_gpt_flops_per_token_rejects_bad_input():
    with pytest.raises(ValueError, match="seq_len must be a non-negative int"):
        gpt_flops_per_token(10, 2, 2, 8, -1)
    with pytest.raises(ValueError, match="n_params"):
        gpt_flops_per_token(1.5e6, 2, 2, 8, 16)


def test_mfu_arithmetic():
    # 1000 tokens/s at 1e12 FLOPs/token = 1e15 FLOP/s on a 989 TFLOP/s part.
    achieved = flops_per_second(1e12, 1000, 1.0)
    assert achieved == 1e15
    assert mfu(achieved, 989e12) == pytest.approx(1e15 / 989e12)
    assert mfu(achieved, None) is None
    assert flops_per_second(1e12, 1000, 0.0) is None
