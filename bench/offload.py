"""Optimizer offload on one GPU at a 6.7B GPT and a global batch of 64k tokens: zerolaunch against its peers.

    python bench/offload.py                                   # every row, 6.7B, seq 2048 x 32 sequences a step
    python bench/offload.py --rows zl-z2-off,zl-z2-off-ovl --micro-batch 8 --ckpt
    python bench/offload.py --tiny --device cpu --rows zl-z2-off,zl-z3-off   # the CPU smoke test's shape

The model is the built-in GPT (`zerolaunch.models.gpt`) at a 6.7B shape (32 layers, d_model 4096, 32 heads,
vocab 50304, seq 2048: 6.66e9 params), bf16 compute, no activation checkpointing (`--ckpt` turns it on for
every block), AdamW (lr 3e-4, betas 0.9/0.95, decay 0.1, clip 1.0). A step is the global batch (`--global-batch`
sequences, 32 = 64k tokens) as `--micro-batch` sequences x gradient accumulation. Rows, one process each:

- zl-z2-off:     zerolaunch ZeRO-2, fp32 master + AdamW state on the host (pinned); with accumulation the
                 window's grads are summed on the GPU and copied to the host once, from the last backward
                 ([Note: device-summed window] in zerolaunch/zero/reduce.py).
- zl-z2-off-ovl: the same with overlap_step (the CPU step runs while the next forward starts).
- zl-z3-off:     zerolaunch ZeRO-3 with offload_param and offload_optimizer on the host (built on meta).
- ds-z2-off:     DeepSpeed ZeRO-2 + offload_optimizer cpu (pinned; DeepSpeedCPUAdam), the same micro batch and
                 accumulation in its config.
- fsdp2-off:     FSDP2 fully_shard per block + CPUOffloadPolicy(pin_memory=True), MixedPrecisionPolicy(bf16
                 params, fp32 reduce), torch's fused AdamW over the host params; loss / accumulation per
                 micro-step, clip_grad_norm_, step.

Each row prints `RESULT {json}`: the median step ms over the timed steps (wall clock around a whole step, the
device synced), TFLOP/s counting 6 * params * tokens (no recompute credit), its % of `--matmul-tflops` (795: the
bf16 matmul rate measured on an H100), peak GPU allocated, and the process's peak host memory (VmHWM). A row
that fails (CUDA OOM, killed for host memory, timeout, DeepSpeed missing) is recorded with its error; rows stop
starting once `--budget` seconds have passed (recorded as not run), so the set fits one device call. The driver
prints a table last and writes offload-SIZE.json under --out.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

from _row_process import init_single_rank_group, pick_rows, row_result

ROWS = ("zl-z2-off", "fsdp2-off", "ds-z2-off", "zl-z3-off", "zl-z2-off-ovl")
"""In the order "all" runs them: the main row, then its peers, so a spent --budget drops the variants."""
SIZES = {
    "6.7b": dict(n_layer=32, n_head=32, d_model=4096, vocab_size=50304),
    "tiny": dict(n_layer=2, n_head=2, d_model=64, vocab_size=512),
}
LR, BETAS, WEIGHT_DECAY, CLIP = 3e-4, (0.9, 0.95), 0.1, 1.0


def _bench_module(name: str):
    """A sibling script of bench/ as a module (bench/ is scripts, not a package)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(f"bench_{name}", Path(__file__).with_name(f"{name}.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def make_gpt(args):
    from zerolaunch.models.gpt import build

    s = SIZES[args.size]
    return build(
        size="tiny",
        vocab_size=s["vocab_size"],
        seq_len=args.seq_len,
        activation_checkpointing=args.ckpt,
        n_layer=s["n_layer"],
        n_head=s["n_head"],
        d_model=s["d_model"],
    )


def accumulation(args) -> int:
    if args.global_batch % args.micro_batch:
        raise SystemExit(
            f"--global-batch {args.global_batch} is not a multiple of --micro-batch {args.micro_batch}"
        )
    return args.global_batch // args.micro_batch


def ds_config(args) -> dict:
    gas = accumulation(args)
    return {
        "train_micro_batch_size_per_gpu": args.micro_batch,
        "gradient_accumulation_steps": gas,
        "train_batch_size": args.micro_batch * gas,
        "bf16": {"enabled": True},
        "gradient_clipping": CLIP,
        "zero_optimization": {
            "stage": 2,
            "overlap_comm": True,
            "contiguous_gradients": True,
            "reduce_bucket_size": 5e8,
            "allgather_bucket_size": 5e8,
            "offload_optimizer": {"device": "cpu", "pin_memory": True},
        },
        "optimizer": {
            "type": "AdamW",
            "params": {"lr": LR, "betas": list(BETAS), "eps": 1e-8, "weight_decay": WEIGHT_DECAY},
        },
        "steps_per_print": 10**9,
        "wall_clock_breakdown": False,
    }


def build_row(row: str, args, device):
    """(step(micro_batches) -> last loss, n_params) of one row on `device`."""
    import torch

    torch.manual_seed(0)
    gas = accumulation(args)
    cuda = device.type == "cuda"
    if row.startswith("zl-"):
        from zerolaunch.zero import Engine
        from zerolaunch.zero.options import (
            EngineOptions,
            OffloadOptions,
            OptimizerOptions,
            PrecisionOptions,
            ZeroOptions,
        )

        stage = int(row[4])
        host = OffloadOptions(device="cpu", pin_memory=True, overlap_step=row.endswith("-ovl"))
        opts = EngineOptions(
            zero=ZeroOptions(
                stage=stage,
                overlap_comm=True,
                offload_optimizer=host,
                offload_param=OffloadOptions(device="cpu", pin_memory=True)
                if stage == 3
                else OffloadOptions(),
            ),
            precision=PrecisionOptions(dtype="bf16"),
            optimizer=OptimizerOptions(name="adamw", lr=LR, betas=BETAS, weight_decay=WEIGHT_DECAY),
            gradient_clipping=CLIP,
            gradient_accumulation_steps=gas,
        )
        # stage 3 builds on meta and materializes one unit at a time; stage 2 builds on the GPU (the fp32
        # model is cast to bf16 there: a 6.7B fp32 build on the host would take minutes of init)
        with torch.device("meta" if stage == 3 else device):
            model = make_gpt(args)
        n_params = sum(p.numel() for p in model.parameters())
        engine = Engine(model, opts, device=device)

        def step(micro_batches):
            for b in micro_batches:
                loss = engine(**b).loss
                engine.backward(loss)
                engine.step()
            return loss

        return step, n_params
    if row == "fsdp2-off":
        from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, fully_shard

        with torch.device(device):
            model = make_gpt(args)
        n_params = sum(p.numel() for p in model.parameters())
        kw = {"mp_policy": MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)}
        kw["offload_policy"] = CPUOffloadPolicy(pin_memory=cuda)
        for block in model.transformer.h:
            fully_shard(block, **kw)
        fully_shard(model, **kw)
        opt = torch.optim.AdamW(model.parameters(), lr=LR, betas=BETAS, weight_decay=WEIGHT_DECAY, fused=True)

        def step(micro_batches):
            for b in micro_batches:
                loss = model(**b).loss
                (loss / gas).backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), CLIP)
            opt.step()
            opt.zero_grad(set_to_none=True)
            return loss

        return step, n_params
    if row == "ds-z2-off":
        import deepspeed

        model = make_gpt(args)
        n_params = sum(p.numel() for p in model.parameters())
        eng, _, _, _ = deepspeed.initialize(
            model=model, model_parameters=model.parameters(), config=ds_config(args)
        )

        def step(micro_batches):
            for b in micro_batches:
                loss = eng(**b).loss
                eng.backward(loss)
                eng.step()
            return loss

        return step, n_params
    raise SystemExit(f"unknown row {row!r}; choose from {', '.join(ROWS)}")


