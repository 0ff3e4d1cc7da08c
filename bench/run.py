"""Side-by-side GPU benchmark: plain torch, FSDP2, DeepSpeed and zerolaunch on the same GPT, one process each.

    python bench/run.py --sizes 350m,1.3b --engines all          # the table of issue 10
    python bench/run.py --one zl-z2 --size 350m                  # one configuration (what the driver spawns)
    python bench/run.py --model hf-llama-1b --engines torch,fsdp2,zl-z2,zl-z3   # HF Llama-1B rows (size "llama-1b")

Every configuration trains the built-in GPT (`zerolaunch.models.gpt`) at seq 2048, micro batch 8, bf16, AdamW,
the same seed and the same synthetic batches, in its own process (so one engine's allocator state and compiled
kernels never leak into another's numbers). Each reports the median step time over the timed steps after
warm-up, peak allocated memory, and the final loss. The driver measures the bf16 matmul rate once and prints
MFU against it (and against the 989 TFLOP/s datasheet peak), plus each row's ratio to the best peer.
The zl-train rows run the user's path instead: `zerolaunch train recipes/gpt-SIZE.yaml --gpus 1` (the built-in
loop with its own data pipeline; zl-train-compile adds `--set train.compile=true`), read from metrics.jsonl.
`--model hf-llama-1b` trains transformers' LlamaForCausalLM instead, built from the config of
recipes/hf-llama-1b.yaml through zerolaunch.models.hf (random init, sdpa, no download; stage 3 with the decoder
layers as units, built on meta), its own loss (labels = input_ids); FLOPs from report/mfu.py hf_flops_per_token.
Its rows are HF_ENGINES, its size column the model's label ("llama-1b"; --sizes is not used).
The ds-* rows need DeepSpeed, which the GPU machine cannot download: `bash bench/fetch_wheels.sh` puts it and
what it imports into .whl/ (carry that folder; the script says how to install it there).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time

from _row_process import LLAMA_1B, init_single_rank_group, print_result, row_result

ENGINES = {
    "torch": "plain torch, fused AdamW",
    "fsdp2": "FSDP2 fully_shard per block, bf16 params / fp32 reduce",
    "torch-compile": "plain torch, fused AdamW, torch.compile(model)",
    "torch-compile-blocks": "plain torch, fused AdamW, each block's forward compiled as train.compile does",
    "torch-compile-fwdbwd": "torch-compile's forward and backward alone, no clip and no optimizer step: the "
    "floor any engine running this compiled model without overlapping its step reaches (a diagnostic, not a peer)",
    "torch-amp": "plain torch, fp32 params + bf16 autocast, fused AdamW: the same numerics as ZeRO's fp32 master",
    "torch-amp-compile": "torch-amp with torch.compile(model)",
    "fsdp2-compile": "FSDP2 as above, each block torch.compile'd before fully_shard (torchtitan's order)",
    "ds-z1": "DeepSpeed ZeRO-1",
    "ds-z2": "DeepSpeed ZeRO-2",
    "ds-z3": "DeepSpeed ZeRO-3",
    "ds-z2-off": "DeepSpeed ZeRO-2 + CPU optimizer offload",
    "ds-z2-purebf16": "DeepSpeed ZeRO-2 in pure bf16 (bf16_master_weights_and_grads + bf16_optimizer_states), "
    "torch's fused AdamW",
    "fsdp2-off": "FSDP2 + CPUOffloadPolicy",
    "fsdp2-off-noclip": "fsdp2-off without clip_grad_norm_ (a diagnostic: torch's clip over host DTensor grads "
    "was half of fsdp2-off's step on 2026-12-05; every other row clips at 1.0)",
    "zl-z1": "zerolaunch ZeRO-1",
    "zl-z2": "zerolaunch ZeRO-2",
    "zl-z3": "zerolaunch ZeRO-3",
    "zl-z2-off": "zerolaunch ZeRO-2 + CPU optimizer offload",
    "zl-z2-off-ovl": "zerolaunch ZeRO-2 + CPU optimizer offload, step overlapping the next forward",
    "zl-z3-off": "zerolaunch ZeRO-3 + CPU optimizer offload",
    "zl-z2-compile": "zerolaunch ZeRO-2, each block's forward compiled as train.compile does, before the engine",
    "zl-z3-compile": "zerolaunch ZeRO-3, each block's forward compiled as train.compile does, before the engine",
    "zl-z2-compile-model": "zerolaunch ZeRO-2, the whole model's forward compiled (loss included), before the engine",
    # [Note: fused step] (zero/optim/fused_step.py): optimizer.fused_step, train.compile_optimizer in a recipe
    "zl-z2-fused": "zl-z2 with optimizer.fused_step: each chunk's AdamW and its bf16 param copy as one kernel",
    "zl-z3-fused": "zl-z3 with optimizer.fused_step (the chunks' steps fused; stage 3 publishes with a copy)",
    "zl-z2-compile-model-fused": "zl-z2-compile-model with optimizer.fused_step (what train.compile gives)",
    # [Note: compute-dtype grads] (zero/grad_shards.py): the -fused rows at world size 1 hold bf16 grads
    "zl-z2-fused-fp32grads": "zl-z2-fused with fp32 grad shards forced (how the fused step ran before 16-bit grads)",
    "zl-z2-compile-model-fused-fp32grads": "zl-z2-compile-model-fused with fp32 grad shards forced",
    # [Note: bf16 master] (zero/optim/shard_optimizer.py): the numerics of the pure-bf16 torch rows
    "zl-z2-purebf16": "zl-z2 in pure bf16: bf16 master and AdamW moments (DeepSpeed's bf16_master_weights_and_grads"
    " + bf16_optimizer_states), torch's fused AdamW",
    "zl-z3-purebf16": "zl-z3 in pure bf16",
    "zl-z2-compile-model-fused-purebf16": "zl-z2-compile-model-fused in pure bf16: the same numerics as torch-compile",
    "zl-train": "`zerolaunch train recipes/gpt-SIZE.yaml --gpus 1` (ZeRO-2): the built-in loop, its own data",
    "zl-train-compile": "the zl-train row with --set train.compile=true",
    "zl-train-compile-model": "the zl-train row with train.compile=true, train.compile_scope=model",
    "zl-train-compile-model-unfused": "zl-train-compile-model with train.compile_optimizer=false (its default: true)",
}
TRAIN_PATH = ("zl-train", "zl-train-compile", "zl-train-compile-model", "zl-train-compile-model-unfused")
# --model: "gpt" is the built-in GPT at --sizes; the others are Hugging Face configs (recipes/hf-*.yaml's
# model.args), one size each: (the size column's label, the config). bench.HF_MODELS is what a CPU check extends.
HF_MODELS = {"hf-llama-1b": ("llama-1b", LLAMA_1B)}
HF_ENGINES = (
    "torch",
    "fsdp2",
    "torch-compile",
    "fsdp2-compile",
    "zl-z2",
    "zl-z3",
    "zl-z3-compile",
    "zl-z2-fused",
    "zl-z3-fused",
    "zl-z3-purebf16",
)
PEERS = (
    "torch",
    "fsdp2",
    "torch-compile",
    "torch-compile-blocks",
    "torch-amp",
    "torch-amp-compile",
    "fsdp2-compile",
    "ds-z1",
    "ds-z2",
    "ds-z3",
    "ds-z2-purebf16",
)
OFFLOAD_PEERS = ("ds-z2-off", "fsdp2-off")


def _batches(vocab_size: int, seq_len: int, micro_batch: int, n: int, device, hf: bool = False):
    import torch

    from zerolaunch.data.synthetic import build as build_data

    it = iter(
        build_data(
            rank=0,
            world_size=1,
            micro_batch_size=micro_batch,
            seed=1234,
            vocab_size=vocab_size,
            seq_len=seq_len,
        )
    )
    out = []
    for _ in range(n):
        b = next(it)
        if hf:  # a Hugging Face causal LM shifts its labels itself
            b = {"input_ids": b["input_ids"], "labels": b["input_ids"]}
        out.append({k: v.to(device, non_blocking=True) for k, v in b.items()})
    if device.type == "cuda":
        torch.cuda.synchronize()
    return out


def _ds_config(stage: int, offload: bool, lr: float, pure_bf16: bool = False) -> dict:
    """The DeepSpeed rows' config. pure_bf16: bf16 master and optimizer state ([Note: bf16 master]), with
    torch's fused AdamW (fp32 arithmetic rounded once, as DeepSpeed's FusedAdam and zerolaunch compute it;
    torch's default foreach AdamW would round every intermediate in bf16)."""
    zero = {
        "stage": stage,
        "overlap_comm": True,
        "contiguous_gradients": True,
        "reduce_bucket_size": 5e8,
        "allgather_bucket_size": 5e8,
    }
    if offload:
        zero["offload_optimizer"] = {"device": "cpu", "pin_memory": True}
    bf16 = {"enabled": True}
    if pure_bf16:
        bf16.update(bf16_master_weights_and_grads=True, bf16_optimizer_states=True)
    return {
        "train_micro_batch_size_per_gpu": 8,
        "gradient_accumulation_steps": 1,
        "train_batch_size": 8,
        "bf16": bf16,
        "gradient_clipping": 1.0,
        "zero_optimization": zero,
        # torch_adam avoids a multi-minute JIT build of DeepSpeed's FusedAdam on a machine without
        # prebuilt ops; over one flat fp32 partition torch's AdamW is a handful of kernels anyway.
        "optimizer": {
            "type": "AdamW",
            "params": {
                "lr": lr,
                "betas": [0.9, 0.95],
                "eps": 1e-8,
                "weight_decay": 0.1,
                "torch_adam": not offload,
                **({"fused": True} if pure_bf16 else {}),
            },
        },
        "steps_per_print": 10**9,
        "wall_clock_breakdown": False,
    }


