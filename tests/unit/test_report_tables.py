"""End-of-run summary (zerolaunch.report.summary / tables): throughput arithmetic, the ZeRO comm theory,
and the memory / throughput tables rendered at a fixed width of 100 columns.
"""

import io
import json

import pytest
from rich.console import Console

from zerolaunch.report import Reporter, StepMetrics
from zerolaunch.report.summary import summarize, theory_comm_bytes_per_step
from zerolaunch.report.tables import memory_rows, memory_table, throughput_table

GIB = 1024**3


def render(renderable, width: int = 100) -> str:
    buf = io.StringIO()
    Console(file=buf, width=width, force_terminal=False).print(renderable)
    return buf.getvalue()


def mem(**overrides) -> dict:
    d = dict(params=2 * GIB, grads=2 * GIB, optimizer=4 * GIB, master=2 * GIB, buckets=GIB // 2)
    d.update(overrides)
    return d


@pytest.mark.parametrize(
    ("stage", "accum", "expected"),
    [
        (0, 1, 1000 * 4),
        (1, 1, 1000 * 4 + 1000 * 2),  # reduce-scatter fp32 grads + all-gather bf16 params
        (1, 4, 1000 * 4 + 1000 * 2),  # stage 1 communicates only at the accumulation boundary
        (2, 4, 4 * 1000 * 4 + 1000 * 2),
        (3, 1, 2 * 1000 * 2 + 1000 * 4),
        (3, 2, 2 * (2 * 1000 * 2 + 1000 * 4)),
    ],
)
def test_theory_bytes(stage, accum, expected):
    got = theory_comm_bytes_per_step(
        stage,
        1000,
        world_size=4,
        param_element_bytes=2,
        grad_element_bytes=4,
        gradient_accumulation_steps=accum,
    )
    assert got == expected


def test_theory_same_dtype_is_2x_and_3x_params_bytes():
    psi_bytes = 1000 * 2
    kw = dict(world_size=2, param_element_bytes=2, grad_element_bytes=2)
    assert theory_comm_bytes_per_step(1, 1000, **kw) == 2 * psi_bytes
    assert theory_comm_bytes_per_step(2, 1000, **kw) == 2 * psi_bytes
    assert theory_comm_bytes_per_step(3, 1000, **kw) == 3 * psi_bytes
    assert theory_comm_bytes_per_step(3, 1000, world_size=1, param_element_bytes=2, grad_element_bytes=2) == 0


def test_theory_rejects_bad_stage():
    with pytest.raises(ValueError, match="zero_stage must be 0, 1, 2 or 3, got 4"):
        theory_comm_bytes_per_step(4, 10, world_size=2, param_element_bytes=2, grad_element_bytes=4)


def test_summary_numbers_from_known_inputs():
    # step 1 is warm-up (3 s, left out of the times); steps 2-5 take 1, 2, 3, 4 s.
    seconds = [3.0, 1.0, 2.0, 3.0, 4.0]
    history = [
        StepMetrics(i + 1, 1.0, step_seconds=s, comm_seconds=0.25, comm_bytes=3000, skipped=(i == 2))
        for i, s in enumerate(seconds)
    ]
    summary = summarize(
        history,
        tokens_per_step=4 * 256,
        world_size=2,
        flops_per_token=1e9,
        peak_flops_per_device=1e12,
        theory_bytes_per_step=2000,
    )
    assert summary.steps_logged == 5 and summary.timed_steps == 4 and summary.skipped_steps == 1
    assert summary.tokens_seen == 5 * 4 * 256  # steps x global batch x seq len
    assert summary.mean_step_seconds == pytest.approx(2.5)
    assert summary.median_step_seconds == pytest.approx(2.5)
    assert summary.tokens_per_second == pytest.approx(1024 / 2.5)
    assert summary.tokens_per_second_per_device == pytest.approx(1024 / 2.5 / 2)
    assert summary.tflops_per_device == pytest.approx(1e9 * 1024 / 2.5 / 2 / 1e12)
    assert summary.mfu == pytest.approx(1e9 * 1024 / 2.5 / 2 / 1e12)
    assert summary.comm_share == pytest.approx(0.1)
    assert summary.comm_bytes_per_step == 3000 and summary.comm_ratio == pytest.approx(1.5)


def test_summary_of_one_step_times_that_step():
    summary = summarize(
        [StepMetrics(1, 2.0, step_seconds=2.0)],
        tokens_per_step=10,
        world_size=1,
        flops_per_token=None,
        peak_flops_per_device=None,
    )
    assert summary.timed_steps == 1 and summary.tokens_per_second == pytest.approx(5.0)
    assert summary.tflops_per_device is None and summary.mfu is None and summary.comm_ratio is None


def test_memory_table_columns_and_activation_rest():
    rows = [mem(peak_allocated_bytes=16 * GIB, peak_reserved_bytes=20 * GIB, device_bytes=80 * GIB)] * 2
    out = render(memory_table(rows, zero_stage=2))
    assert "Memory per rank, GiB (ZeRO stage 2)" in out
    for header in ("params", "grads", "optim", "state", "buffers", "act./", "other", "alloc", "resv"):
        assert header in out
    # optim state = optimizer + master = 6 GiB; rest = 16 - (2 + 2 + 6 + 0.5) = 5.5 GiB
    assert "6.00" in out and "5.50" in out and "16.00" in out and "20.00" in out
    assert "peaks of the 80.00 GiB device: alloc 20%, resv 25%" in " ".join(out.split())
    assert "optimizer state and grads are sharded over 2 ranks; params are replicated" in " ".join(
        out.split()
    )
    assert all(len(line) <= 80 for line in render(memory_table(rows, zero_stage=2), width=80).splitlines())
    assert "…" not in render(memory_table(rows, zero_stage=2), width=80)  # nothing truncated at 80 columns


def test_memory_table_cpu_has_no_peaks_and_offload_is_flagged():
    out = render(memory_table([mem()], zero_stage=1))
    assert "n/a" in out
    out = render(memory_table([mem(peak_allocated_bytes=GIB)], zero_stage=1))
    assert "offloaded?" in out


def test_memory_table_many_ranks_shows_rank0_and_max():
    rows = [mem(params=(r + 1) * GIB) for r in range(16)]
    out = render(memory_table(rows, zero_stage=3))
    assert (
        "max" in out
        and "16.00" in out
        and "params, grads and optimizer state are sharded over 16 ranks" in (" ".join(out.split()))
    )


@pytest.mark.parametrize(
    ("rows", "message"),
    [
        ([], "memory_by_rank is empty"),
        ([{"params": 1}], r"missing keys \['grads', 'optimizer', 'master', 'buckets'\]"),
        ([mem(grads=-1)], r"memory_by_rank\[0\]\['grads'\] must be a byte count"),
        ([mem(params=1.5)], "must be a byte count"),
    ],
)
def test_bad_memory_dicts_are_clear_errors(rows, message):
    with pytest.raises(ValueError, match=message):
        memory_rows(rows)


def test_throughput_table_states_theory_and_ratio(tmp_path):
    buf = io.StringIO()
    console = Console(file=buf, width=100, force_terminal=False)
    reporter = Reporter(
        tmp_path,
        console,
        total_steps=3,
        world_size=2,
        tokens_per_step=1024,
        flops_per_token=1e9,
        device_name="NVIDIA H200",
        dtype="bf16",
    )
    for i in (1, 2, 3):
        reporter.log(StepMetrics(i, 3.0 / i, step_seconds=0.5, comm_seconds=0.1, comm_bytes=6_000_000_000))
    summary = reporter.finish([mem(), mem()], zero_stage=1, params_numel=1_000_000_000)
    out = " ".join(buf.getvalue().split())
    # theory stage 1, bf16 params + fp32 grads: 1e9 * (4 + 2) bytes = 6 GB -> ratio 1.00x
    assert summary.theory_comm_bytes_per_step == 6_000_000_000
    assert "6.00 GB (stage 1: reduce-scatter grads + all-gather params)" in out
    assert "measured / theory │ 1.00x" in out
    narrow = render(throughput_table(summary, zero_stage=1, world_size=2, peak_text="x" * 30), width=80)
    assert all(len(line) <= 80 for line in narrow.splitlines()) and "…" not in narrow
    assert "reduce-scatter" in narrow and "all-gather" in narrow  # wrapped in the cell, not cut
    assert "of H200 / GH200 bf16 dense peak 989 TFLOP/s" in out
    assert "3,072 (steps x global batch x seq len)" in out
    assert "loss curve (3 steps)" in out and "step 3" in out
    saved = json.loads((tmp_path / "summary.json").read_text())
    assert saved["tokens_seen"] == 3072 and saved["comm_ratio"] == pytest.approx(1.0)


def test_throughput_table_single_rank_says_nothing_to_communicate():
    summary = summarize(
        [StepMetrics(1, 1.0, step_seconds=1.0)],
        tokens_per_step=8,
        world_size=1,
        flops_per_token=None,
        peak_flops_per_device=None,
        theory_bytes_per_step=0,
    )
    out = render(throughput_table(summary, zero_stage=2, world_size=1, peak_text="no peak FLOP/s known"))
    assert (
        "0 (one rank: nothing to communicate)" in out and "MFU" in out and "n/a (no peak FLOP/s known)" in out
    )


def test_one_rank_says_nothing_is_sharded():
    out = " ".join(render(memory_table([mem()], zero_stage=3)).split())
    assert "one rank: nothing is sharded (stage 3 shards across ranks only)" in out


def test_unknown_memory_keys_are_named_not_fatal():
    out = render(memory_table([mem(activations=3), mem()], zero_stage=1))
    assert "not in the table (unknown keys): activations" in out
