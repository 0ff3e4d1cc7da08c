"""`zerolaunch estimate-memory`: per-GPU / per-node memory of every ZeRO stage x offload, and what fits.

    zerolaunch estimate-memory --params 7e9 --gpus 8 --gpu-memory 80GiB
    zerolaunch estimate-memory --model gpt-1.3b --gpus 8 --micro-batch 8 --seq-len 2048
    zerolaunch estimate-memory recipes/tiny-gpt.yaml --gpus 2 [--measure] [--json]
    zerolaunch estimate-memory --model path/to/hf_model --lora-rank 16 [--lora-targets q_proj,v_proj]

LoRA: on --params / --model the adapter is memory/lora.py's arithmetic; on a recipe the flags become its
`peft:` block, applied with the training loop's get_peft_model on the meta device (what --measure trains).

typer + rich only: the arithmetic is zerolaunch/memory/; torch is imported only for a recipe or --model
(built on the meta device) and for --measure. Bad input -> one red line, exit 2.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import subprocess
from typing import TYPE_CHECKING

import typer

from .errors import print_user_error

if TYPE_CHECKING:
    from rich.table import Table

    from zerolaunch.memory import Estimate

GIB = 2**30
_OFFLOAD_SHORT = {
    "none": "-",
    "optimizer-cpu": "opt:cpu",
    "optimizer+params-cpu": "opt+p:cpu",
    "optimizer-nvme": "opt:nvme",
    "optimizer+params-nvme": "opt+p:nvme",
}


def visible_gpu_memory_bytes() -> int | None:
    """Total memory of the first visible GPU, from nvidia-smi (no torch import); None without one."""
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return None
    try:
        out = subprocess.run(
            [exe, "--query-gpu=memory.total", "--format=csv,noheader,nounits"],
            capture_output=True,
            text=True,
            timeout=10,
            check=True,
        ).stdout.split()
        return int(out[0]) * 2**20 if out else None  # MiB
    except (OSError, subprocess.SubprocessError, ValueError):
        return None


def host_memory_bytes() -> int | None:
    """This machine's total RAM (MemTotal of /proc/meminfo, else sysconf); None when neither answers."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemTotal:"):
                    return int(line.split()[1]) * 1024  # kB
    except (OSError, ValueError, IndexError):
        pass
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (OSError, ValueError, AttributeError):
        return None


def _unit(values) -> tuple[str, int]:
    """One binary unit for a table: the largest that keeps its biggest number >= 1 (GiB for a 7B model,
    KiB for a 120k-param one, whose cells would all read 0.00 GiB)."""
    from zerolaunch.report.format import byte_unit

    return byte_unit(v for v in values if v is not None)


def _size(nbytes: int | None, unit_bytes: int = GIB) -> str:
    """`nbytes` in the table's unit in at most 5 characters, so the table fits an 80-column terminal."""
    if nbytes is None:
        return "-"
    g = nbytes / unit_bytes
    return f"{g:.2f}" if g < 10 else f"{g:.1f}" if g < 100 else f"{g:.0f}"


def _params(numel: int) -> str:
    """120,576 -> '120.6 k'; 7e9 -> '7.00 B': the count in the unit that fits it."""
    for unit, size in (("B", 1e9), ("M", 1e6), ("k", 1e3)):
        if numel >= size:
            return f"{numel / size:.3g} {unit}" if numel / size < 100 else f"{numel / size:.0f} {unit}"
    return str(numel)


def _table(title: str, columns: list[str]) -> Table:
    from rich import box
    from rich.table import Table

    table = Table(title=title, title_justify="left", box=box.SIMPLE, pad_edge=False)
    for i, name in enumerate(columns):
        table.add_column(name, justify="left" if i < 2 else "right", no_wrap=True)
    return table


_SHORT_MISFIT = {"GPU": "GPU", "host RAM": "host", "GPU, host RAM": "both"}


def _count(n: int | None) -> str:
    return "-" if n is None else str(n)


