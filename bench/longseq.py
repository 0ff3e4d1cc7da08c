"""Long sequences on one GPU: the longest sequence a training step runs at, and tokens/s at 8k, 16k and 32k, for
zerolaunch (activation checkpointing + the chunked linear-cross-entropy, + flex attention for the document mask)
against DeepSpeed ZeRO-3 with its activation checkpointing and FSDP2 with torch's checkpoint_wrapper.

    python bench/longseq.py                                  # gpt-1.3b and llama-8b, rows zl, ds, fsdp2
    python bench/longseq.py --models gpt-1.3b --doc-len 2048 # packed documents of 2048 tokens (document mask)
    python bench/longseq.py --models llama-8b --rows zl,fsdp2 --row-budget 150
    python bench/longseq.py --tiny --device cpu              # a tiny shape (tests/unit/test_bench_longseq.py)

Models (random init, micro batch 1, ZeRO-3 everywhere, bf16 compute):
- gpt-1.3b: the built-in GPT (zerolaunch/models/gpt.py, 24 layers, d 2048, vocab 50304), full training, fp32 master
  + AdamW. Its learned position table is built for --max-seq tokens (131072: 268M more params, the same in every
  row). The zl row builds it with loss_chunk (models/linear_ce.py) and, with --doc-len, attention: flex; the peers
  run the same module with its default loss (bf16 logits, then a chunked fp32 cross-entropy) and the SDPA mask.
- llama-8b: transformers' LlamaForCausalLM at Llama-3-8B's shape (vocab 128256), built on meta as bench/lora.py
  builds it (name-seeded init), LoRA r 16 on every linear layer: a full 8B fine-tune's fp32 master and AdamW
  state (128 GB) do not fit one 80 GB card with any engine, and the activations, which set the longest sequence,
  are those of full training (every layer's input gradient flows). HF's sdpa attention; HF's gradient
  checkpointing (non-reentrant) for zl and ds (what transformers' DeepSpeed integration uses), torch's
  checkpoint_wrapper on each decoder layer for fsdp2; the zl row adds model.args.loss_chunk's forward.

Rows, each (model, row) its own process: zl (zerolaunch.initialize, stage 3), ds (deepspeed.initialize, stage 3,
with deepspeed.checkpointing.checkpoint on each GPT block), fsdp2 (fully_shard per block + root, bf16 params
fp32 reduce, torch AdamW). A row first runs each of --seqs (8k, 16k, 32k: 1 warmup + --steps timed steps, tokens/s
from the median), then doubles the sequence until a step fails, then bisects --bisect times (one step each), all
within --row-budget seconds (a probe that would start after it is skipped; the row's process is killed at
--row-budget + 60 s). A failed step (CUDA OOM and anything else) ends the process, since an engine may not
survive a failure mid-step: the driver starts a new process for the next probe, so OOM is a recorded failure,
not a crash of the bench. Each process prints `RESULT {json}` after every probe. The driver prints a table
(longest sequence, tokens/s and peak GiB at each of --seqs, ratio to the best peer) and writes
longseq-MODEL.json under --out. The ds row needs DeepSpeed on the GPU machine: see bench/fetch_wheels.sh.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

from _row_process import init_single_rank_group

ROWS = ("zl", "ds", "fsdp2")
MODELS = ("gpt-1.3b", "llama-8b", "gpt-tiny", "llama-tiny")
LOSS_CHUNK = 4096  # rows per chunk: 4096 x 128256 bf16 logits = 1 GiB, 2 fp32 chunk tensors 4 GiB
LR, CLIP = 1e-4, 1.0


def _lora_bench():
    """bench/lora.py as a module: the llama rows reuse its model, seeded init, LoRA and DeepSpeed config."""
    path = Path(__file__).resolve().parent / "lora.py"
    spec = importlib.util.spec_from_file_location("bench_lora", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def ds_config(micro_batch: int) -> dict:
    return {
        "train_micro_batch_size_per_gpu": micro_batch,
        "gradient_accumulation_steps": 1,
        "gradient_clipping": CLIP,
        "bf16": {"enabled": True},
        "zero_optimization": {"stage": 3},
        "optimizer": {
            "type": "AdamW",
            "params": {"lr": LR, "weight_decay": 0.0, "torch_adam": True, "fused": True},
        },
        "steps_per_print": 10**9,
    }


# ---- the built-in GPT rows --------------------------------------------------------------------------------
def build_gpt(row: str, args, device):
    import torch

    from zerolaunch.models import gpt

    size = "tiny" if args.model == "gpt-tiny" else "1.3b"
    vocab = 256 if size == "tiny" else 50304
    torch.manual_seed(0)
    kw = dict(vocab_size=vocab, seq_len=args.max_seq, bias=False, activation_checkpointing=True)
    if row == "zl":
        kw.update(
            loss_chunk=LOSS_CHUNK if size != "tiny" else 16, attention="flex" if args.doc_len else "sdpa"
        )
    with torch.device(device):
        model = gpt.build(size, **kw)
    if row == "zl":
        import zerolaunch

        engine = zerolaunch.initialize(model, ds_config(1), device=device)
        return _engine_step(engine), vocab
    if row == "ds":
        import deepspeed

        engine, _, _, _ = deepspeed.initialize(
            model=model, model_parameters=model.parameters(), config=ds_config(1)
        )
        deepspeed.checkpointing.configure(None)  # after initialize: it reads DeepSpeed's process group
        # the GPT checkpoints each block through this name: DeepSpeed's (reentrant) activation checkpointing
        gpt.checkpoint = lambda fn, *a, use_reentrant=None: deepspeed.checkpointing.checkpoint(fn, *a)
        return _engine_step(engine), vocab
    if row == "fsdp2":
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

        model.activation_checkpointing = False  # checkpoint_wrapper's instead of the model's own
        _wrap_checkpoint(model, gpt.Block)
        mp = {"mp_policy": MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)}
        for block in model.transformer.h:
            fully_shard(block, **mp)
        fully_shard(model, **mp)
        return _plain_step(model), vocab
    raise SystemExit(f"unknown row {row!r}; choose from {', '.join(ROWS)}")


def _wrap_checkpoint(model, layer_class) -> None:
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import (
        CheckpointImpl,
        apply_activation_checkpointing,
        checkpoint_wrapper,
    )

    def wrapper(module):
        return checkpoint_wrapper(module, checkpoint_impl=CheckpointImpl.NO_REENTRANT)

    apply_activation_checkpointing(
        model, checkpoint_wrapper_fn=wrapper, check_fn=lambda m: isinstance(m, layer_class)
    )


def _engine_step(engine):
    def step(batch):
        loss = engine(**batch).loss
        engine.backward(loss)
        engine.step()
        return loss

    return step


def _plain_step(model):
    fused = next(p for p in model.parameters() if p.requires_grad).device.type == "cuda"
    return _lora_bench().plain_step(model, fused=fused)


# ---- the Llama rows -----------------------------------------------------------------------------------------
def build_llama(row: str, args, device):
    lora = _lora_bench()
    size = "tiny" if args.model == "llama-tiny" else "8b"
    la = argparse.Namespace(size=size, seq_len=args.max_seq, micro_batch=1)
    add_lora = lora.add_lora
    if row == "zl":

        def add_lora_chunked(model):
            from zerolaunch.models.hf_chunked_loss import enable_chunked_loss

            model = add_lora(model)
            enable_chunked_loss(model.get_base_model(), LOSS_CHUNK if size != "tiny" else 16)
            return model

        lora.add_lora = add_lora_chunked
        step, _, _ = lora.build_row("zl-z3", la, device)
    elif row == "ds":
        step, _, _ = lora.build_row("ds-z3", la, device)
    elif row == "fsdp2":

        def add_lora_wrapped(model):
            from transformers.models.llama.modeling_llama import LlamaDecoderLayer

            model = add_lora(model)
            model.get_base_model().gradient_checkpointing_disable()
            _wrap_checkpoint(model, LlamaDecoderLayer)
            return model

        lora.add_lora = add_lora_wrapped
        step, _, _ = lora.build_row("fsdp2", la, device)
    else:
        raise SystemExit(f"unknown row {row!r}; choose from {', '.join(ROWS)}")
    return step, lora.SIZES[size]["vocab_size"]


# ---- one row's process ------------------------------------------------------------------------------------
def batch_for(seq: int, vocab: int, doc_len: int, device, llama: bool):
    import torch

    g = torch.Generator().manual_seed(seq)
    ids = torch.randint(0, vocab, (1, seq), generator=g)
    batch = {
        "input_ids": ids.to(device),
        "labels": ids.to(device),
    }  # the GPT's labels need no shift to time it
    if doc_len and not llama:
        batch["position_ids"] = (torch.arange(seq) % doc_len)[None].to(device)
    return batch


def run_probes(row: str, args) -> None:
    """Run each probe of args.probes in turn, printing a RESULT line after each; exit 1 at the first failure."""
    import torch

    device = torch.device(args.device)
    cuda = device.type == "cuda"
    init_single_rank_group(device)
    llama = args.model.startswith("llama")
    t0 = time.perf_counter()
    step, vocab = (build_llama if llama else build_gpt)(row, args, device)
    build_s = time.perf_counter() - t0
    for seq, steps in args.probes:
        if args.deadline and time.time() > args.deadline:
            print("RESULT " + json.dumps({"seq": seq, "skipped": "row budget spent"}), flush=True)
            continue
        batch = batch_for(seq, vocab, args.doc_len, device, llama)
        if cuda:
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
        times = []
        try:
            for i in range(steps):
                t = time.perf_counter()
                loss = step(batch)
                float(loss.detach().float())  # waits for the step
                if i or steps == 1:
                    times.append(1e3 * (time.perf_counter() - t))
        except Exception as e:  # noqa: BLE001 -- OOM or not, the step failed at this length: record it
            oom = isinstance(e, torch.cuda.OutOfMemoryError) or "out of memory" in str(e).lower()
            kind = "CUDA out of memory" if oom else f"{type(e).__name__}: {str(e)[:300]}"
            print("RESULT " + json.dumps({"seq": seq, "error": kind}), flush=True)
            sys.exit(1)
        step_ms = statistics.median(times)
        print(
            "RESULT "
            + json.dumps(
                {
                    "seq": seq,
                    "step_ms": step_ms,
                    "tok_s": seq / (step_ms / 1e3),
                    "timed_steps": len(times),
                    "peak_gpu_gib": torch.cuda.max_memory_allocated() / 2**30 if cuda else None,
                    "loss": float(loss.detach().float()),
                    "build_s": build_s,
                    "torch": torch.__version__,
                    "card": torch.cuda.get_device_name(0) if cuda else "cpu",
                }
            ),
            flush=True,
        )


# ---- the driver ---------------------------------------------------------------------------------------------
def _launch(model: str, row: str, probes: list[tuple[int, int]], args, deadline: float) -> list[dict]:
    """One process running `probes` in order; its RESULT lines (a failure ends them), or a synthetic failure."""
    spec = ",".join(f"{s}:{n}" for s, n in probes)
    cmd = [
        sys.executable,
        __file__,
        "--one",
        row,
        "--model",
        model,
        "--probes",
        spec,
        "--deadline",
        str(deadline),
    ]
    cmd += ["--device", args.device, "--max-seq", str(args.max_seq), "--doc-len", str(args.doc_len)]
    left = max(deadline - time.time(), 0) + 60  # the build and one last probe may run past the budget
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=left)
        out, code = p.stdout, p.returncode
    except subprocess.TimeoutExpired as e:
        out, code = (e.stdout or b"").decode() if isinstance(e.stdout, bytes) else (e.stdout or ""), None
    got = [json.loads(ln[len("RESULT ") :]) for ln in out.splitlines() if ln.startswith("RESULT ")]
    done = {r["seq"] for r in got}
    missing = [s for s, _ in probes if s not in done]
    if missing and (code is None or code != 0):
        if code is None:
            why = "timed out"
        else:
            tail = (p.stderr or p.stdout).strip().splitlines()[-3:]
            why = f"process exited {code}: " + " | ".join(tail)[-400:]
            if code < 0:
                why = f"killed by signal {-code}" + (" (host memory?)" if code == -9 else "")
        got.append({"seq": missing[0], "error": why})
    return got


def search_row(model: str, row: str, args) -> dict:
    """The row's results: throughput at args.seqs, then doubling and bisection for the longest sequence."""
    deadline = time.time() + args.row_budget
    probes: dict[int, dict] = {}

    def run(plan: list[tuple[int, int]]) -> None:
        while plan and time.time() < deadline:
            for r in _launch(model, row, plan, args, deadline):
                probes[r["seq"]] = r
            done = {s for s in probes}
            plan = [(s, n) for s, n in plan if s not in done]
            failed = [s for s, r in probes.items() if "error" in r]
            plan = [(s, n) for s, n in plan if not failed or s < min(failed)]  # longer than a failure: skip

    # one process: the timed lengths, then doubling (one step a probe) until a step fails
    doubling, seq = [], max(args.seqs)
    while seq * 2 <= args.max_seq:
        seq *= 2
        doubling.append((seq, 1))
    run([(s, args.steps + 1) for s in sorted(args.seqs)] + doubling)
    bad = [s for s, r in probes.items() if "error" in r]
    ok = [s for s, r in probes.items() if "step_ms" in r]
    lo, hi = max(ok, default=0), min(bad, default=None)
    for _ in range(args.bisect if hi else 0):
        mid = (lo + hi) // 2 // args.granule * args.granule
        if mid <= lo or time.time() >= deadline:
            break
        run([(mid, 1)])
        if "step_ms" in probes.get(mid, {}):
            lo = mid
        else:
            hi = mid
    return {
        "model": model,
        "row": row,
        "longest_ok": lo or None,
        "first_failed": hi,
        "capped": hi is None,  # never failed up to --max-seq (or the budget ran out first)
        "probes": [probes[s] for s in sorted(probes)],
    }


