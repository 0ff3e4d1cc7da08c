"""bench/step_profile.py's kernel categories, on kernel names an H200 profile of a 1.3B step showed (torch 2.11,
2026-12-05): bench/RESULTS.md reads its table by these columns, so a name landing in the wrong one would move
milliseconds between "attention", "matmul" and the engine's own kernels. Leaves out: the profiling itself (CUDA).
"""

from __future__ import annotations

import pytest
from _helpers import load_bench_script


@pytest.fixture(scope="module")
def step_profile():
    return load_bench_script("step_profile")


SEEN = {
    "nvjet_sm90_tst_128x256_64x4_2x1_v_bz_coopA_NTN": "matmul",
    "nvjet_sm90_tst_192x192_64x4_2x1_v_bz_coopB_bias_TNN": "matmul",
    # cuDNN's attention kernels carry "flash" and "sdpa": attention, not matmul despite their wgmma
    "cudnn_generated_fort_native_sdpa_sm90_flash_bprop_wgmma_f16_knob_26_64x64x64_1x4x1_cga1x1x": "attention",
    "pytorch_flash::flash_fwd_kernel<Flash_fwd_kernel_traits<64, 128, 128, 4>>": "attention",
    "void at::native::(anonymous namespace)::multi_tensor_apply_kernel<at::native::(anonymous namespace)::"
    "FusedAdamMathFunctor<float, 4, ADAM_MODE::ADAMW, false>>": "multi-tensor",
    "void at::native::(anonymous namespace)::multi_tensor_apply_kernel<at::native::(anonymous namespace)::"
    "LpNormFunctor<float, NormType::L2>>": "multi-tensor",
    "void at::native::unrolled_elementwise_kernel<at::native::direct_copy_kernel_cuda(at::TensorIteratorBase&)": (
        "copy/cast"
    ),
    "void at::native::(anonymous namespace)::layer_norm_grad_input_kernel_vectorized<float, float>": "norm",
    "triton_per_fused_native_layer_norm_0": "inductor",
    "ncclDevKernel_ReduceScatter_Sum_f32_RING_LL": "collective",
    "void at::native::vectorized_elementwise_kernel<8, at::native::GeluCUDAKernelImpl(at::Tensor": "other",
}


@pytest.mark.parametrize("kernel", list(SEEN))
def test_each_seen_kernel_lands_in_its_category(step_profile, kernel):
    assert step_profile.category(kernel) == SEEN[kernel]


def test_the_table_has_a_column_for_every_category(step_profile):
    assert set(SEEN.values()) <= set(step_profile.LABELS)
