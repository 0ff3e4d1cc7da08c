"""What the engine costs on a model it did not write: zerolaunch's public API against torch.compile, one GPU.

    python bench/engine_tax.py                                # every row, the bench's own GPT at 1.3B
    python bench/engine_tax.py --model hf-llama --rows torch-bf16,zl-z2-bf16
    python bench/engine_tax.py --profile torch-bf16,zl-z2-bf16 --out DIR   # + a profile table per row
    python bench/engine_tax.py --tiny --device cpu            # the smoke test (tests/unit/test_bench_engine_tax.py)
    python bench/engine_tax.py --rows zl-gpt-z2-bf16,zl-train-z2-bf16   # zerolaunch train against the engine

The model is NOT zerolaunch's: `OwnGPT` below is a plain nn.Module written here (pre-norm blocks, fused qkv, sdpa,
tied embedding), or transformers' LlamaForCausalLM with sdpa (`--model hf-llama`, random init, no download).
Each row runs in its own process (one engine's allocator state and compiled kernels never leak into another's
numbers) and trains the same synthetic batches from the same weights:

- torch-bf16:   bf16 params, torch.compile(model), fused torch AdamW on the bf16 params, clip at 1.0.
- zl-z{2,3}-bf16: `zerolaunch.initialize` with DeepSpeed's pure-bf16 keys (bf16 master and moments), then
                `engine.compile()`; the same AdamW, clip and lr.
- torch-amp:    fp32 params + bf16 autocast, torch.compile(model), fused AdamW: the numerics of an fp32 master.
- zl-z{2,3}:    `zerolaunch.initialize` with bf16 compute and the fp32 master, then `engine.compile()`.
- zl-z3-resident: zl-z3 with `stage3_param_persistence_threshold` above every param: every param persistent
                (DeepSpeed's rule: not partitioned), so the 16-bit copy stays whole (stage 2's memory),
                refreshed from the master after each step, and the whole forward compiles; zl-z3's units
                cast their master slices in each gather (forward and backward) and compile one by one.

Two more rows (with `--model gpt`) put the user's `zerolaunch train` against the engine on one model and data:
zerolaunch's built-in GPT (zerolaunch.models.gpt) at this bench's shape and its synthetic Markov data
(zerolaunch.data.synthetic, seed 1234), pure bf16, ZeRO-2, compiled as engine.compile() does (the whole model):

- zl-gpt-z2-bf16:   `zerolaunch.initialize` + `engine.compile()`, the batches drawn before timing.
- zl-train-z2-bf16: `zerolaunch train recipes/gpt-1.3b.yaml --gpus 1` (--cpu 1 with --device cpu) with --set
                    flags for the same shape, optimizer and precision; the median step of its metrics.jsonl
                    (bench/train_path.py), the first --warmup steps left out. Its ratio is to zl-gpt-z2-bf16.

A row prints `RESULT {json}`: median step ms over the timed steps, peak allocated GiB, final loss. With
`--profile`, the row then profiles three more steps with torch.profiler and writes `profile-ROW.txt` under --out:
GPU busy time against wall time per step, kernel launches, host syncs (cudaStreamSynchronize / D2H copies), and
the top ops by self CUDA and self CPU time. The driver prints the table with each row's ratio to its torch row.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

from _row_process import (
    LLAMA_1B,
    TINY_LLAMA,
    one_rank_torchrun_env,
    pick_rows,
    print_result,
    row_result,
    single_rank_env,
)

ROWS = ("torch-bf16", "zl-z2-bf16", "zl-z3-bf16", "torch-amp", "zl-z2", "zl-z3", "zl-z3-resident")
BUILTIN_ROWS = ("zl-gpt-z2-bf16", "zl-train-z2-bf16")
"""The built-in GPT's rows (the module docstring): the engine against `zerolaunch train`, --model gpt only."""
DATA_SEED = 1234  # recipes/gpt-1.3b.yaml's train.seed: the synthetic stream both built-in rows draw
SIZES = {  # (layers, d_model, heads)
    "tiny": (2, 64, 4),
    "350m": (24, 1024, 16),
    "1.3b": (24, 2048, 16),
}
# recipes/hf-llama-1b.yaml's layer shapes; max_position_embeddings 4096 and transformers' default rms_norm_eps,
# as this bench's rows were measured
HF_LLAMA = {k: v for k, v in LLAMA_1B.items() if k != "rms_norm_eps"} | {"max_position_embeddings": 4096}
LR, BETAS, WEIGHT_DECAY, CLIP = 3e-4, (0.9, 0.95), 0.1, 1.0
ABOVE_EVERY_PARAM = 10**12
"""zl-z3-resident's stage3_param_persistence_threshold: every param is persistent."""