def render_gpu_table(est: Estimate) -> Table:
    """Per GPU (rank): the model states, buffers, activations, peak and whether it fits."""
    s = est.setup
    rows = [r for r in est.rows if r.supported]
    unit, unit_bytes = _unit(
        v
        for r in rows
        for v in (
            r.gpu["params"],
            r.gpu["grads"],
            r.gpu["master"] + r.gpu["optimizer"],
            r.activation_bytes,
            r.gpu_total_ckpt_bytes if s.activation_checkpointing else r.gpu_total_bytes,
        )
    )
    _gib = lambda n: _size(n, unit_bytes)  # noqa: E731
    table = _table(
        f"per GPU, {unit}: {s.world_size} GPU(s) = {s.nodes} node(s) x {s.gpus_per_node}, {s.dtype}, "
        f"micro-batch {s.micro_batch} x seq {s.seq_len}",
        ["stage", "offload", "params", "grads", "optim", "bufs", "act", "act*", "peak", "fits"],
    )
    for r in est.rows:
        if not r.supported:
            continue
        ckpt = s.activation_checkpointing
        fits = r.fits_ckpt if ckpt else r.fits
        misfit = r.misfit_ckpt if ckpt else r.misfit
        fit_text = "-" if fits is None else ("[green]yes[/]" if fits else f"[red]{_SHORT_MISFIT[misfit]}[/]")
        g = r.gpu
        table.add_row(
            str(r.stage),
            _OFFLOAD_SHORT[r.offload],
            _gib(g["params"]),
            _gib(g["grads"]),
            _gib(g["master"] + g["optimizer"]),
            _gib(g["buckets"] + r.buffer_peak_bytes),
            _gib(r.activation_bytes),
            _gib(r.activation_ckpt_bytes),
            _gib(r.gpu_total_ckpt_bytes if ckpt else r.gpu_total_bytes),
            fit_text,
        )
    return table


def offload_costs(est: Estimate, bandwidths) -> list:
    """(row, transfer seconds per step or None) for every supported row with an offload."""
    from zerolaunch.memory.offload_cost import offload_step_seconds

    s = est.setup
    return [
        (r, offload_step_seconds(r, est.numel, s.world_size, s.dtype_bytes, bandwidths, est.frozen_numel))
        for r in est.rows
        if r.supported and r.offload != "none"
    ]


def print_narrow_table(console, table: Table) -> None:
    """A table narrower than its title or caption: rich wraps both to the table's own width (43 columns for
    --measure's), so they are printed as lines of their own, wrapped at the console's width."""
    title, caption = table.title, table.caption
    table.title = table.caption = None
    if title:
        console.print(title, style="table.title", justify="left")
    console.print(table)
    if caption:
        console.print(caption, style="table.caption", justify="left")


def render_offload_cost(est: Estimate, bandwidths) -> Table:
    """Per offload row: seconds per optimizer step its transfers take at the measured bandwidths."""
    gbs = lambda v: "-" if v is None else f"{v / 1e9:.1f}"  # noqa: E731
    table = _table(
        f"offload cost per step, measured here: h2d {gbs(bandwidths.h2d)} GB/s, d2h {gbs(bandwidths.d2h)} GB/s, "
        f"disk read {gbs(bandwidths.disk_read)} / write {gbs(bandwidths.disk_write)} GB/s",
        ["stage", "offload", "offload s/step"],
    )
    costs = offload_costs(est, bandwidths)
    for r, cost in costs:
        text = "- (no --nvme-path)" if cost is None else f"{cost:.3f}"
        table.add_row(str(r.stage), _OFFLOAD_SHORT[r.offload], text)
    if not costs:  # e.g. a bf16 master, which is never offloaded
        table.caption = "no offload row for this setup"
    for note in bandwidths.notes:
        table.caption = (table.caption + "; " if table.caption else "") + note
    return table


def render_host_table(est: Estimate) -> Table:
    """Per node on the host, and DeepSpeed's published figures for the same configuration."""
    rows = [r for r in est.rows if r.supported]
    unit, unit_bytes = _unit(
        v
        for r in rows
        for v in (r.cpu_node_bytes, r.nvme_bytes, r.deepspeed_gpu_bytes, r.deepspeed_cpu_node_bytes)
    )
    _gib = lambda n: _size(n, unit_bytes)  # noqa: E731
    table = _table(
        f"per CPU node {unit}, largest micro-batch, DeepSpeed's estimate {unit}",
        ["stage", "offload", "CPU/node", "nvme/rank", "mb", "mb*", "DS GPU", "DS CPU/node"],
    )
    for r in est.rows:
        if r.supported:
            table.add_row(
                str(r.stage),
                _OFFLOAD_SHORT[r.offload],
                _gib(r.cpu_node_bytes),
                _gib(r.nvme_bytes) if r.offload.endswith("nvme") else "-",
                _count(r.max_micro_batch),
                _count(r.max_micro_batch_ckpt),
                _gib(r.deepspeed_gpu_bytes),
                _gib(r.deepspeed_cpu_node_bytes),
            )
    return table