def run_row(row: str, args) -> dict:
    import torch

    lora = _bench_module("lora")
    device = torch.device(args.device)
    cuda = device.type == "cuda"
    init_single_rank_group(device)
    gas = accumulation(args)
    t0 = time.perf_counter()
    step, n_params = build_row(row, args, device)
    build_s = time.perf_counter() - t0
    vocab = SIZES[args.size]["vocab_size"]
    g = torch.Generator().manual_seed(1234)
    n = args.warmup + args.steps
    data = torch.randint(0, vocab, (n, gas, args.micro_batch, args.seq_len), generator=g)
    times, losses = [], []
    for i, step_data in enumerate(data):
        micro = [{"input_ids": ids.to(device), "labels": ids.to(device)} for ids in step_data]
        if cuda:
            torch.cuda.synchronize()
        t = time.perf_counter()
        loss = step(micro)
        if cuda:
            torch.cuda.synchronize()
        losses.append(float(loss.detach().float()))
        if i >= args.warmup:
            times.append(1e3 * (time.perf_counter() - t))
    step_ms = statistics.median(times) if times else None
    tokens = args.global_batch * args.seq_len
    tflops = 6 * n_params * tokens / (step_ms / 1e3) / 1e12 if step_ms else None
    return {
        "row": row,
        "size": args.size,
        "n_params": n_params,
        "seq_len": args.seq_len,
        "micro_batch": args.micro_batch,
        "gradient_accumulation_steps": gas,
        "tokens_per_step": tokens,
        "activation_checkpointing": args.ckpt,
        "step_ms": step_ms,
        "step_ms_all": times,
        "tflops": tflops,
        "pct_of_matmul": 100 * tflops / args.matmul_tflops if tflops else None,
        "peak_gpu_gib": torch.cuda.max_memory_allocated() / 2**30 if cuda else None,
        "peak_host_hwm_gib": lora.HostPeak.status_kib("VmHWM") / 2**20,
        "build_s": build_s,
        "losses": losses,
        "torch": torch.__version__,
        "card": torch.cuda.get_device_name(0) if cuda else "cpu",
    }


