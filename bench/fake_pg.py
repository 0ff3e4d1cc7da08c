"""Per-rank memory and compute-only step time at world sizes 8 and 64, in one process on one device.

    python bench/fake_pg.py --device cuda --world-sizes 8,64 --models gpt-1.3b,llama-7b --stages 1,2,3 \
        --steps 3 --out /tmp/fake_pg.json
    python bench/fake_pg.py --device cpu --models tiny --world-sizes 8 --stages 1,2,3 --steps 2

Each configuration (model x world size x stage) runs in its own subprocess, which joins torch's "fake"
process group (`torch.testing._internal.distributed.fake_pg`, what torchtitan uses for memory estimation)
as rank 0 of N. The fake backend's collectives return at once and move no data, so the engine builds and
steps exactly as rank 0 of an N-rank job would: its shards, buckets and gathered units have the sizes they
would have, while the values are wrong (no other rank contributes). The row reports:

- the estimate of `zerolaunch estimate-memory` for the same model, stage, world size, micro batch and seq len
  (`zerolaunch.memory.estimate`, the function the CLI calls, its Setup holding the same EngineOptions the
  engine gets, as the CLI's recipe path does);
- what the engine says it holds (`engine.memory_bytes()`: params, grads, master, optimizer, buckets) and
  `torch.cuda.max_memory_allocated()` over the steps after the first (the first includes construction);
- the median step time of those steps: compute only, the lower bound of a real N-GPU step.

[Note: filled outputs]
The fake collectives leave their outputs as allocated (torch.empty: whatever the allocator last held), so
grads and stage 3's gathered weights would be arbitrary bits, often inf/nan, and the engine would skip every
optimizer step (it skips a non-finite step in every dtype), which would make the step time too short. By
default the collective entry points of torch.distributed are wrapped before zerolaunch is imported: after
the fake collective, a reduce-scatter output gets this rank's own slice of the input and an all-gather output
gets the input in every rank's slot. That is a local copy the size of the output (a real collective writes
it too), no communication. `--no-fill` runs the bare fake backend; rows then report their skipped steps.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

GIB = 2**30
MARK = "FAKE_PG_ROW "
# name -> (description, builder kind, builder args, default micro batch)
MODELS = {
    "tiny": ("built-in GPT tiny", "gpt", {"size": "tiny", "vocab_size": 256}, 2),
    "gpt-1.3b": ("built-in GPT 1.3b", "gpt", {"size": "1.3b", "vocab_size": 50304}, 8),
    # The built-in GPT at Llama-7B's dims (32 layers, d_model 4096, 32 heads, vocab 32000, no biases): its
    # 4d GELU MLP holds 134.2M params a block against SwiGLU-11008's 135.3M, 6.5B in all against 6.7B.
    # Runs where transformers is absent (the GPU machine); hf-llama-7b is the real architecture.
    "llama-7b": (
        "GPT blocks at Llama-7B dims",
        "gpt",
        {"size": "1.3b", "vocab_size": 32000, "n_layer": 32, "n_head": 32, "d_model": 4096, "bias": False},
        2,
    ),
    "hf-llama-7b": ("HF LlamaConfig 7B (needs transformers)", "hf-llama", {}, 2),
}
LLAMA_7B = {
    "hidden_size": 4096,
    "num_hidden_layers": 32,
    "num_attention_heads": 32,
    "num_key_value_heads": 32,
    "intermediate_size": 11008,
    "vocab_size": 32000,
}


def _csv(text: str, cast=str) -> list:
    return [cast(x) for x in text.split(",") if x.strip()]


# ---- one configuration (the subprocess) ----------------------------------------------------------------
def _fill_collective_outputs(dist) -> None:
    """See [Note: filled outputs]. Wraps every name torch.distributed may expose for the flat collectives;
    must run before zerolaunch.zero.comm binds them."""

    def reduce_scatter(real):
        def wrapped(output, input, *args, group=None, async_op=False, **kwargs):
            work = real(output, input, *args, group=group, async_op=async_op, **kwargs)
            n, r = output.numel(), dist.get_rank(group)
            output.copy_(input.view(-1)[r * n : (r + 1) * n].view_as(output))  # this rank's own term
            return work

        return wrapped

    def all_gather(real):
        def wrapped(output, input, *args, group=None, async_op=False, **kwargs):
            work = real(output, input, *args, group=group, async_op=async_op, **kwargs)
            ws = dist.get_world_size(group)
            output.view(ws, -1).copy_(input.reshape(1, -1).expand(ws, -1))  # (ws, n): input in every slot
            return work

        return wrapped

    for name in ("reduce_scatter_single", "reduce_scatter_tensor"):
        if hasattr(dist, name):
            setattr(dist, name, reduce_scatter(getattr(dist, name)))
    for name in ("all_gather_single", "all_gather_into_tensor"):
        if hasattr(dist, name):
            setattr(dist, name, all_gather(getattr(dist, name)))


def _build(model_name: str, stage: int, device, seq_len: int):
    """(model, init_fn, meta copy for the estimate). Stage 3 builds on meta and lets the engine materialise one
    unit at a time, as `zerolaunch train` does; stages 1/2 build on the device."""
    import torch

    _, kind, args, _ = MODELS[model_name]
    if kind == "gpt":
        from zerolaunch.models.gpt import build

        def make():
            return build(**args, seq_len=seq_len)

        init_fn = None
    else:
        try:
            import transformers
        except ImportError:
            raise SystemExit(
                f"{model_name} needs transformers (pip install transformers); or use llama-7b"
            ) from None
        config = transformers.LlamaConfig(**LLAMA_7B, max_position_embeddings=seq_len)

        def make():
            return transformers.AutoModelForCausalLM.from_config(config)

        init_fn = "hf"
    with torch.device("meta"):
        meta = make()
    if stage == 3:
        model = meta
        if init_fn == "hf":
            init_fn = (
                meta._init_weights
            )  # HF's per-module init, run by the engine on each unit it materialises
    else:
        with torch.device(device):
            model = make()
        init_fn = None
    return model, init_fn, meta


def _options(stage: int, dtype: str):
    from zerolaunch.zero.options import EngineOptions, OptimizerOptions, PrecisionOptions, ZeroOptions

    # bench/run.py's zerolaunch rows: the numbers stay comparable with the world-size-1 table.
    return EngineOptions(
        zero=ZeroOptions(stage=stage, reduce_bucket_size=500_000_000, overlap_comm=True),
        precision=PrecisionOptions(dtype=dtype),
        optimizer=OptimizerOptions(name="adamw", lr=1e-4, betas=(0.9, 0.95), weight_decay=0.1),
        gradient_clipping=1.0,
    )


def _estimate(meta, model_name: str, options, world_size: int, micro_batch: int, seq_len: int):
    from zerolaunch.memory import Setup, estimate
    from zerolaunch.memory.shape import from_module

    shape = from_module(meta, source=model_name, stage3_units=options.zero.stage3_units)
    setup = Setup(gpus_per_node=world_size, nodes=1, micro_batch=micro_batch, seq_len=seq_len, engine=options)
    est = estimate(shape, setup)
    row = est.row(options.zero.stage, "none")
    return {
        "params_numel": est.numel,
        "total_bytes": row.gpu_total_bytes,
        "states": dict(row.gpu),
        "activation_bytes": row.activation_bytes,
        "buffer_peak_bytes": row.buffer_peak_bytes,
    }


def run_one(args) -> dict:
    import torch
    import torch.distributed as dist
    from torch.testing._internal.distributed.fake_pg import FakeStore

    if not args.no_fill:
        _fill_collective_outputs(dist)
    from zerolaunch.zero import Engine

    device = torch.device("cuda", 0) if args.device == "cuda" else torch.device("cpu")
    if device.type == "cuda":
        torch.cuda.set_device(device)
    ws, stage, mb, seq = args.world_size, args.stage, args.micro_batch, args.seq_len
    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=ws)
    row = {"model": args.model, "world_size": ws, "stage": stage, "micro_batch": mb, "seq_len": seq}
    row["device"] = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    row["torch"] = torch.__version__
    row["filled_outputs"] = not args.no_fill
    options = _options(stage, args.dtype)
    torch.manual_seed(0)
    model, init_fn, meta = _build(args.model, stage, device, seq)
    row["estimate"] = _estimate(meta, args.model, options, ws, mb, seq)
    vocab = meta.config.vocab_size
    del meta
    try:
        engine = Engine(model, options, group=None, device=device, init_fn=init_fn)
        g = torch.Generator(device=device).manual_seed(1)
        ids = torch.randint(0, vocab, (mb, seq + 1), device=device, generator=g)
        batch = {"input_ids": ids[:, :-1].contiguous(), "labels": ids[:, 1:].contiguous()}
        times_ms, skipped = [], 0
        for i in range(args.steps):
            if i == 1 and device.type == "cuda":
                torch.cuda.synchronize(device)
                torch.cuda.reset_peak_memory_stats(device)
            _sync(device)
            t0 = time.perf_counter()
            loss = engine(**batch).loss
            engine.backward(loss)
            info = engine.step()
            _sync(device)
            if i >= 1:
                times_ms.append((time.perf_counter() - t0) * 1e3)
                skipped += int(info.skipped)
        row["memory_bytes"] = dict(engine.memory_bytes())
        row["max_allocated_bytes"] = (
            torch.cuda.max_memory_allocated(device) if device.type == "cuda" else None
        )
        row["step_ms"] = statistics.median(times_ms) if times_ms else None
        row["step_ms_all"] = times_ms
        row["skipped_steps"] = skipped
        row["status"] = "ok"
    except torch.OutOfMemoryError as exc:
        row["status"] = "oom"
        row["message"] = str(exc).splitlines()[0]
    finally:
        dist.destroy_process_group()
    return row


def _sync(device) -> None:
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize(device)


# ---- the driver -----------------------------------------------------------------------------------------
def _child(args, model: str, ws: int, stage: int) -> dict:
    mb = args.micro_batch or MODELS[model][3]
    cmd = [sys.executable, os.path.abspath(__file__), "--one", "--model", model, "--world-size", str(ws)]
    cmd += ["--stage", str(stage), "--micro-batch", str(mb), "--seq-len", str(args.seq_len)]
    cmd += ["--steps", str(args.steps), "--device", args.device, "--dtype", args.dtype]
    cmd += ["--no-fill"] if args.no_fill else []
    base = {"model": model, "world_size": ws, "stage": stage, "micro_batch": mb, "seq_len": args.seq_len}
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=args.timeout)
    except subprocess.TimeoutExpired:
        return base | {"status": "timeout", "message": f"no result within {args.timeout} s"}
    for line in proc.stdout.splitlines():
        if line.startswith(MARK):
            return json.loads(line[len(MARK) :])
    tail = (proc.stderr or proc.stdout).strip().splitlines()[-3:]
    status = "oom" if "OutOfMemoryError" in proc.stderr else "error"
    return base | {"status": status, "message": " | ".join(tail), "rc": proc.returncode}


def _gib(n) -> str:
    """GiB with 2 decimals; below 0.01 GiB in MiB (marked M) so a tiny CPU model's rows are not all 0.00."""
    if n is None:
        return "-"
    return f"{n / GIB:.2f}" if n >= 0.01 * GIB else f"{n / 2**20:.2f}M"


