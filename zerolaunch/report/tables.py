"""The end-of-run tables: memory per rank and throughput, as rich Tables.

This module owns what the tables show and how a rank's memory dict is read (`memory_rows`). The numbers
come from summary.py (throughput) and from the training loop (memory: `engine.memory_bytes()` plus the
peaks it measured); nothing here measures or aggregates over ranks.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from rich.table import Table

from zerolaunch.report.format import (
    NA,
    byte_unit,
    fmt_count,
    fmt_decimal_bytes,
    fmt_pct,
    fmt_seconds,
    fmt_tflops,
)
from zerolaunch.report.summary import WARMUP_STEPS, ThroughputSummary
from zerolaunch.util.sizes import fmt_bytes

# engine.memory_bytes() keys (ARCHITECTURE.md "The engine"), all required.
MODEL_STATE_KEYS = ("params", "grads", "optimizer", "master", "buckets")
# What the training loop adds on CUDA; absent on CPU, where no peak is measured.
PEAK_KEYS = ("peak_allocated_bytes", "peak_reserved_bytes", "device_bytes")

SHARDED_BY_STAGE = {
    0: "nothing is sharded: every rank holds full params, grads and optimizer state",
    1: "optimizer state (fp32 master + moments) is sharded over {n} ranks; params and grads are replicated",
    2: "optimizer state and grads are sharded over {n} ranks; params are replicated",
    3: "params, grads and optimizer state are sharded over {n} ranks",
}

THEORY_BY_STAGE = {
    0: "all-reduce grads",
    1: "reduce-scatter grads + all-gather params",
    2: "reduce-scatter grads per micro-step + all-gather params",
    3: "2x all-gather params + reduce-scatter grads, per micro-step",
}

# More ranks than this and the memory table shows rank 0 and the max over ranks instead of every rank.
MAX_RANK_ROWS = 8


@dataclass(frozen=True)
class MemoryRow:
    """One rank's memory, in bytes; the peaks are None where they were not measured (CPU)."""

    rank: str
    params: int
    grads: int
    optimizer_state: int
    """fp32 master copy + optimizer moments."""
    buffers: int
    """Communication buckets."""
    peak_allocated: int | None
    peak_reserved: int | None
    device: int | None

    @property
    def model_states(self) -> int:
        return self.params + self.grads + self.optimizer_state + self.buffers

    @property
    def other(self) -> int | None:
        """Activations, temporaries and fragmentation: the measured peak minus the model states."""
        if self.peak_allocated is None:
            return None
        return self.peak_allocated - self.model_states


def _byte_count(rank: int, key: str, value) -> int | None:
    if value is None and key in PEAK_KEYS:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"memory_by_rank[{rank}][{key!r}] must be a byte count (int >= 0), got {value!r}")
    return value


def memory_rows(memory_by_rank: Sequence[dict]) -> list[MemoryRow]:
    """Read each rank's dict: the engine.memory_bytes() keys plus, on CUDA, the PEAK_KEYS."""
    if not memory_by_rank:
        raise ValueError("memory_by_rank is empty: pass one dict per rank (engine.memory_bytes() + peaks)")
    rows = []
    for rank, entry in enumerate(memory_by_rank):
        if not isinstance(entry, dict):
            raise ValueError(f"memory_by_rank[{rank}] must be a dict, got {type(entry).__name__}")
        missing = [k for k in MODEL_STATE_KEYS if k not in entry]
        if missing:
            raise ValueError(
                f"memory_by_rank[{rank}]: missing keys {missing}; expected the keys of engine.memory_bytes() "
                f"{list(MODEL_STATE_KEYS)} and optionally {list(PEAK_KEYS)}"
            )
        b = {k: _byte_count(rank, k, entry.get(k)) for k in (*MODEL_STATE_KEYS, *PEAK_KEYS)}
        rows.append(
            MemoryRow(
                rank=str(rank),
                params=b["params"],
                grads=b["grads"],
                optimizer_state=b["optimizer"] + b["master"],
                buffers=b["buckets"],
                peak_allocated=b["peak_allocated_bytes"],
                peak_reserved=b["peak_reserved_bytes"],
                device=b["device_bytes"],
            )
        )
    return rows


def unknown_memory_keys(memory_by_rank: Sequence[dict]) -> list[str]:
    """Keys no column shows. Named under the table rather than refused: an engine that reports one more
    kind of memory should not make the end of a finished run fail."""
    known = set(MODEL_STATE_KEYS) | set(PEAK_KEYS)
    return sorted({k for entry in memory_by_rank for k in entry} - known)


def _max_row(rows: Sequence[MemoryRow]) -> MemoryRow:
    def top(values):
        known = [v for v in values if v is not None]
        return max(known) if known else None

    return MemoryRow(
        rank="max",
        params=max(r.params for r in rows),
        grads=max(r.grads for r in rows),
        optimizer_state=max(r.optimizer_state for r in rows),
        buffers=max(r.buffers for r in rows),
        peak_allocated=top(r.peak_allocated for r in rows),
        peak_reserved=top(r.peak_reserved for r in rows),
        device=top(r.device for r in rows),
    )


def sharding_text(zero_stage: int, world_size: int) -> str:
    """What the ZeRO stage shards, in words; on one rank there is nothing to shard over."""
    if world_size == 1 and zero_stage > 0:
        return f"one rank: nothing is sharded (stage {zero_stage} shards across ranks only)"
    return SHARDED_BY_STAGE[zero_stage].format(n=world_size)