def print_estimate(est: Estimate, console) -> None:
    from zerolaunch.memory.estimate import RECOMMENDATION_RULE

    exact = "" if est.exact else " [yellow](tensor shapes assumed)[/]"
    console.print(f"[bold]model[/]: {est.source}{exact}")
    frozen = (
        f" trainable + {est.frozen_numel:,} ({_params(est.frozen_numel)}) frozen" if est.frozen_numel else ""
    )
    console.print(
        f"params {est.numel:,} ({_params(est.numel)}){frozen}, largest layer {est.largest_layer_numel:,}; "
        f"activation checkpointing {'on' if est.setup.activation_checkpointing else 'off'} in 'peak'"
        + (
            "; activation offload on (saved activations in host memory)"
            if est.setup.activation_offload
            else ""
        )
    )
    console.print(render_gpu_table(est))
    console.print(render_host_table(est))
    if est.rows and est.rows[0].activation_bytes is None:
        console.print(
            "[yellow]activations not estimated (model sizes unknown): GPU peak = model states only[/]"
        )
    console.print(
        "[dim]optim = fp32 master + optimizer state; bufs = stage 2 reduce staging buckets, stage 3 gathered "
        "units + prefetch + staging; act* = with activation checkpointing; peak = resident + max(activations, "
        "optimizer-step copies); fits = within (1 - headroom) of the GPU memory and of the host RAM "
        "(else what is short: GPU, host or both); mb / mb* = the largest micro-batch whose peak fits the GPU with headroom, "
        "without / with activation checkpointing. DS = DeepSpeed's estimate_zero2/3_model_states_mem_needs "
        "(model states only, 16-bit params, CPU x1.5).[/]"
    )
    s = est.setup
    if s.gpu_memory_bytes is not None:
        host = (
            "unknown (not checked)" if s.cpu_memory_bytes is None else f"{s.cpu_memory_bytes / GIB:.1f} GiB"
        )
        console.print(
            f"[dim]checked against {s.gpu_memory_bytes / GIB:.1f} GiB per GPU, host RAM {host} per node, "
            f"{s.headroom:.0%} headroom. {RECOMMENDATION_RULE}[/]"
        )
    skipped = [f"{r.label} ({r.note})" for r in est.rows if not r.supported]
    if skipped:
        console.print(f"[dim]not estimated: {'; '.join(skipped)}[/]")
    style = "bold green" if est.recommended else "bold red"
    console.print(f"[{style}]{est.recommendation}[/]")


def _build_inputs(recipe, params, model, set_, world_size, vocab_size, seq_len, stage3_units, lora=None):
    """(ModelShape, Setup fields from the recipe (its engine options), micro-batch / seq / ckpt defaults).
    lora: (rank, targets or None) from --lora-rank / --lora-targets, or None."""
    from zerolaunch.memory import EstimateError

    given = [n for n, v in (("--params", params), ("--model", model)) if v]
    if len(given) > 1 or not (recipe or given):
        raise EstimateError(
            "give exactly one of RECIPE, --params or --model"
            + (f" (got {' and '.join(given)})" if given else "")
            + " (a RECIPE without a model, e.g. a DeepSpeed ds_config.json, takes --params or --model too)"
            + "; e.g. `zerolaunch estimate-memory --params 7e9 --gpus 8`"
        )
    if set_ and not recipe:
        raise EstimateError("--set overrides a recipe value; it needs a RECIPE")
    if recipe:
        shape, fields, defaults = _recipe_inputs(recipe, set_, world_size, lora)
        if not given:
            if defaults["_recipe"].origins.get("model.builder") == "default":
                # a bare ds_config.json: its default model would be a silent stand-in for the user's
                raise EstimateError(
                    f"{recipe} names no model (a DeepSpeed config?): add --model (a built-in GPT size or a "
                    "Hugging Face config folder) or --params, e.g. --model 1.3b"
                )
            return shape, fields, defaults
        if defaults["_recipe"].origins.get("model.builder") != "default":
            raise EstimateError(
                f"{recipe} names its model already; drop {given[0]}, or use a config without one"
            )
        units = defaults.pop("_recipe").engine.zero.stage3_units  # --measure needs the recipe's own model
        # the config's engine and batch settings with that model
        shape, _, model_defaults = _build_inputs(
            None, params, model, (), world_size, vocab_size, seq_len, units, lora
        )
        shape = dataclasses.replace(shape, source=f"{shape.source}; settings from {recipe}")
        return shape, fields, defaults | model_defaults
    shape, model_defaults = _flag_model_shape(params, model, vocab_size, seq_len, stage3_units)
    if lora is not None:
        from zerolaunch.memory.lora import with_lora

        shape = with_lora(shape, *lora)
    return shape, {}, model_defaults