def own_gpt(n_layer: int, d_model: int, n_head: int, vocab: int, seq_len: int):
    """A GPT written here, not zerolaunch.models.gpt: the engine must not rely on anything of its own model."""
    import torch
    import torch.nn.functional as F
    from torch import nn

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.ln1, self.ln2 = nn.LayerNorm(d_model), nn.LayerNorm(d_model)
            self.qkv = nn.Linear(d_model, 3 * d_model)
            self.proj = nn.Linear(d_model, d_model)
            self.up, self.down = nn.Linear(d_model, 4 * d_model), nn.Linear(4 * d_model, d_model)

        def forward(self, x):
            B, T, C = x.shape
            q, k, v = self.qkv(self.ln1(x)).view(B, T, 3, n_head, C // n_head).unbind(2)  # (B, T, H, D) each
            y = F.scaled_dot_product_attention(
                q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True
            )
            x = x + self.proj(y.transpose(1, 2).reshape(B, T, C))
            return x + self.down(F.gelu(self.up(self.ln2(x)), approximate="tanh"))

    class OwnGPT(nn.Module):
        def __init__(self):
            super().__init__()
            self.wte, self.wpe = nn.Embedding(vocab, d_model), nn.Embedding(seq_len, d_model)
            self.blocks = nn.ModuleList(Block() for _ in range(n_layer))
            self.ln_f = nn.LayerNorm(d_model)
            self.head = nn.Linear(d_model, vocab, bias=False)
            self.head.weight = self.wte.weight
            for name, p in self.named_parameters():
                if p.dim() == 2:
                    std = (
                        0.02 / math.sqrt(2 * n_layer)
                        if name.endswith(("proj.weight", "down.weight"))
                        else 0.02
                    )
                    nn.init.normal_(p, std=std)
                elif name.endswith("bias"):
                    nn.init.zeros_(p)

        def forward(self, input_ids, labels):
            pos = torch.arange(input_ids.shape[1], device=input_ids.device)
            x = self.wte(input_ids) + self.wpe(pos)
            for block in self.blocks:
                x = block(x)
            logits = self.head(self.ln_f(x)).float()  # (B, T, V)
            return F.cross_entropy(logits.flatten(0, 1), labels.flatten())

    return OwnGPT()


def build_model(args):
    """(the row's model in fp32, its vocabulary size): the same weights in every row (seed 0)."""
    import torch

    torch.manual_seed(0)
    if args.model == "hf-llama":
        from transformers import AutoConfig, AutoModelForCausalLM

        cfg = dict(HF_LLAMA)
        if args.tiny:
            cfg.update(TINY_LLAMA)
        config = AutoConfig.for_model(**cfg)
        config._attn_implementation = "sdpa"
        model = AutoModelForCausalLM.from_config(config, torch_dtype=torch.float32)
        return model, config.vocab_size
    n_layer, d_model, n_head = SIZES["tiny" if args.tiny else args.size]
    vocab = 512 if args.tiny else 50304
    return own_gpt(n_layer, d_model, n_head, vocab, args.seq_len), vocab


def loss_of(model, batch, hf: bool):
    if hf:  # a causal LM shifts its labels itself
        return model(input_ids=batch["input_ids"], labels=batch["input_ids"]).loss
    return model(batch["input_ids"], batch["labels"])


def ds_config(stage: int, pure_bf16: bool, micro_batch: int, resident: bool = False) -> dict:
    bf16 = {"enabled": True}
    if pure_bf16:
        bf16.update(bf16_master_weights_and_grads=True, bf16_optimizer_states=True)
    zero = {"stage": stage}
    if resident:
        zero["stage3_param_persistence_threshold"] = ABOVE_EVERY_PARAM
    return {
        "train_micro_batch_size_per_gpu": micro_batch,
        "gradient_accumulation_steps": 1,
        "gradient_clipping": CLIP,
        "bf16": bf16,
        "zero_optimization": zero,
        "optimizer": {
            "type": "AdamW",
            "params": {"lr": LR, "betas": list(BETAS), "weight_decay": WEIGHT_DECAY},
        },
    }


def build_step(row: str, args, device):
    """(step(batch) -> loss tensor, the module, the ZeroLaunchEngine or None) of one row."""
    import torch

    hf = args.model == "hf-llama"
    model, _ = build_model(args)
    on_gpu = device.type == "cuda"
    if row.startswith("torch-"):
        if row == "torch-bf16":
            model = model.to(device, torch.bfloat16)
        else:
            model = model.to(device)
        opt = torch.optim.AdamW(
            model.parameters(), lr=LR, betas=BETAS, weight_decay=WEIGHT_DECAY, fused=on_gpu
        )
        compiled = torch.compile(model) if not args.eager else model

        def step(batch):
            with torch.autocast(device.type, torch.bfloat16, enabled=row == "torch-amp"):
                loss = loss_of(compiled, batch, hf)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), CLIP, foreach=on_gpu or None)
            opt.step()
            opt.zero_grad(set_to_none=True)
            return loss

        return step, model, None
    import zerolaunch

    stage = int(row[4])
    engine = zerolaunch.initialize(
        model,
        ds_config(stage, row.endswith("-bf16"), args.micro_batch, resident=row.endswith("-resident")),
        device=device,
    )
    if not args.eager:
        engine.compile()

    def step(batch):
        loss = loss_of(engine, batch, hf)
        engine.backward(loss)
        engine.step()
        return loss

    return step, engine.module, engine