def render(rows: list[dict]) -> str:
    head = ["model", "ws", "stage", "mb", "est GiB", "peak GiB", "peak/est", "params", "grads", "optim"]
    head += ["bufs", "est optim", "step ms", "note"]
    lines = [" | ".join(head), " | ".join("---" for _ in head)]
    for r in rows:
        est = r.get("estimate") or {}
        cells = [r["model"], str(r["world_size"]), str(r["stage"]), str(r["micro_batch"])]
        cells.append(_gib(est.get("total_bytes")))
        if r["status"] != "ok":
            verdict = "does not fit" if r["status"] == "oom" else r["status"]
            lines.append(" | ".join(cells + ["-"] * 8 + [f"{verdict}: {r.get('message', '')[:80]}"]))
            continue
        m, peak = r["memory_bytes"], r["max_allocated_bytes"]
        ratio = f"{peak / est['total_bytes']:.3f}" if peak and est.get("total_bytes") else "-"
        states = est.get("states", {})
        note = f"{r['skipped_steps']} skipped" if r["skipped_steps"] else ""
        cells += [_gib(peak), ratio, _gib(m["params"]), _gib(m["grads"]), _gib(m["master"] + m["optimizer"])]
        cells += [_gib(m["buckets"]), _gib(states.get("master", 0) + states.get("optimizer", 0))]
        cells += [f"{r['step_ms']:.1f}" if r["step_ms"] is not None else "-", note]
        lines.append(" | ".join(cells))
    return "\n".join(lines)


