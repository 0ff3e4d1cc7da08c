"""bench/step_profile.py's kernel categories, on kernel names an H200 profile of a 1.3B step showed (torch 2.11,
2026-12-05): bench/RESULTS.md reads its table by these columns, so a name landing in the wrong one would move
milliseconds between "attention", "matmul" and the engine's own kernels. And its idle analysis (gaps in the GPU
timeline, the host frame that launched the kernel after each) on hand-made events carrying the FunctionEvent
attributes it reads. Leaves out: the profiling itself (CUDA).
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


# ---- the idle analysis: gaps in the GPU timeline ------------------------------------------------------------


def test_idle_is_the_span_no_interval_covers_with_overlaps_and_any_order(step_profile):
    intervals = [
        (100.0, 130.0, "c"),  # 20 us after b ends: a gap
        (0.0, 50.0, "a"),
        (40.0, 80.0, "b"),  # overlaps a (another stream): no gap
        (131.0, 135.0, "d"),  # 1 us: counted in idle, not listed
        (200.0, 210.0, "e"),  # 65 us after d: the longest gap
    ]
    idle, gaps = step_profile.idle_gaps(intervals, min_gap_us=10)
    assert idle == pytest.approx(20 + 1 + 65)
    assert gaps == [(135.0, 65.0, "d", "e"), (80.0, 20.0, "b", "c")]


def test_an_interval_inside_another_does_not_close_its_cover(step_profile):
    # "short" ends before "long" does: the gap after them opens at long's end and is blamed on it
    idle, gaps = step_profile.idle_gaps(
        [(0, 100, "long"), (10, 20, "short"), (150, 160, "next")], min_gap_us=10
    )
    assert idle == 50
    assert gaps == [(100, 50, "long", "next")]


def test_no_device_activity_is_no_idle(step_profile):
    assert step_profile.idle_gaps([]) == (0.0, [])


def test_launch_site_prefers_the_innermost_project_frame(step_profile):
    ancestry = [
        "aten::copy_",
        "torch/optim/adamw.py(200): step",
        "zerolaunch/zero/optim/shard_optimizer.py(239): _step_chunk",
        "bench/run.py(400): step",
    ]
    assert step_profile.launch_site(ancestry) == "zerolaunch/zero/optim/shard_optimizer.py(239): _step_chunk"
    assert step_profile.launch_site(["aten::mm", "<built-in method matmul>"]) == "<built-in method matmul>"
    assert step_profile.launch_site([]) == "?"


class _Range:
    def __init__(self, start, end):
        self.start, self.end = start, end

    def elapsed_us(self):
        return self.end - self.start


class _Event:
    """The FunctionEvent attributes gap_report reads (torch.autograd.profiler_util.FunctionEvent)."""

    def __init__(self, name, device_type, start, end, id=0, parent=None, stack=(), annotation=False):
        self.name, self.device_type, self.time_range = name, device_type, _Range(start, end)
        self.id, self.cpu_parent, self.stack = id, parent, list(stack)
        self.is_user_annotation = annotation


def test_gap_report_names_the_host_frame_that_launched_the_kernel_closing_each_gap(step_profile):
    from torch.autograd import DeviceType

    frame = _Event("zerolaunch/zero/engine.py(140): step", DeviceType.CPU, 0, 5000, id=1)
    op = _Event("aten::_fused_adamw_", DeviceType.CPU, 2290, 2320, id=7, parent=frame)
    # the runtime call shares the kernel's (CUPTI) correlation id; the op's id is another number space
    launch = _Event("cudaLaunchKernel", DeviceType.CPU, 2300, 2310, id=42, parent=op)
    events = [
        frame,
        op,
        launch,
        _Event("gemm", DeviceType.CUDA, 0, 1000, id=40),
        # a record_function range mirrored onto the GPU timeline: covers the gap, is not device work
        _Event("Optimizer.step#AdamW.step", DeviceType.CUDA, 900, 2700, id=7, annotation=True),
        _Event("FusedAdamMathFunctor", DeviceType.CUDA, 2500, 2600, id=42),  # 1.5 ms idle before it
        _Event("gemm", DeviceType.CUDA, 2600, 3600, id=43),
        _Event("gemm", DeviceType.CUDA, 3700, 4700, id=44),  # 0.1 ms idle, no launch recorded
    ]
    report = step_profile.gap_report(events, steps=2, top=8, host=True)
    assert report["idle_ms"] == pytest.approx((1500 + 100) / 1e3 / 2)
    first, second = report["gaps"]
    assert (first["ms"], first["after"], first["before"]) == (1.5, "gemm", "FusedAdamMathFunctor")
    assert first["launched_by"] == "aten::_fused_adamw_ in zerolaunch/zero/engine.py(140): step"
    assert first["launch_after_idle_ms"] == pytest.approx(1.3)  # launched 1.3 ms after the GPU went idle
    assert second["ms"] == pytest.approx(0.1) and "launched_by" not in second
    # without host activity the same gaps, with no launch sites
    plain = step_profile.gap_report(events, steps=2, top=8, host=False)
    assert plain["idle_ms"] == report["idle_ms"] and all("launched_by" not in g for g in plain["gaps"])


def test_a_launch_outside_aten_is_named_by_its_runtime_call(step_profile):
    from torch.autograd import DeviceType

    # inductor's kernels are launched from Python through the driver, with no aten op around the call
    frame = _Event("zerolaunch/zero/optim/fused_step.py(60): adam_chunk", DeviceType.CPU, 0, 900, id=3)
    launch = _Event("cuLaunchKernel", DeviceType.CPU, 400, 410, id=9, parent=frame)
    events = [
        frame,
        launch,
        _Event("gemm", DeviceType.CUDA, 0, 100, id=8),
        _Event("triton_poi_fused_0", DeviceType.CUDA, 500, 600, id=9),
    ]
    (gap,) = step_profile.gap_report(events, steps=1, host=True)["gaps"]
    assert gap["launched_by"] == "cuLaunchKernel in zerolaunch/zero/optim/fused_step.py(60): adam_chunk"
    assert gap["launch_after_idle_ms"] == pytest.approx(0.3)


def test_user_annotations_on_the_gpu_timeline_are_not_device_work(step_profile):
    from torch.autograd import DeviceType

    kernel = _Event("gemm", DeviceType.CUDA, 0, 10)
    annotation = _Event("Optimizer.step#AdamW.step", DeviceType.CUDA, 0, 50, annotation=True)
    host = _Event("aten::mm", DeviceType.CPU, 0, 10)
    assert step_profile.device_work([host, kernel, annotation]) == [kernel]


def test_events_that_start_and_end_together_need_not_compare(step_profile):
    from torch.autograd import DeviceType

    twins = [_Event("memset", DeviceType.CUDA, 0, 10), _Event("memset", DeviceType.CUDA, 0, 10)]
    report = step_profile.gap_report([*twins, _Event("gemm", DeviceType.CUDA, 60, 70)], steps=1)
    assert report["idle_ms"] == pytest.approx(0.05)
    assert [(g["after"], g["before"]) for g in report["gaps"]] == [("memset", "gemm")]


def test_allocator_churn_is_per_step_and_reads_missing_counters_as_zero(step_profile):
    before = {"segment.all.allocated": 10, "segment.all.freed": 4, "num_alloc_retries": 0}
    after = {"segment.all.allocated": 16, "segment.all.freed": 4}  # an older torch without retries
    assert step_profile.allocator_churn(before, after, steps=3) == {
        "device_mallocs": 2.0,
        "device_frees": 0.0,
        "alloc_retries": 0.0,
    }


def test_the_table_prints_a_row_its_profile_returns(step_profile, capsys):
    # the keys profile_one returns, so a device call cannot end on a typo in the printing
    row = {
        "engine": "zl-z2",
        "size": "1.3b",
        "wall_ms": 295.1,
        "busy_ms": 289.7,
        "idle_ms": 7.5,
        "by_category_ms": {"matmul": 165.6, "attention": 34.2},
        "top_kernels_ms": [["nvjet_sm90_tst_256x128", 53.9]],
        "peak_gib": 45.0,
        "steps": 2,
        "allocator": {"device_mallocs": 0.0, "device_frees": 0.0, "alloc_retries": 0.0},
        "gaps": [
            {
                "ms": 3.1,
                "after": "gemm",
                "before": "FusedAdam",
                "launched_by": "aten::x in a.py",
                "launch_after_idle_ms": 2.9,
            },
            {"ms": 0.4, "after": "gemm", "before": "copy"},
        ],
    }
    step_profile.print_table([row, {"engine": "torch", "error": "timed out"}])
    out = capsys.readouterr().out
    assert "zl-z2" in out and "295.1" in out and "7.5" in out
    assert "launched +2.90 ms into the gap by aten::x in a.py" in out
    assert "device_mallocs 0" in out
    assert "torch" in out and "FAILED: timed out" in out


def test_gap_report_reads_a_real_profile(step_profile):
    # a CPU-only profile (host ops with stacks, no device activity): the attributes gap_report reads exist on
    # torch's own FunctionEvents, and with no kernel there is no span and so no idle time
    import torch
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], with_stack=True) as prof:
        x = torch.randn(64, 64)
        (x @ x).sum()
    events = prof.events()
    assert events
    assert step_profile.gap_report(events, steps=1, host=True) == {"idle_ms": 0.0, "gaps": []}
    assert step_profile.launch_site(step_profile._ancestry(events[-1]))  # walks cpu_parent / stack