def profile_steps(step, batches, path: Path) -> None:
    """Three steps under torch.profiler: where the step's time goes, written as text."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for b in batches:
            step(b)
        torch.cuda.synchronize()
    events = prof.events()
    # the GPU side of a record_function label (zerolaunch::<phase>) is a device event too, spanning kernels and
    # the gaps between them: not a kernel
    kernels = [
        e for e in events if e.device_type == torch.autograd.DeviceType.CUDA and not e.is_user_annotation
    ]
    gpu_ms = sum(e.device_time_total for e in kernels if e.device_time_total) / 1e3
    steps = len(batches)
    syncs = {
        name: sum(1 for e in events if e.name == name)
        for name in (
            "cudaStreamSynchronize",
            "cudaDeviceSynchronize",
            "cudaEventSynchronize",
            "aten::item",
            "aten::_local_scalar_dense",
            "cudaMemcpyAsync",
        )
    }
    lines = [
        f"steps profiled: {steps}",
        f"kernel time per step: {gpu_ms / steps:.2f} ms; kernels per step: {len(kernels) / steps:.0f}",
        *gpu_idle_lines(kernels, steps),
        "host syncs and copies per step: " + ", ".join(f"{k} {v / steps:g}" for k, v in syncs.items()),
        "",
        "top ops by self CUDA time:",
        prof.key_averages().table(sort_by="self_cuda_time_total", row_limit=30, max_name_column_width=60),
        "",
        "top ops by self CPU time:",
        prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=25, max_name_column_width=60),
    ]
    path.write_text("\n".join(lines) + "\n")
    trace = path.with_suffix(".trace.json")
    prof.export_chrome_trace(str(trace))  # for chrome://tracing or perfetto: the gaps above, in place
    subprocess.run(["gzip", "-f", str(trace)], check=False)


def gpu_idle_lines(kernels, steps: int) -> list[str]:
    """Where the GPU waits: the kernels' busy time (their intervals' union, every stream) against the span
    from the first kernel to the last, and the longest gaps with the kernels either side (a host sync or a
    slow launch shows as a gap; extra work as busy time)."""
    spans = sorted((e.time_range.start, e.time_range.end, e.name) for e in kernels if e.time_range.end > 0)
    if not spans:
        return []
    busy, gaps = 0.0, []
    cur_start, cur_end, cur_name = spans[0]
    for start, end, name in spans[1:]:
        if start > cur_end:
            busy += cur_end - cur_start
            gaps.append((start - cur_end, cur_name, name))
            cur_start, cur_end, cur_name = start, end, name
        elif end > cur_end:
            cur_end, cur_name = end, name
    busy += cur_end - cur_start
    span = max(end for _, end, _ in spans) - spans[0][0]
    gaps.sort(reverse=True)
    lines = [
        f"GPU busy per step (union of kernels): {busy / 1e3 / steps:.2f} ms; first-to-last kernel span per step: "
        f"{span / 1e3 / steps:.2f} ms; idle inside the span per step: {(span - busy) / 1e3 / steps:.2f} ms "
        f"in {len(gaps) / steps:.0f} gaps",
        "longest gaps (us, the kernel before -> after):",
    ]
    lines += [f"  {g:9.1f}  {a[:60]} -> {b[:60]}" for g, a, b in gaps[:12]]
    return lines


def run_row(row: str, args) -> dict:
    import torch

    device = torch.device(args.device)
    single_rank_env()
    if device.type == "cuda":
        torch.cuda.set_device(0)
        torch.backends.cuda.matmul.allow_tf32 = True
    step, _, _ = build_step(row, args, device)
    vocab = 512 if args.tiny else (HF_LLAMA["vocab_size"] if args.model == "hf-llama" else 50304)
    g = torch.Generator().manual_seed(1234)
    n = args.warmup + args.steps
    data = torch.randint(0, vocab, (n, args.micro_batch, args.seq_len + 1), generator=g)
    batches = [{"input_ids": d[:, :-1].to(device), "labels": d[:, 1:].to(device)} for d in data]
    times, loss = [], None
    cuda = device.type == "cuda"
    for i, b in enumerate(batches):
        if cuda and i == args.warmup:
            torch.cuda.reset_peak_memory_stats()
        if cuda:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
        loss = step(b)
        if cuda:
            end.record()
            torch.cuda.synchronize()
            if i >= args.warmup:
                times.append(start.elapsed_time(end))
    out = {
        "row": row,
        "model": args.model,
        "size": "tiny" if args.tiny else (args.size if args.model == "gpt" else "llama-1b"),
        "step_ms": statistics.median(times) if times else None,
        "peak_gib": torch.cuda.max_memory_allocated() / 2**30 if cuda else None,
        "final_loss": float(loss.detach().float()),
        "torch": torch.__version__,
        "card": torch.cuda.get_device_name(0) if cuda else "cpu",
    }
    if args.profile_row and cuda:
        profile_steps(step, batches[:3], Path(args.out) / f"profile-{row}.txt")
    return out


def builtin_gpt_args(args) -> dict:
    """zerolaunch.models.gpt.build's arguments for this bench's shape (--size, or --tiny)."""
    n_layer, d_model, n_head = SIZES["tiny" if args.tiny else args.size]
    vocab = 512 if args.tiny else 50304
    return {
        "size": "tiny" if args.tiny else "1.3b",  # the named size is overridden by the shape below
        "vocab_size": vocab,
        "seq_len": args.seq_len,
        "n_layer": n_layer,
        "n_head": n_head,
        "d_model": d_model,
    }


def run_builtin_engine_row(row: str, args) -> dict:
    """zl-gpt-z2-bf16: the built-in GPT under zerolaunch.initialize, fed zerolaunch train's synthetic data."""
    import torch

    from zerolaunch.data.synthetic import build as build_data
    from zerolaunch.models.gpt import build as build_gpt

    device = torch.device(args.device)
    for key, value in (("MASTER_ADDR", "127.0.0.1"), ("RANK", "0"), ("LOCAL_RANK", "0"), ("WORLD_SIZE", "1")):
        os.environ.setdefault(key, value)
    os.environ.setdefault("MASTER_PORT", str(29500 + os.getpid() % 1000))
    cuda = device.type == "cuda"
    if cuda:
        torch.cuda.set_device(0)
        torch.backends.cuda.matmul.allow_tf32 = True
    import zerolaunch

    gpt = builtin_gpt_args(args)
    torch.manual_seed(DATA_SEED)
    engine = zerolaunch.initialize(build_gpt(**gpt), ds_config(2, True, args.micro_batch), device=device)
    if not args.eager:
        engine.compile()
    stream = iter(
        build_data(0, 1, args.micro_batch, DATA_SEED, vocab_size=gpt["vocab_size"], seq_len=args.seq_len)
    )
    batches = [{k: v.to(device) for k, v in next(stream).items()} for _ in range(args.warmup + args.steps)]
    times, loss = [], None
    for i, b in enumerate(batches):
        if cuda and i == args.warmup:
            torch.cuda.reset_peak_memory_stats()
        if cuda:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
        began = time.perf_counter()
        loss = engine(b["input_ids"], b["labels"]).loss
        engine.backward(loss)
        engine.step()
        if cuda:
            end.record()
            torch.cuda.synchronize()
        if i >= args.warmup:  # on the CPU the clock, as zerolaunch train's step_seconds there
            times.append(start.elapsed_time(end) if cuda else 1e3 * (time.perf_counter() - began))
    return {
        "row": row,
        "model": "zerolaunch-gpt",
        "size": "tiny" if args.tiny else args.size,
        "step_ms": statistics.median(times) if times else None,
        "peak_gib": torch.cuda.max_memory_allocated() / 2**30 if cuda else None,
        "final_loss": float(loss.detach().float()),
        "torch": torch.__version__,
        "card": torch.cuda.get_device_name(0) if cuda else "cpu",
    }