def run_train_path(
    engine: str,
    size: str,
    steps: int,
    warmup: int,
    seq_len: int,
    micro_batch: int,
    workers: tuple[str, ...] = ("--gpus", "1"),
    extra_sets: tuple[str, ...] = (),
) -> dict:
    """The user's path: `zerolaunch train` as a subprocess, its numbers read back from metrics.jsonl.

    The first `warmup` steps are left out as run_one leaves out its warm-up; the run's final checkpoint
    (the built-in loop always saves at the end) is written after the last step and is not timed.
    `workers` / `extra_sets` exist for a CPU check of this function (e.g. ("--cpu", "1"), a tiny size)."""
    import tempfile

    import torch

    from zerolaunch.models.gpt import build as build_gpt

    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    run_dir = tempfile.mkdtemp(prefix=f"zl-bench-{engine}-{size}-")
    # the end-of-run checkpoint (16 B a param: 21 GB at 1.3B) goes to RAM when it can, then is deleted:
    # it is not timed, but a slow disk would spend the device call on it.
    ckpt_dir = tempfile.mkdtemp(
        prefix="zl-bench-ckpt-", dir="/dev/shm" if os.path.isdir("/dev/shm") else None
    )
    sets = [
        f"train.steps={steps + warmup}",
        "train.log_every=1",
        f"train.micro_batch_size={micro_batch}",
        f"model.args.seq_len={seq_len}",
        f"data.args.seq_len={seq_len}",
        f"checkpoint.dir={ckpt_dir}",
        "checkpoint.keep=1",
    ]
    if engine.startswith("zl-train-compile"):
        sets.append("train.compile=true")
    if engine.startswith("zl-train-compile-model"):
        sets.append("train.compile_scope=model")
    if engine.endswith("-unfused"):
        sets.append("train.compile_optimizer=false")
    sets += list(extra_sets)
    cmd = [sys.executable, "-m", "zerolaunch", "train", os.path.join(repo, "recipes", f"gpt-{size}.yaml")]
    cmd += [*workers, "--run-dir", run_dir] + [a for kv in sets for a in ("--set", kv)]
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, cwd=repo)
    finally:
        shutil.rmtree(ckpt_dir, ignore_errors=True)
    metrics = os.path.join(run_dir, "metrics.jsonl")
    rows = []
    if os.path.exists(metrics):
        with open(metrics) as f:
            rows = [json.loads(line) for line in f if line.strip()]
    rows = [r for r in rows if r.get("step_seconds")]
    if len(rows) < steps + warmup:
        tail = (p.stderr or p.stdout).strip().splitlines()[-6:]
        raise SystemExit(f"zerolaunch train rc={p.returncode}, {len(rows)} steps logged: " + " | ".join(tail))
    timed = [r for r in rows if r["step"] > warmup]
    with torch.device("meta"):
        ref = build_gpt(size=size, vocab_size=50304, seq_len=seq_len)
    peaks = [r.get("mem_allocated_bytes") for r in rows if r.get("mem_allocated_bytes") is not None]
    compile_line = [ln for ln in p.stdout.splitlines() if ln.startswith("train.compile:")]
    return {
        "engine": engine,
        "size": size,
        "step_ms": statistics.median(1e3 * r["step_seconds"] for r in timed),
        "step_ms_all": [1e3 * r["step_seconds"] for r in timed],
        "first_step_ms": 1e3 * rows[0]["step_seconds"],
        "peak_gib": max(peaks) / 2**30 if peaks else float("nan"),
        "final_loss": float(rows[-1]["loss"]),
        "data_wait_ms": statistics.median(r.get("data_wait_ms") or 0.0 for r in timed),
        "compile_line": compile_line[-1] if compile_line else None,
        "train_rc": p.returncode,
        "run_dir": run_dir,
        "tokens_per_step": micro_batch * seq_len,
        "flops_per_token": float(ref.flops_per_token(seq_len)),
        "n_params": ref.num_params(),
    }


