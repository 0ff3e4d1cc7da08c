"""`estimate-memory --measure`: run a few real steps of the recipe and set the bytes beside the estimate.

Owns a small, self-contained run: one process per rank on this machine (CUDA + NCCL when enough GPUs are
visible, else CPU + gloo), rendezvous through a FileStore in a temp dir (no ports), a timeout on the group
and on every wait. Each rank builds the recipe's model (with its `peft:` adapter) and data as the training loop
does (loop.py build_train_model: on the meta device at stage 3; train/batches.py), wraps the model in the engine
(build.py build_engine), runs `steps` optimizer steps and reports
`engine.memory_bytes()` and, on CUDA, `torch.cuda.max_memory_allocated()` over the steps after the first
(the first includes the engine's construction copies, which no later step repeats).
It does not write a run dir, checkpoints or metrics.
"""

from __future__ import annotations

import datetime
import os
import queue
import tempfile
from dataclasses import dataclass

from zerolaunch.memory.estimate import STATE_KEYS, Estimate, Row
from zerolaunch.util.sizes import EstimateError

TIMEOUT_S = 600.0


@dataclass
class MeasureReport:
    device: str
    world_size: int
    steps: int
    row: Row
    """The estimate's row for the recipe's own stage and offload."""
    activation_checkpointing: bool
    measured: list[dict]
    """Per rank: memory_bytes() keys, plus max_allocated / max_reserved on CUDA."""

    def component_pairs(self) -> list[tuple[str, int, int]]:
        """(component, estimated, measured on rank 0); host and device summed (equal on a CPU run)."""
        m = self.measured[0]
        return [(k, self.row.gpu[k] + self.row.host[k], m[k]) for k in STATE_KEYS]

    @property
    def estimated_peak_bytes(self) -> int:
        return self.row.gpu_total_ckpt_bytes if self.activation_checkpointing else self.row.gpu_total_bytes

    @property
    def measured_peak_bytes(self) -> int | None:
        peaks = [m.get("max_allocated") for m in self.measured]
        return max(peaks) if all(p is not None for p in peaks) else None

    def to_json(self) -> dict:
        return {
            "device": self.device,
            "world_size": self.world_size,
            "steps": self.steps,
            "row": self.row.label,
            "components": {k: {"estimated": e, "measured": m} for k, e, m in self.component_pairs()},
            "peak": {
                "estimated": self.estimated_peak_bytes,
                "measured_max_allocated": self.measured_peak_bytes,
            },
            "per_rank": self.measured,
        }


def recipe_row(est: Estimate, engine_options) -> Row:
    z = engine_options.zero
    if z.offload_param.device != "none":
        if z.offload_optimizer.device != z.offload_param.device:
            raise EstimateError(
                f"--measure: the estimate has rows for offload_param on the same device as offload_optimizer; "
                f"the recipe has offload_param {z.offload_param.device}, offload_optimizer "
                f"{z.offload_optimizer.device}: set both to {z.offload_param.device}"
            )
        offload = f"optimizer+params-{z.offload_param.device}"
    elif z.offload_optimizer.device != "none":
        offload = f"optimizer-{z.offload_optimizer.device}"
    else:
        offload = "none"
    return est.row(z.stage, offload)


def measure_recipe(recipe, est: Estimate, *, steps: int, world_size: int) -> MeasureReport:
    """Run `steps` steps of `recipe` on `world_size` local ranks; see the module docstring."""
    import torch

    from zerolaunch.config import save_resolved

    if steps < 2:
        raise EstimateError(f"--measure-steps must be >= 2 (the first step is not measured), got {steps}")
    if est.setup.nodes != 1:
        raise EstimateError("--measure runs on this machine only; use --nodes 1 (and --gpus <= local GPUs)")
    cuda = torch.cuda.is_available()
    if cuda and torch.cuda.device_count() < world_size:
        raise EstimateError(
            f"--measure with --gpus {world_size} needs {world_size} visible GPUs, found "
            f"{torch.cuda.device_count()}; lower --gpus"
        )
    row = recipe_row(est, recipe.engine)
    if not row.supported:
        raise EstimateError(f"the recipe asks for {row.label}, which the engine refuses: {row.note}")
    with tempfile.TemporaryDirectory(prefix="zl_measure_") as tmp:
        path = str(save_resolved(recipe, tmp))
        if world_size == 1:
            measured = [_measure_rank(0, 1, path, steps, cuda)]
        else:
            measured = _spawn(world_size, os.path.join(tmp, "store"), path, steps, cuda)
    device = torch.cuda.get_device_name(0) if cuda else "cpu"
    return MeasureReport(device, world_size, steps, row, recipe.train.activation_checkpointing, measured)