def train_row_command(args, run_dir: str, ckpt_dir: str) -> list[str]:
    """`zerolaunch train` on recipes/gpt-1.3b.yaml, set to zl-gpt-z2-bf16's model, data, optimizer and
    precision (DeepSpeed's pure-bf16 keys, as ds_config), compiled as engine.compile() compiles at stage 2."""
    repo = Path(__file__).resolve().parent.parent
    gpt = builtin_gpt_args(args)
    sets = [f"model.args.{k}={v}" for k, v in gpt.items()] + [
        f"data.args.vocab_size={gpt['vocab_size']}",
        f"data.args.seq_len={args.seq_len}",
        f"train.steps={args.warmup + args.steps}",
        f"train.micro_batch_size={args.micro_batch}",
        "train.gradient_accumulation_steps=1",
        f"train.seed={DATA_SEED}",
        f"train.lr={LR}",
        f"train.betas=[{BETAS[0]}, {BETAS[1]}]",
        f"train.weight_decay={WEIGHT_DECAY}",
        "train.weight_decay_1d=true",  # a bare DeepSpeed config's rule, as zerolaunch.initialize applies it
        f"train.gradient_clipping={CLIP}",
        "train.warmup_steps=0",
        "train.lr_schedule=constant",
        "train.log_every=1",
        f"train.compile={'false' if args.eager else 'true'}",
        "deepspeed.bf16.bf16_master_weights_and_grads=true",
        "deepspeed.bf16.bf16_optimizer_states=true",
        f"checkpoint.dir={ckpt_dir}",
        "checkpoint.keep=1",
    ]
    if not args.eager:
        sets.append("train.compile_scope=model")
    workers = ["--gpus", "1"] if args.device.startswith("cuda") else ["--cpu", "1"]
    cmd = [sys.executable, "-m", "zerolaunch", "train", str(repo / "recipes" / "gpt-1.3b.yaml"), *workers]
    return cmd + ["--run-dir", run_dir] + [a for kv in sets for a in ("--set", kv)]