def _hf_build(model_name: str, meta: bool = False):
    """The HF model of --model `model_name` (HF_MODELS), fp32 weights, sdpa, random init (on meta if asked)."""
    from zerolaunch.models.hf import build as build_hf

    return build_hf(
        config=dict(HF_MODELS[model_name][1]), dtype="fp32", attn_implementation="sdpa", meta=meta
    )


def _blocks(model):
    """The repeated blocks FSDP2 shards one by one: GPT's transformer.h, an HF decoder's model.layers."""
    return model.transformer.h if hasattr(model, "transformer") else model.model.layers


def _reference(make, model_name: str, seq_len: int) -> tuple[float, int]:
    """(flops_per_token, n_params) of the configuration's model, from a meta copy."""
    import torch

    if model_name == "gpt":
        with torch.device("meta"):
            ref = make()
        return float(ref.flops_per_token(seq_len)), ref.num_params()
    from zerolaunch.models.hf import hf_config_dict
    from zerolaunch.report.mfu import hf_flops_per_token

    ref = _hf_build(model_name, meta=True)
    flops = hf_flops_per_token(hf_config_dict(ref), seq_len)
    return float(flops) if flops is not None else float("nan"), sum(p.numel() for p in ref.parameters())


def build_step(engine: str, size: str, seq_len: int, model_name: str = "gpt", device=None):
    """(step(batch) -> loss, make() -> a fresh model, parts) for one configuration, on `device` (cuda:0).

    model_name: "gpt" (the built-in GPT at `size`) or a key of HF_MODELS (a Hugging Face model; `size` unused).
    parts: {"module": what runs forward, "stepper": the object whose .step() applies the update (optimizer or
    engine), "engine": the zerolaunch engine or None}. Shared by run_one (timing) and bench/mem_snapshot.py
    (which hooks module and stepper to see how the peak memory splits by phase)."""
    import torch

    from zerolaunch.models.gpt import build as build_gpt

    torch.manual_seed(0)
    lr = 3e-4
    vocab = 50304
    device = torch.device("cuda", 0) if device is None else torch.device(device)
    init_single_rank_group(device)
    if model_name == "gpt":
        make = lambda: build_gpt(size=size, vocab_size=vocab, seq_len=seq_len)  # noqa: E731
    elif model_name in HF_MODELS:
        if engine not in HF_ENGINES:
            raise SystemExit(
                f"--model {model_name}: engine {engine!r} not benchmarked; choose from {', '.join(HF_ENGINES)}"
            )
        make = lambda: _hf_build(model_name)  # noqa: E731
    else:
        raise SystemExit(f"unknown model {model_name!r}; choose from gpt, {', '.join(HF_MODELS)}")

    floor = engine == "torch-compile-fwdbwd"
    engine = "torch-compile" if floor else engine
    if engine in ("torch", "torch-compile", "torch-compile-blocks", "torch-amp", "torch-amp-compile"):
        # torch*: pure bf16 (bf16 params, grads and AdamW moments). torch-amp*: fp32 weights, grads and moments,
        # matmuls in bf16 under autocast: what every ZeRO stage and FSDP2 here compute, without sharding.
        amp = engine.startswith("torch-amp")
        model = make().to(device) if amp else make().to(device=device, dtype=torch.bfloat16)
        if engine in ("torch-compile", "torch-amp-compile"):
            model = torch.compile(model)
        elif engine == "torch-compile-blocks":
            from zerolaunch.models.compiling import compile_blocks

            # what separates per-block from whole-model compilation, without any engine around it
            compile_blocks(model, backend="inductor")
        opt = torch.optim.AdamW(model.parameters(), lr=lr, betas=(0.9, 0.95), weight_decay=0.1, fused=True)
        parts = {"module": model, "stepper": opt, "engine": None}

        def step(b):
            with torch.autocast(device.type, dtype=torch.bfloat16, enabled=amp):
                loss = model(**b).loss
            loss.backward()
            if not floor:
                torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
                opt.step()
            opt.zero_grad(set_to_none=True)
            return loss
    elif engine.startswith("fsdp2"):
        from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, fully_shard

        model = make().to(device)
        mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
        kw = {"mp_policy": mp}
        if "-off" in engine:
            kw["offload_policy"] = CPUOffloadPolicy(pin_memory=True)
        clip = not engine.endswith("-noclip")
        if engine == "fsdp2-compile":
            # torchtitan: replace each block by its compiled wrapper, then shard it; FSDP2's hooks stay outside
            for i, block in enumerate(_blocks(model)):
                _blocks(model)[i] = torch.compile(block)
        for block in _blocks(model):
            fully_shard(block, **kw)
        fully_shard(model, **kw)
        # fused on the CPU too (DTensor supports torch's fused CPU AdamW): the fastest step torch offers
        # an FSDP2 user; the default per-parameter loop is several times slower.
        opt = torch.optim.AdamW(model.parameters(), lr=lr, betas=(0.9, 0.95), weight_decay=0.1, fused=True)
        parts = {"module": model, "stepper": opt, "engine": None}

        def step(b):
            loss = model(**b).loss
            loss.backward()
            if clip:
                torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            opt.zero_grad(set_to_none=True)
            return loss
    elif engine.startswith("ds-"):
        import deepspeed

        stage = int(engine[4])
        model = make()
        eng, _, _, _ = deepspeed.initialize(
            model=model,
            model_parameters=model.parameters(),
            config=_ds_config(stage, engine.endswith("off"), lr, pure_bf16=engine.endswith("-purebf16")),
        )
        parts = {"module": eng.module, "stepper": eng, "engine": None}

        def step(b):
            loss = eng(**b).loss
            eng.backward(loss)
            eng.step()
            return loss
    elif engine.startswith("zl-"):
        from zerolaunch.zero import Engine
        from zerolaunch.zero.options import (
            EngineOptions,
            OffloadOptions,
            OptimizerOptions,
            PrecisionOptions,
            ZeroOptions,
        )

        pure_bf16 = engine.endswith("-purebf16")
        engine = engine.removesuffix("-purebf16")
        fp32_grads = engine.endswith("-fp32grads")
        engine = engine.removesuffix("-fp32grads")
        fused = engine.endswith("-fused")
        engine = engine.removesuffix("-fused")
        stage = int(engine[4])
        off = (
            OffloadOptions(device="cpu", pin_memory=True, overlap_step=engine.endswith("-ovl"))
            if "-off" in engine
            else OffloadOptions()
        )
        opts = EngineOptions(
            zero=ZeroOptions(
                stage=stage,
                reduce_bucket_size=500_000_000,
                overlap_comm=True,
                offload_optimizer=off,
            ),
            precision=PrecisionOptions(dtype="bf16", master_dtype="bf16" if pure_bf16 else "fp32"),
            optimizer=OptimizerOptions(
                name="adamw", lr=lr, betas=(0.9, 0.95), weight_decay=0.1, fused_step=fused
            ),
            gradient_clipping=1.0,
        )
        init_fn = None
        if stage == 3 and model_name != "gpt":
            from zerolaunch.models.hf import hf_stage3_units, meta_init_fn

            # as zerolaunch.initialize: the decoder layers as units, built on meta, HF's init unit by unit
            model = _hf_build(model_name, meta=True)
            opts = hf_stage3_units(model, opts)
            init_fn = meta_init_fn(model, opts)
        elif stage == 3:
            with torch.device("meta"):
                model = make()
        else:
            model = make()
        if engine.endswith("-compile"):
            from zerolaunch.models.compiling import compile_blocks

            # train.compile's code path: each block's forward, in place (names and stage 3 units unchanged)
            compile_blocks(model, backend="inductor", unit_classes=opts.zero.stage3_units)
        elif engine.endswith("-compile-model"):
            # the forward as one graph (embedding, blocks, loss); the engine's grad hooks stay eager
            model.forward = torch.compile(model.forward, dynamic=False)
        if fp32_grads:
            from zerolaunch.zero import plan

            kept, plan.grads_in_compute_dtype = plan.grads_in_compute_dtype, lambda *a: False
            try:
                eng = Engine(model, opts, device=device, init_fn=init_fn)
            finally:
                plan.grads_in_compute_dtype = kept
        else:
            eng = Engine(model, opts, device=device, init_fn=init_fn)
        parts = {"module": eng.module, "stepper": eng, "engine": eng}

        def step(b):
            loss = eng(**b).loss
            eng.backward(loss)
            eng.step()
            return loss
    else:
        raise SystemExit(f"unknown engine {engine!r}; choose from {', '.join(ENGINES)}")
    return step, make, parts