FOOTER = (
    "Fake process group (torch 'fake' backend): one process plays rank 0 of N; collectives do no "
    "communication and move no data, so shapes and memory are those of rank 0 while the weights are wrong. "
    "step ms = compute only (the lower bound of an N-GPU step). {fill}. peak = max_memory_allocated over "
    "steps 2..N; params/grads/optim(master+moments)/bufs = engine.memory_bytes(); est = estimate-memory "
    "(stage row, no offload, activation checkpointing off)."
)


def drive(args) -> int:
    rows = []
    for model in args.models:
        for ws in args.world_sizes:
            for stage in args.stages:
                t0 = time.perf_counter()
                row = _child(args, model, ws, stage)
                row["wall_s"] = round(time.perf_counter() - t0, 1)
                rows.append(row)
                print(
                    f"[{model} ws={ws} stage={stage}] {row['status']} in {row['wall_s']} s", file=sys.stderr
                )
    fill = (
        "Collective outputs filled locally ([Note: filled outputs] in bench/fake_pg.py)"
        if not args.no_fill
        else "Outputs left unfilled (--no-fill): steps with non-finite grads are skipped"
    )
    print(render(rows))
    print(FOOTER.format(fill=fill), flush=True)
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"note": FOOTER.format(fill=fill), "rows": rows}, f, indent=2)
    return 0 if all(r["status"] in ("ok", "oom") for r in rows) else 1


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--world-sizes", type=lambda s: _csv(s, int), default=[8, 64])
    p.add_argument("--models", type=_csv, default=["gpt-1.3b", "llama-7b"])
    p.add_argument("--stages", type=lambda s: _csv(s, int), default=[1, 2, 3])
    p.add_argument("--steps", type=int, default=3, help="Steps per configuration; the first is not timed.")
    p.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    p.add_argument("--dtype", choices=("bf16", "fp32"), default="bf16")
    p.add_argument("--micro-batch", type=int, default=None, help="Default: per model (gpt-1.3b 8, llama 2).")
    p.add_argument("--seq-len", type=int, default=2048)
    p.add_argument(
        "--no-fill", action="store_true", help="Bare fake collectives: see [Note: filled outputs]."
    )
    p.add_argument("--timeout", type=int, default=300, help="Seconds per configuration subprocess.")
    p.add_argument("--out", default=None, help="JSON file for the rows.")
    p.add_argument("--one", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--model", help=argparse.SUPPRESS)
    p.add_argument("--world-size", type=int, help=argparse.SUPPRESS)
    p.add_argument("--stage", type=int, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    bad = [m for m in ([args.model] if args.one else args.models) if m not in MODELS]
    if bad:
        p.error(f"unknown model(s) {', '.join(bad)}; choose from {', '.join(MODELS)}")
    if args.steps < 2:
        p.error("--steps must be >= 2 (the first step is not measured)")
    if any(s not in (1, 2, 3) for s in args.stages) or any(w < 2 for w in args.world_sizes):
        p.error("--stages takes 1,2,3 and --world-sizes values >= 2")
    if args.one:
        print(MARK + json.dumps(run_one(args)), flush=True)
        return 0
    return drive(args)


if __name__ == "__main__":
    sys.exit(main())