def run_train_row(row: str, args) -> dict:
    """zl-train-z2-bf16: the user's path as a subprocess; the median step of its metrics.jsonl. The end-of-run
    checkpoint (the built-in loop always saves one) comes after the last step, is not timed, and is deleted."""
    import shutil
    import tempfile

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from train_path import read_run

    run_dir = tempfile.mkdtemp(prefix="zl-engine-tax-train-")
    ckpt_dir = tempfile.mkdtemp(
        prefix="zl-engine-tax-ckpt-", dir="/dev/shm" if os.path.isdir("/dev/shm") else None
    )
    cmd = train_row_command(args, run_dir, ckpt_dir)
    try:
        # the user's shell: no torchrun variables of a row process that ran before (the launcher sets its own)
        env = {k: v for k, v in os.environ.items() if k not in one_rank_torchrun_env()}
        p = subprocess.Popen(
            cmd,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            cwd=Path(__file__).resolve().parent.parent,
            env=env,
            start_new_session=True,  # its launcher and worker are one process group: stopped together below
        )
        started = time.perf_counter()
        try:
            # inside the row's own timeout: the steps logged so far are read even when the run is cut (the
            # end-of-run save of a 1.3B model's state can outlast what a device call has left)
            out, err = p.communicate(timeout=max(10.0, args.timeout - 20))
            cut = False
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, 9)
            out, err = p.communicate()
            cut = True
        wall_s = time.perf_counter() - started
    finally:
        shutil.rmtree(ckpt_dir, ignore_errors=True)
    metrics = Path(run_dir) / "metrics.jsonl"
    run = read_run(run_dir, args.warmup) if metrics.exists() else {"steps": 0}
    # the steps are what is measured: a failed end-of-run save (a small /dev/shm) is recorded, not fatal
    if run["steps"] < args.steps:
        tail = " | ".join((err or out).strip().splitlines()[-6:])
        why = f"stopped after {wall_s:.0f} s" if cut else f"rc={p.returncode}"
        raise RuntimeError(f"zerolaunch train {why}, {run['steps']} timed steps logged: {tail}")
    rows = [json.loads(line) for line in metrics.read_text().splitlines() if line.strip()]
    last = [r for r in rows if r.get("step_seconds")][-1]
    peak = last.get("mem_allocated_bytes")
    shutil.rmtree(run_dir, ignore_errors=True)
    return {
        "row": row,
        "model": "zerolaunch-gpt",
        "size": "tiny" if args.tiny else args.size,
        "step_ms": run["median_step_ms"],
        "peak_gib": peak / 2**30 if peak and args.device.startswith("cuda") else None,
        "final_loss": last["loss"],
        "data_wait_ms": run.get("median_data_wait_ms"),
        "train_rc": None if cut else p.returncode,
        "train_wall_s": wall_s,
        "cut_after_its_steps": cut,
        "command": " ".join(cmd),
    }