def _flag_model_shape(params, model, vocab_size, seq_len, stage3_units):
    """The ModelShape of --params or --model, and the defaults that model implies (its sequence length)."""
    from zerolaunch.memory import parse_count, synthetic_gpt

    if params:
        return synthetic_gpt(parse_count(params), vocab_size, seq_len or 1024), {}
    from pathlib import Path

    from zerolaunch.memory.shape import from_gpt_size, from_module, hf_model_on_meta

    if Path(model).exists():
        module = hf_model_on_meta(model)
        shape = from_module(module, source=f"{model} (Hugging Face config)", stage3_units=stage3_units)
        return shape, _hf_seq_default(module)
    return from_gpt_size(model, vocab_size, seq_len or 1024, stage3_units), {}


def _hf_seq_default(module) -> dict:
    """A model that reads at most max_position_embeddings tokens is not estimated at the default 1024."""
    config = getattr(module, "config", None)
    limit = getattr(config, "max_position_embeddings", None) or getattr(config, "n_positions", None)
    return {"seq_len": int(limit)} if isinstance(limit, int) and 0 < limit < 1024 else {}


def _lora_overrides(rec, model, lora) -> list[str]:
    """--set overrides for --lora-rank / --lora-targets on a recipe: they set its `peft:` block's r and
    target_modules. A recipe without a block gets one over all linear layers but the output head unless
    targets are given: PEFT's all-linear for a transformers model, else (PEFT resolves all-linear for those
    only) the names of those layers."""
    from zerolaunch.memory.modules import detect_linears
    from zerolaunch.models.hf import is_hf_model

    rank, targets = lora
    out = [f"peft.r={rank}"]
    if targets is None and rec.peft is None:
        if is_hf_model(model):
            return [*out, "peft.target_modules=all-linear"]
        layers = detect_linears(model)
        body = [lin.module for lin in layers if not lin.head]
        heads = [lin.module for lin in layers if lin.head]

        def hits_head(name: str) -> bool:  # PEFT's rule for a list: the full name, or ends in ".name"
            return any(h == name or h.endswith(f".{name}") for h in heads)

        # a leaf name shared with the head would adapt it too: such layers go by their full path
        leaves = {m.rsplit(".", 1)[-1] for m in body}
        targets = tuple(sorted(n for n in leaves if not hits_head(n)))
        targets += tuple(sorted(m for m in body if hits_head(m.rsplit(".", 1)[-1])))
    if targets is not None:
        out.append(f"peft.target_modules=[{', '.join(targets)}]")
    return out


def _engine_with_dtype(engine, dtype: str | None):
    """The recipe's engine options (else the engine's defaults) with --dtype as the compute dtype. Without
    both, bf16 (--dtype's documented default: what a model is trained in on today's GPUs)."""
    from dataclasses import replace

    from zerolaunch.util.sizes import normalize_dtype
    from zerolaunch.zero.options import EngineOptions

    if engine is None:
        engine, dtype = EngineOptions(), dtype or "bf16"
    if dtype is None:
        return engine
    return replace(engine, precision=replace(engine.precision, dtype=normalize_dtype(dtype)))


def _lora_flags(rank: int | None, targets: str | None) -> tuple[int, tuple[str, ...] | None] | None:
    from zerolaunch.memory import EstimateError
    from zerolaunch.util.sizes import positive_int

    if rank is None:
        if targets is not None:
            raise EstimateError("--lora-targets names the layers of a LoRA adapter; give --lora-rank too")
        return None
    positive_int(rank, "--lora-rank")
    if targets is None:
        return rank, None
    names = tuple(t.strip() for t in targets.split(",") if t.strip())
    if not names:
        raise EstimateError(f"--lora-targets {targets!r} names no module; e.g. --lora-targets q_proj,v_proj")
    return rank, names