def run_one(
    engine: str, size: str, steps: int, warmup: int, seq_len: int, micro_batch: int, model_name: str = "gpt"
) -> dict:
    import torch

    if engine in TRAIN_PATH and model_name == "gpt":
        return run_train_path(engine, size, steps, warmup, seq_len, micro_batch)
    hf = model_name != "gpt"
    if hf:
        size = HF_MODELS[model_name][0] if model_name in HF_MODELS else size
    step, make, _ = build_step(engine, size, seq_len, model_name=model_name)
    vocab = HF_MODELS[model_name][1]["vocab_size"] if hf else 50304
    batches = _batches(vocab, seq_len, micro_batch, steps + warmup, torch.device("cuda", 0), hf=hf)

    times_ms = []
    loss = first_ms = None
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    for i, b in enumerate(batches):
        if i == warmup:
            torch.cuda.reset_peak_memory_stats()
        start.record()
        loss = step(b)
        end.record()
        torch.cuda.synchronize()
        if i >= warmup:
            times_ms.append(start.elapsed_time(end))
        if i == 0:
            first_ms = start.elapsed_time(end)  # includes torch.compile's warm-up on the compiled rows
    flops_per_token, n_params = _reference(make, model_name, seq_len)
    out = {
        "engine": engine,
        "size": size,
        "step_ms": statistics.median(times_ms),
        "step_ms_all": times_ms,
        "first_step_ms": first_ms,
        "peak_gib": torch.cuda.max_memory_allocated() / 2**30,
        "final_loss": float(loss.detach().float().item()),
        "tokens_per_step": micro_batch * seq_len,
        "flops_per_token": flops_per_token,
        "n_params": n_params,
    }
    if hf:
        out["model"] = model_name
    return out