def _unknown_note(memory_by_rank: Sequence[dict]) -> str:
    unknown = unknown_memory_keys(memory_by_rank)
    return f"\nnot in the table (unknown keys): {', '.join(unknown)}" if unknown else ""


def memory_table(memory_by_rank: Sequence[dict], zero_stage: int) -> Table:
    """Per-rank memory: model states by kind, the rest of the peak, and the peaks against the device size.

    All cells share one unit (in the title) and the headers take two lines, so the table fits 80 columns;
    the peaks' share of the device is in the caption.
    """
    if zero_stage not in SHARDED_BY_STAGE:
        raise ValueError(f"zero_stage must be 0, 1, 2 or 3, got {zero_stage!r}")
    rows = memory_rows(memory_by_rank)
    shown = rows if len(rows) <= MAX_RANK_ROWS else [rows[0], _max_row(rows)]
    unit, unit_bytes = byte_unit(
        v
        for r in shown
        for v in (r.params, r.grads, r.optimizer_state, r.buffers, r.peak_allocated, r.peak_reserved)
    )
    table = Table(
        title=f"Memory per rank, {unit} (ZeRO stage {zero_stage})",
        caption=sharding_text(zero_stage, len(rows)) + _device_share(shown) + _unknown_note(memory_by_rank),
        title_justify="left",
        caption_justify="left",
    )
    headers = (
        "rank",
        "params",
        "grads",
        "optim\nstate",
        "buffers",
        "act./\nother",
        "peak\nalloc",
        "peak\nresv",
    )
    for header in headers:
        table.add_column(header, justify="left" if header == "rank" else "right", no_wrap=True)

    def size(num_bytes: int | None) -> str:
        return NA if num_bytes is None else f"{num_bytes / unit_bytes:.2f}"

    for row in shown:
        other = row.other
        # A negative rest means part of the model states is not on the device (CPU offload); say so
        # rather than print a negative activation size.
        other_text = NA if other is None else "offloaded?" if other < 0 else size(other)
        table.add_row(
            row.rank,
            size(row.params),
            size(row.grads),
            size(row.optimizer_state),
            size(row.buffers),
            other_text,
            size(row.peak_allocated),
            size(row.peak_reserved),
        )
    return table


def _device_share(rows) -> str:
    """'; peaks of the 80.00 GiB device: alloc 20%, resv 25%' for the largest peaks, when known."""
    device = max((r.device for r in rows if r.device), default=None)
    if device is None:
        return ""
    shares = [
        f"{name} {fmt_pct(peak / device, 0)}"
        for name, peak in (
            ("alloc", max((r.peak_allocated or 0 for r in rows), default=0)),
            ("resv", max((r.peak_reserved or 0 for r in rows), default=0)),
        )
        if peak
    ]
    return f"; peaks of the {fmt_bytes(device)} device: {', '.join(shares)}" if shares else ""


def throughput_table(
    summary: ThroughputSummary,
    *,
    zero_stage: int,
    world_size: int,
    peak_text: str,
) -> Table:
    """Two columns, quantity and value; `peak_text` says which peak the MFU is against (or why none)."""
    table = Table(title="Throughput", title_justify="left", show_header=True)
    table.add_column("quantity", no_wrap=True)
    table.add_column("value", overflow="fold")
    untimed = "step 1" if WARMUP_STEPS == 1 else f"steps 1-{WARMUP_STEPS}"
    warmup = f" ({untimed} not timed: warm-up)" if summary.steps_logged > WARMUP_STEPS else ""
    table.add_row("steps", f"{summary.steps_logged} logged, {summary.timed_steps} timed{warmup}")
    table.add_row("tokens", f"{fmt_count(summary.tokens_seen)} (steps x global batch x seq len)")
    table.add_row(
        "step time",
        f"mean {fmt_seconds(summary.mean_step_seconds)}, median {fmt_seconds(summary.median_step_seconds)}",
    )
    table.add_row(
        "tokens/s",
        f"{fmt_count(summary.tokens_per_second)} total, {fmt_count(summary.tokens_per_second_per_device)} per device"
        f" ({world_size} {'device' if world_size == 1 else 'devices'})",
    )
    table.add_row("TFLOP/s per device", fmt_tflops(summary.tflops_per_device))
    table.add_row("MFU", f"{fmt_pct(summary.mfu)} ({peak_text})")
    comm_share = "" if summary.comm_share is None else f" ({fmt_pct(summary.comm_share)} of the step)"
    table.add_row("comm wait per step", f"{fmt_seconds(summary.comm_seconds_per_step)}{comm_share}")
    theory = summary.theory_comm_bytes_per_step
    if world_size == 1:
        theory_text = "0 (one rank: nothing to communicate)"
    elif theory is None:
        theory_text = NA
    else:
        theory_text = f"{fmt_decimal_bytes(theory)} (stage {zero_stage}: {THEORY_BY_STAGE[zero_stage]})"
    table.add_row("comm per step", f"{fmt_decimal_bytes(summary.comm_bytes_per_step)} measured")
    table.add_row("ZeRO theory", theory_text)
    ratio = NA if summary.comm_ratio is None else f"{summary.comm_ratio:.2f}x"
    table.add_row("measured / theory", ratio)
    if summary.skipped_steps:
        table.add_row("skipped steps", f"{summary.skipped_steps} (inf/nan grads)")
    return table