def _recipe_inputs(path, set_, world_size, lora=None):
    import torch

    from zerolaunch.config import import_builder, load_recipe
    from zerolaunch.memory.shape import build_on_meta, from_module

    rec = load_recipe(path, overrides=set_, world_size=world_size, check_builders=True)
    fn = import_builder(rec.model.builder, rec.base_dir)
    model = build_on_meta(fn, dict(rec.model.args))
    if lora is not None and rec.origins.get("model.builder") != "default":
        # the recipe's own model: the flags become its peft: block, which --measure then trains too
        overrides = [*set_, *_lora_overrides(rec, model, lora)]
        rec = load_recipe(path, overrides=overrides, world_size=world_size, check_builders=True)
    if rec.peft is not None:
        from zerolaunch.models.peft import apply_peft

        # the training loop's own get_peft_model, on meta: the adapter is created there too (no weights)
        with torch.device("meta"):
            model = apply_peft(model, rec.peft, where=str(path))
    source = f"{path} ({rec.model.builder})"
    if rec.peft is not None:
        source += f", LoRA r={rec.peft.r} (peft: block) over the frozen base"
    shape = from_module(model, source=source, stage3_units=rec.engine.zero.stage3_units)
    seq = rec.data.args.get("seq_len") or rec.model.args.get("seq_len")
    defaults = {
        "micro_batch": rec.train.micro_batch_size,
        "activation_checkpointing": rec.train.activation_checkpointing,
        "activation_offload": rec.train.activation_offload,
    }
    if isinstance(seq, int):
        defaults["seq_len"] = seq
    return shape, {"engine": rec.engine}, defaults | {"_recipe": rec}


HELP = (
    "Estimate per-GPU and per-node memory for ZeRO stages 0-3 with and without offload.\n\n"
    "A row fits when its GPU peak is within (1 - headroom) of --gpu-memory and its host bytes per node within "
    "(1 - headroom) of --cpu-memory (default: this machine's RAM). The recommendation is, of the rows that "
    "fit, the least offload (none < optimizer cpu < optimizer+params cpu < optimizer nvme < optimizer+params "
    "nvme), then no activation checkpointing, then the least communication (stages 0-2 move 2x the params per "
    "step, stage 3 3x), then the most GPU memory left. When nothing fits it names what is short (GPU or host "
    "RAM) with the figures of the closest row.\n\n"
    "Sizes: GB = 10^9 bytes, GiB = 2^30 bytes (also kB/MB/TB, KiB/MiB/TiB)."
)