def measure_matmul_tflops() -> float:
    import torch

    n = 8192
    a = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    for _ in range(3):
        a @ b
    torch.cuda.synchronize()
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    s.record()
    for _ in range(20):
        a @ b
    e.record()
    torch.cuda.synchronize()
    return 2 * n**3 * 20 / (s.elapsed_time(e) / 1e3) / 1e12


def one_args(engine: str, size: str, args) -> list[str]:
    """The command-line arguments of one configuration's own process (`--one ENGINE ...`)."""
    return [
        "--one",
        engine,
        "--size",
        size,
        "--steps",
        str(args.steps),
        "--warmup",
        str(args.warmup),
        "--seq-len",
        str(args.seq_len),
        "--micro-batch",
        str(args.micro_batch),
    ]


def drive(args) -> None:
    model_name = getattr(args, "model", "gpt")
    if model_name == "gpt":
        engines = list(ENGINES) if args.engines == "all" else args.engines.split(",")
        sizes = args.sizes.split(",")
    else:  # one size: the model's own; "all" is the rows this bench builds for it
        engines = list(HF_ENGINES) if args.engines == "all" else args.engines.split(",")
        sizes = [HF_MODELS[model_name][0]]
    peak_measured = measure_matmul_tflops()
    rows = []
    for size in sizes:
        for engine in engines:
            if engine.startswith("fsdp2-off") and size != "1.3b" and not args.all_offload:
                continue
            if engine == "ds-z2-off" and size != "1.3b" and not args.all_offload:
                continue
            cmd = [sys.executable, __file__, *one_args(engine, size, args)]
            if model_name != "gpt":
                cmd += ["--model", model_name]
            t0 = time.time()
            try:
                r = row_result(cmd, args.timeout)
            except RuntimeError as error:
                rows.append({"engine": engine, "size": size, "error": str(error)[-400:]})
                if model_name != "gpt":
                    rows[-1]["model"] = model_name
                tail = str(error).split(" | ")
                print(
                    f"[{engine} {size}] FAILED in {time.time() - t0:.0f}s:\n  " + "\n  ".join(tail),
                    flush=True,
                )
                continue
            rows.append(r)
            print(
                f"[{engine} {size}] {r['step_ms']:.1f} ms  peak {r['peak_gib']:.1f} GiB  "
                f"loss {r['final_loss']:.4f}  ({time.time() - t0:.0f}s)",
                flush=True,
            )
    if args.json_out:
        with open(args.json_out, "w") as f:
            json.dump({"matmul_tflops": peak_measured, "rows": rows}, f, indent=1)
    print_table(rows, peak_measured)