def _measure_rank(rank: int, world_size: int, recipe_path: str, steps: int, cuda: bool) -> dict:
    import torch

    from zerolaunch.build import build_engine
    from zerolaunch.config import load_resolved
    from zerolaunch.train import seeding
    from zerolaunch.train.batches import BatchSource, build_data, forward, loss_of, to_device
    from zerolaunch.train.loop import build_train_model

    recipe = load_resolved(recipe_path)
    device = torch.device("cuda", rank) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    seeding.seed_all(recipe.train.seed, device)
    # the model and engine `zerolaunch train` builds: at stage 3 on the meta device where the engine fills it
    # unit by unit (an HF base under a peft: adapter too), so no rank holds the whole model to measure it
    engine = build_engine(build_train_model(recipe), recipe.engine, group=None, device=device)
    source = BatchSource(build_data(recipe, rank, world_size), recipe.data.builder)
    for step in range(steps):
        if step == 1 and cuda:
            torch.cuda.synchronize(device)
            torch.cuda.reset_peak_memory_stats(device)
        for _ in range(recipe.engine.gradient_accumulation_steps):
            loss = loss_of(forward(engine, to_device(source.next(), device)))
            engine.backward(loss)
            engine.step()
    out = dict(engine.memory_bytes())
    if cuda:
        torch.cuda.synchronize(device)
        out["max_allocated"] = torch.cuda.max_memory_allocated(device)
        out["max_reserved"] = torch.cuda.max_memory_reserved(device)
    return out


def _rank_main(rank, world_size, store_path, recipe_path, steps, cuda, results) -> None:
    import traceback

    try:
        import torch
        import torch.distributed as dist

        torch.set_num_threads(1)
        store = dist.FileStore(store_path, world_size)
        dist.init_process_group(
            "nccl" if cuda else "gloo",
            store=store,
            rank=rank,
            world_size=world_size,
            timeout=datetime.timedelta(seconds=TIMEOUT_S),
        )
        try:
            results.put((rank, True, _measure_rank(rank, world_size, recipe_path, steps, cuda)))
        finally:
            dist.destroy_process_group()
    except BaseException as exc:  # the parent shows the rank's message; it must never hang on a dead rank
        message = str(getattr(exc, "message", "")) or traceback.format_exc()
        results.put((rank, False, message))


def _spawn(world_size: int, store_path: str, recipe_path: str, steps: int, cuda: bool) -> list[dict]:
    import torch.multiprocessing as mp

    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    procs = [
        ctx.Process(
            target=_rank_main,
            args=(r, world_size, store_path, recipe_path, steps, cuda, results),
            daemon=True,
        )
        for r in range(world_size)
    ]
    for p in procs:
        p.start()
    got: dict[int, dict] = {}
    deadline = datetime.datetime.now() + datetime.timedelta(seconds=TIMEOUT_S)
    try:
        while len(got) < world_size:
            left = (deadline - datetime.datetime.now()).total_seconds()
            if left <= 0:
                raise EstimateError(f"--measure: the ranks did not finish within {TIMEOUT_S:.0f} s")
            try:
                rank, ok, value = results.get(timeout=min(left, 1.0))
            except queue.Empty:
                dead = [p for p in procs if p.exitcode not in (None, 0)]
                if dead and results.empty():
                    raise EstimateError(f"--measure: a rank died (exit code {dead[0].exitcode})") from None
                continue
            if not ok:
                raise EstimateError(f"--measure: rank {rank} failed: {value}")
            got[rank] = value
    finally:
        for p in procs:
            p.join(timeout=10)
            if p.is_alive():
                p.kill()
    return [got[r] for r in range(world_size)]


def render_measure(report: MeasureReport):
    from rich import box
    from rich.table import Table

    table = Table(
        title=f"--measure: {report.row.label}, {report.world_size} rank(s) on {report.device}, "
        f"{report.steps} steps (rank 0)",
        title_justify="left",
        box=box.SIMPLE,
        pad_edge=False,
    )
    for name in ("component", "estimated", "measured", "diff"):
        table.add_column(name, justify="left" if name == "component" else "right")
    for name, est, got in report.component_pairs():
        table.add_row(name, _human(est), _human(got), _diff(est, got))
    peak = report.measured_peak_bytes
    if peak is not None:
        est = report.estimated_peak_bytes
        ok = abs(est - peak) <= 0.10 * peak
        table.add_row(
            "peak (max_allocated)",
            _human(est),
            _human(peak),
            f"[{'green' if ok else 'red'}]{_diff(est, peak)}[/]",
        )
    return table


def _human(n: int) -> str:
    return f"{n / 2**30:.3f} GiB" if n >= 2**30 else f"{n / 2**20:.3f} MiB" if n >= 2**20 else f"{n:,} B"


def _diff(est: int, got: int) -> str:
    if est == got:
        return "exact"
    return f"{(est - got) / got:+.1%}" if got else f"{est - got:+,} B"