def drive(args) -> None:
    rows = pick_rows(args.rows, ROWS)
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    results, started = [], time.time()
    for row in rows:
        left = args.budget - (time.time() - started)
        if left < 30:
            results.append(
                {"row": row, "size": args.size, "error": f"not run: --budget {args.budget:.0f} s spent"}
            )
            continue
        cmd = [sys.executable, __file__, "--one", row, *sys.argv[1:]]
        t0 = time.time()
        try:
            results.append(row_result(cmd, min(args.timeout, left)))
        except RuntimeError as e:
            results.append({"row": row, "size": args.size, "error": str(e)[-600:]})
        results[-1]["wall_s"] = time.time() - t0
        print(
            json.dumps({k: v for k, v in results[-1].items() if k not in ("losses", "step_ms_all")}),
            flush=True,
        )
        (out_dir / f"offload-{args.size}.json").write_text(json.dumps(results, indent=1))
    print(table(results))


def table(results: list[dict]) -> str:
    lines = [
        f"{'row':<14} {'step ms':>9} {'TFLOP/s':>8} {'% matmul':>8} {'GPU GiB':>8} {'host GiB':>9} {'loss':>8}"
    ]
    for r in results:
        if "error" in r:
            lines.append(f"{r['row']:<14} failed: {r['error'][:110]}")
            continue
        gpu = f"{r['peak_gpu_gib']:.2f}" if r.get("peak_gpu_gib") is not None else "-"
        lines.append(
            f"{r['row']:<14} {r['step_ms']:>9.1f} {r['tflops']:>8.1f} {r['pct_of_matmul']:>8.1f} {gpu:>8} "
            f"{r['peak_host_hwm_gib']:>9.2f} {r['losses'][-1]:>8.4f}"
        )
    lines.append(
        "TFLOP/s: 6 x params x tokens a step / step time (no recompute credit); host GiB: VmHWM; GPU GiB: peak "
        "allocated over the whole run"
    )
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", default="all", help=f"comma list of: {', '.join(ROWS)}; or all")
    ap.add_argument("--size", choices=tuple(SIZES), default="6.7b")
    ap.add_argument("--tiny", action="store_true", help="--size tiny, seq 32, global batch 4, micro batch 1")
    ap.add_argument("--seq-len", type=int, default=2048)
    ap.add_argument("--global-batch", type=int, default=32, help="sequences per optimizer step")
    ap.add_argument("--micro-batch", type=int, default=2, help="sequences per micro-step")
    ap.add_argument(
        "--ckpt",
        action="store_true",
        help="activation checkpointing of every block (off: at micro batch 2 a 6.7B step's activations fit "
        "beside the device grad sums, and no recompute is the faster step)",
    )
    ap.add_argument("--steps", type=int, default=3, help="timed steps (median reported)")
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--matmul-tflops", type=float, default=795.0, help="the bf16 matmul rate the %% is of")
    ap.add_argument("--out", default="bench/results/offload")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--timeout", type=float, default=150, help="seconds per row")
    ap.add_argument("--budget", type=float, default=460, help="no row starts after this many seconds")
    ap.add_argument("--one", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.tiny:
        args.size, args.seq_len, args.global_batch, args.micro_batch = "tiny", 32, 4, 1
    if args.one:
        print("RESULT " + json.dumps(run_row(args.one, args)), flush=True)
    else:
        drive(args)


if __name__ == "__main__":
    main()