def table(results: list[dict], seqs: list[int]) -> str:
    def at(r, s):
        p = next((p for p in r["probes"] if p["seq"] == s), {})
        return p

    lines = []
    for model in dict.fromkeys(r["model"] for r in results):
        rows = [r for r in results if r["model"] == model]
        head = f"{model:<10} {'row':<6} {'longest':>8}"
        for s in seqs:
            label = f"{s // 1024}k" if s >= 1024 else str(s)
            head += f" {f'tok/s@{label}':>11} {'GiB':>6}"
        lines.append(head)
        best_len = max((r["longest_ok"] or 0 for r in rows if r["row"] != "zl"), default=0)
        for r in rows:
            longest = f"{r['longest_ok'] or 0}{'+' if r['capped'] else ''}"
            line = f"{'':<10} {r['row']:<6} {longest:>8}"
            for s in seqs:
                p = at(r, s)
                tok = (
                    f"{p['tok_s']:.0f}"
                    if "tok_s" in p
                    else ("OOM" if "out of memory" in p.get("error", "") else "-")
                )
                gib = f"{p['peak_gpu_gib']:.1f}" if p.get("peak_gpu_gib") is not None else "-"
                line += f" {tok:>11} {gib:>6}"
            if r["row"] == "zl" and best_len:
                line += f"  longest {((r['longest_ok'] or 0) / best_len):.2f}x best peer"
            lines.append(line)
    lines.append(
        "longest: tokens of the longest sequence a step ran at (+: no failure up to --max-seq or budget)"
    )
    return "\n".join(lines)