def print_table(rows: list[dict], peak_measured: float) -> None:
    print(f"\nbf16 matmul 8192^3 measured: {peak_measured:.0f} TFLOP/s (datasheet 989)")
    w = max([5, *(len(r["size"]) for r in rows)])  # 5 for the GPT sizes; "llama-1b" widens it
    hdr = (
        f"{'size':>{w}} {'engine':<16} {'step ms':>8} {'tok/s':>8} {'TFLOP/s':>8} {'MFU%':>6} {'MFU989%':>7} "
        f"{'peak GiB':>8} {'loss':>8} {'vs best peer':>12} {'1st step ms':>11}"
    )
    print(hdr)
    for size in dict.fromkeys(r["size"] for r in rows):
        ok = [r for r in rows if r["size"] == size and "error" not in r]
        best = min((r["step_ms"] for r in ok if r["engine"] in PEERS), default=None)
        best_off = min((r["step_ms"] for r in ok if r["engine"] in OFFLOAD_PEERS), default=None)
        for r in (r for r in rows if r["size"] == size):
            if "error" in r:
                print(f"{size:>{w}} {r['engine']:<16} FAILED: {r['error'][:80]}")
                continue
            tok_s = r["tokens_per_step"] / (r["step_ms"] / 1e3)
            tflops = tok_s * r["flops_per_token"] / 1e12
            ref = best_off if "-off" in r["engine"] else best
            ratio = f"{r['step_ms'] / ref:.2f}x" if ref else "-"
            print(
                f"{size:>{w}} {r['engine']:<16} {r['step_ms']:8.1f} {tok_s:8.0f} {tflops:8.1f} "
                f"{100 * tflops / peak_measured:6.1f} {100 * tflops / 989:7.1f} {r['peak_gib']:8.2f} "
                f"{r['final_loss']:8.4f} {ratio:>12} {r.get('first_step_ms') or 0:11.0f}"
            )