def register(app: typer.Typer) -> None:
    @app.command("estimate-memory", help=HELP)
    def estimate_memory(
        recipe: str | None = typer.Argument(None, help="Recipe file: its model is built on the meta device."),
        params: str | None = typer.Option(
            None, "--params", help="Parameter count instead, e.g. 7e9 or 1.3B."
        ),
        model: str | None = typer.Option(
            None,
            "--model",
            help="A built-in GPT (e.g. gpt-1.3b), or an HF config.json / model folder (built on meta).",
        ),
        gpus: int = typer.Option(1, "--gpus", help="GPUs per node."),
        nodes: int = typer.Option(1, "--nodes", help="Nodes."),
        gpu_memory: str | None = typer.Option(
            None,
            "--gpu-memory",
            help="Memory per GPU, e.g. 80GiB or 80GB (GB = 10^9 bytes, GiB = 2^30 bytes; "
            "default: the visible GPU's).",
        ),
        cpu_memory: str | None = typer.Option(
            None,
            "--cpu-memory",
            help="Host RAM per node, e.g. 512GiB (GB = 10^9, GiB = 2^30 bytes; default: this machine's).",
        ),
        headroom: float = typer.Option(
            0.1,
            "--headroom",
            help="Fraction of GPU memory and host RAM left free by a row that 'fits' (0.1 = 10%).",
        ),
        micro_batch: int | None = typer.Option(None, "--micro-batch", help="Samples per GPU per step."),
        seq_len: int | None = typer.Option(None, "--seq-len", help="Tokens per sample."),
        dtype: str | None = typer.Option(
            None, "--dtype", help="bf16 | fp16 | fp32 (default: recipe, else bf16)."
        ),
        vocab_size: int = typer.Option(50304, "--vocab-size", help="Vocabulary of --params / --model."),
        ckpt: bool | None = typer.Option(
            None,
            "--activation-checkpointing/--no-activation-checkpointing",
            help="Which activation figure the 'peak' column uses (default: the recipe's, else off).",
        ),
        set_: list[str] = typer.Option(
            [],
            "--set",
            help="Override a recipe value, e.g. --set train.micro_batch_size=4 (repeatable; YAML values).",
            metavar="KEY=VALUE",
        ),
        as_json: bool = typer.Option(False, "--json", help="Print JSON instead of the table."),
        measure: bool = typer.Option(
            False,
            "--measure",
            help="Also run real steps of RECIPE and compare, and measure copy bandwidths here for the "
            "step-time cost of each offload row.",
        ),
        nvme_path: str | None = typer.Option(
            None, "--nvme-path", help="With --measure: a folder on the NVMe drive to time (a 64 MiB file)."
        ),
        measure_steps: int = typer.Option(3, "--measure-steps", help="Steps --measure runs."),
        lora_rank: int | None = typer.Option(
            None,
            "--lora-rank",
            help="LoRA: freeze the model and train a rank-R adapter on its linear layers (each (out, in) "
            "layer adds R*(in+out) params). On a recipe: its peft: block's r (a block is added if absent).",
        ),
        lora_targets: str | None = typer.Option(
            None,
            "--lora-targets",
            help="With --lora-rank: comma-separated module names to adapt, e.g. q_proj,v_proj (default: "
            "PEFT's all-linear, every linear layer but the output head; a recipe's peft: block keeps its own).",
        ),
    ) -> None:
        """Estimate per-GPU and per-node memory for ZeRO stages 0-3 with and without offload."""
        from zerolaunch.config.errors import UserError
        from zerolaunch.memory import EstimateError, Setup, estimate, parse_bytes

        try:
            if gpus < 1 or nodes < 1:
                raise EstimateError(f"--gpus and --nodes must be >= 1, got --gpus {gpus} --nodes {nodes}")
            if vocab_size < 1:
                raise EstimateError(f"--vocab-size must be >= 1, got {vocab_size}")
            if measure and not recipe:
                raise EstimateError("--measure runs real steps of a RECIPE; give one")
            shape, fields, defaults = _build_inputs(
                recipe,
                params,
                model,
                set_,
                gpus * nodes,
                vocab_size,
                seq_len,
                (),
                _lora_flags(lora_rank, lora_targets),
            )
            rec = defaults.pop("_recipe", None)
            if measure and rec is None:
                raise EstimateError(
                    "--measure runs real steps of a RECIPE's own model; this config has none (--model / "
                    "--params only size the estimate)"
                )
            flags = {"micro_batch": micro_batch, "seq_len": seq_len, "activation_checkpointing": ckpt}
            fields = fields | defaults | {k: v for k, v in flags.items() if v is not None}
            fields["engine"] = _engine_with_dtype(fields.get("engine"), dtype)
            gpu_bytes = parse_bytes(gpu_memory) if gpu_memory else visible_gpu_memory_bytes()
            cpu_bytes = parse_bytes(cpu_memory, "--cpu-memory") if cpu_memory else host_memory_bytes()
            setup = Setup(
                gpus_per_node=gpus,
                nodes=nodes,
                gpu_memory_bytes=gpu_bytes,
                cpu_memory_bytes=cpu_bytes,
                headroom=headroom,
                **fields,
            )
            est = estimate(shape, setup)
            report = bandwidths = None
            if measure:
                from zerolaunch.train.measure_memory import measure_recipe

                report = measure_recipe(rec, est, steps=measure_steps, world_size=gpus * nodes)
                from zerolaunch.memory.offload_cost import measure_bandwidths

                bandwidths = measure_bandwidths(nvme_path)
        except (EstimateError, UserError) as exc:
            print_user_error(exc if isinstance(exc, UserError) else UserError(str(exc)))
            raise typer.Exit(2) from None
        if as_json:
            out = est.to_json()
            if report is not None:
                out["measured"] = report.to_json()
            if bandwidths is not None:
                out["bandwidths"] = bandwidths.to_json()
                out["offload_step_seconds"] = {r.label: c for r, c in offload_costs(est, bandwidths)}
            typer.echo(json.dumps(out, indent=2))
            return
        from rich.console import Console

        console = Console()
        print_estimate(est, console)
        if report is not None:
            from zerolaunch.train.measure_memory import render_measure

            print_narrow_table(console, render_measure(report))
        if bandwidths is not None:
            print_narrow_table(console, render_offload_cost(est, bandwidths))