def drive(args) -> None:
    rows = tuple(args.rows.split(","))
    models = tuple(args.models.split(","))
    for name, given, known in (("row", rows, ROWS), ("model", models, MODELS)):
        unknown = [x for x in given if x not in known]
        if unknown:
            raise SystemExit(f"unknown {name}(s) {', '.join(unknown)}; choose from {', '.join(known)}")
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    results = []
    for model in models:
        for row in rows:
            t0 = time.time()
            results.append(search_row(model, row, args))
            results[-1]["wall_s"] = time.time() - t0
            print(json.dumps(results[-1]), flush=True)
            mine = [r for r in results if r["model"] == model]
            (out_dir / f"longseq-{model}{'-doc' if args.doc_len else ''}.json").write_text(
                json.dumps(mine, indent=1)
            )
    print(table(results, args.seqs))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", default="zl,ds,fsdp2", help=f"comma list of: {', '.join(ROWS)}")
    ap.add_argument("--models", default="gpt-1.3b,llama-8b", help=f"comma list of: {', '.join(MODELS)}")
    ap.add_argument(
        "--tiny", action="store_true", help="gpt-tiny and llama-tiny at short lengths (the smoke test)"
    )
    ap.add_argument("--seqs", default="8192,16384,32768", help="lengths timed for tokens/s")
    ap.add_argument(
        "--max-seq", type=int, default=131072, help="the search's cap (and the GPT's position table)"
    )
    ap.add_argument("--doc-len", type=int, default=0, help="GPT only: packed documents of this many tokens")
    ap.add_argument("--steps", type=int, default=2, help="timed steps at each of --seqs (after 1 warmup)")
    ap.add_argument("--bisect", type=int, default=2, help="bisection probes after the first failure")
    ap.add_argument("--granule", type=int, default=1024, help="bisection lengths are multiples of this")
    ap.add_argument("--row-budget", type=float, default=75, help="seconds of probes per (model, row)")
    ap.add_argument("--out", default="bench/results/longseq")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--one", help=argparse.SUPPRESS)
    ap.add_argument("--model", help=argparse.SUPPRESS)
    ap.add_argument("--probes", help=argparse.SUPPRESS)
    ap.add_argument("--deadline", type=float, default=0.0, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.tiny:
        if args.models == "gpt-1.3b,llama-8b":
            args.models = "gpt-tiny,llama-tiny"
        if args.seqs == "8192,16384,32768":
            args.seqs = "32,64"
        if args.max_seq == 131072:
            args.max_seq = 256
        args.granule = min(args.granule, 16)
    args.seqs = [int(s) for s in str(args.seqs).split(",")]
    if args.one:
        args.probes = [tuple(int(x) for x in p.split(":")) for p in args.probes.split(",")]
        run_probes(args.one, args)
    else:
        drive(args)


if __name__ == "__main__":
    main()