def summary_table(calls: list[dict]) -> str:
    """One table of a device call's rows, read from the `--json-out` files of its bench/run.py commands: each row's
    step time as a ratio to the fastest peer of the same size anywhere in the call (offload rows to the fastest
    offload peer), so rows that ran in different commands still compare. The matmul rate is the call's highest
    measurement (one machine); MFU is against it. Rows of different machines must not be summarized together."""
    rate = max(c["matmul_tflops"] for c in calls)
    rows = [r for c in calls for r in c["rows"]]
    lines = [f"bf16 matmul rate (measured, highest of the call): {rate:.0f} TFLOP/s"]
    w = max([6, *(len(r["engine"]) for r in rows)])
    lines.append(
        f"{'size':>8} {'engine':<{w}} {'step ms':>8} {'MFU%':>5} {'peak GiB':>8} {'x best peer':>11}  best peer"
    )
    for size in dict.fromkeys(r["size"] for r in rows):
        ok = [r for r in rows if r["size"] == size and "error" not in r]
        best = {
            False: min((r for r in ok if r["engine"] in PEERS), key=lambda r: r["step_ms"], default=None),
            True: min(
                (r for r in ok if r["engine"] in OFFLOAD_PEERS), key=lambda r: r["step_ms"], default=None
            ),
        }
        for r in (r for r in rows if r["size"] == size):
            if "error" in r:
                lines.append(f"{size:>8} {r['engine']:<{w}} FAILED: {r['error'][:60]}")
                continue
            ref = best["-off" in r["engine"]]
            tflops = r["tokens_per_step"] / (r["step_ms"] / 1e3) * r["flops_per_token"] / 1e12
            ratio = f"{r['step_ms'] / ref['step_ms']:.3f}x" if ref else "-"
            lines.append(
                f"{size:>8} {r['engine']:<{w}} {r['step_ms']:8.1f} {100 * tflops / rate:5.1f} "
                f"{r['peak_gib']:8.2f} {ratio:>11}  {ref['engine'] if ref else '-'}"
            )
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--one", help="run one configuration and print its RESULT line")
    p.add_argument(
        "--model",
        default="gpt",
        choices=["gpt", *HF_MODELS],
        help="gpt: the built-in GPT at --sizes; hf-llama-1b: transformers' Llama (recipes/hf-llama-1b.yaml's shape)",
    )
    p.add_argument("--engines", default="all", help=f"comma list of: {', '.join(ENGINES)}")
    p.add_argument("--size", default="350m")
    p.add_argument("--sizes", default="350m,1.3b")
    p.add_argument("--steps", type=int, default=10, help="timed steps (median reported)")
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--seq-len", type=int, default=2048)
    p.add_argument("--micro-batch", type=int, default=8)
    p.add_argument("--timeout", type=int, default=300, help="seconds per configuration")
    p.add_argument("--all-offload", action="store_true", help="also run peers' offload at every size")
    p.add_argument("--json-out")
    p.add_argument(
        "--summary",
        nargs="+",
        metavar="JSON",
        help="print one table of ratios against the best peer over these --json-out files of one call, and exit",
    )
    args = p.parse_args()
    if args.summary:
        calls = []
        for path in args.summary:
            with open(path) as f:
                calls.append(json.load(f))
        print(summary_table(calls))
    elif args.one:
        print_result(
            run_one(args.one, args.size, args.steps, args.warmup, args.seq_len, args.micro_batch, args.model)
        )
    else:
        drive(args)


if __name__ == "__main__":
    main()