def run_any_row(row: str, args) -> dict:
    if row == "zl-gpt-z2-bf16":
        return run_builtin_engine_row(row, args)
    if row == "zl-train-z2-bf16":
        return run_train_row(row, args)
    return run_row(row, args)


def drive(args) -> None:
    rows = pick_rows(args.rows, ROWS + BUILTIN_ROWS, ROWS + (BUILTIN_ROWS if args.model == "gpt" else ()))
    profiled = set(args.profile.split(",")) if args.profile else set()
    Path(args.out).mkdir(parents=True, exist_ok=True)
    results = []
    for row in rows:
        cmd = [sys.executable, __file__, "--one", row, *sys.argv[1:]]
        if row in profiled:
            cmd.append("--profile-row")
        try:
            results.append(row_result(cmd, args.timeout))
        except RuntimeError as e:
            results.append({"row": row, "error": str(e)[-400:]})
        print(json.dumps(results[-1]), flush=True)
    (Path(args.out) / "engine_tax.json").write_text(json.dumps(results, indent=1))
    print_table(results)


def print_table(results: list[dict]) -> None:
    by_row = {r["row"]: r for r in results}
    base = {"bf16": by_row.get("torch-bf16"), "amp": by_row.get("torch-amp")}
    print(f"{'row':<12} {'step ms':>9} {'vs torch':>9} {'peak GiB':>9} {'loss':>9}")
    for r in results:
        if "error" in r:
            print(f"{r['row']:<12} failed: {r['error'][-120:]}")
            continue
        ref = base["bf16" if r["row"].endswith("bf16") else "amp"]
        if r["row"] == "zl-train-z2-bf16":  # the user's path against the engine on the same model
            ref = by_row.get("zl-gpt-z2-bf16")
        ratio = r["step_ms"] / ref["step_ms"] if ref and ref.get("step_ms") and r["step_ms"] else float("nan")
        ms = f"{r['step_ms']:.1f}" if r["step_ms"] else "-"
        peak = f"{r['peak_gib']:.2f}" if r["peak_gib"] is not None else "-"
        print(f"{r['row']:<12} {ms:>9} {ratio:>8.3f}x {peak:>9} {r['final_loss']:>9.4f}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", default="all")
    ap.add_argument("--model", choices=("gpt", "hf-llama"), default="gpt")
    ap.add_argument("--size", choices=tuple(SIZES), default="1.3b")
    ap.add_argument("--seq-len", type=int, default=2048)
    ap.add_argument("--micro-batch", type=int, default=8)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--eager", action="store_true", help="no torch.compile / engine.compile()")
    ap.add_argument("--profile", default="", help="rows to profile, comma-separated")
    ap.add_argument("--out", default="bench/results/engine_tax")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--tiny", action="store_true", help="a 2-layer model: the smoke test")
    ap.add_argument("--timeout", type=float, default=420)
    ap.add_argument("--one", help=argparse.SUPPRESS)
    ap.add_argument("--profile-row", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.one:
        print_result(run_any_row(args.one, args))
    else:
        drive(args)


if __name__ == "__main__":
    main()
