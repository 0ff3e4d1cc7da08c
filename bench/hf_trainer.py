"""The Hugging Face Trainer on three engines, and zerolaunch's bare engine, on one GPU: step time and peak memory.

    PYTHONPATH=$PWD python bench/hf_trainer.py [--stages 2 3] [--steps 20] [--warmup 5]
    PYTHONPATH=$PWD python bench/hf_trainer.py --tiny --cpu          # a smoke run (tests/unit/test_bench_hf_trainer.py)

Rows, each in its own process (world size 1, torchrun's variables set here), the same model, batches and seed:
- trainer-zl:   `from zerolaunch.hf import Trainer, TrainingArguments`, deepspeed={"zero_optimization": {stage}}
- trainer-ds:   transformers' Trainer + DeepSpeed (the same ds_config), when DeepSpeed is installed
- trainer-fsdp2: transformers' Trainer + accelerate's FSDP2 (stage 2: reshard_after_forward false, 3: true)
- bare-zl:      the same engine options driven by hand: engine(**batch).loss, backward, step (no Trainer)
The model is recipes/hf-llama-1b.yaml's Llama (random init from the config, sdpa, no download), bf16 with fp32
master weights, AdamW (the Trainer's adamw_torch_fused; no optimizer block, so every engine steps the
Trainer's choice), micro batch --batch at seq --seq, labels = input_ids, no accumulation. A row's step time is
the median of per-step wall times after --warmup steps (a synchronize at each step's start and end), its
memory the peak allocated over the timed steps. The table adds zl / ds and zl / fsdp2 step-time ratios and
the Trainer's overhead over the bare engine. A measurement, not a test; --tiny --cpu only checks it runs.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
from _row_process import LLAMA_1B, TINY_LLAMA, one_rank_torchrun_env

REPO = Path(__file__).resolve().parent.parent
ROWS = ("trainer-zl", "trainer-ds", "trainer-fsdp2", "bare-zl")
TINY = {"model_type": "llama", **TINY_LLAMA, "max_position_embeddings": 128, "tie_word_embeddings": False}


def llama_config(tiny: bool) -> dict:
    return dict(TINY if tiny else LLAMA_1B)


def build_model(config: dict, cpu: bool):
    from transformers import AutoConfig, AutoModelForCausalLM

    torch.manual_seed(0)
    kind = config.pop("model_type")
    cfg = AutoConfig.for_model(kind, **config)
    return AutoModelForCausalLM.from_config(cfg, attn_implementation="sdpa" if not cpu else "eager")


class Batches(torch.utils.data.Dataset):
    def __init__(self, n: int, seq: int, vocab: int):
        g = torch.Generator().manual_seed(1)
        self.ids = torch.randint(0, vocab, (n, seq), generator=g)

    def __len__(self):
        return len(self.ids)

    def __getitem__(self, i):
        return {"input_ids": self.ids[i], "labels": self.ids[i]}


class Timer:
    """Per-step wall times (synchronized) and the peak allocated memory over the steps after warm-up."""

    def __init__(self, warmup: int, cuda: bool):
        self.warmup, self.cuda = warmup, cuda
        self.times: list[float] = []
        self.start = 0.0
        self.step = 0

    def begin(self):
        if self.cuda:
            torch.cuda.synchronize()
            if self.step == self.warmup:
                torch.cuda.reset_peak_memory_stats()
        self.start = time.perf_counter()

    def end(self):
        if self.cuda:
            torch.cuda.synchronize()
        if self.step >= self.warmup:
            self.times.append(time.perf_counter() - self.start)
        self.step += 1

    def result(self) -> dict:
        peak = torch.cuda.max_memory_allocated() / 2**30 if self.cuda else None
        return {
            "step_ms": 1e3 * statistics.median(self.times),
            "peak_gib": peak,
            "timed_steps": len(self.times),
        }


def trainer_row(row: str, stage: int, opts) -> dict:
    from transformers import TrainerCallback

    cuda = not opts.cpu
    config = llama_config(opts.tiny)
    common = dict(
        output_dir=tempfile.mkdtemp(),
        per_device_train_batch_size=opts.batch,
        max_steps=opts.warmup + opts.steps,
        learning_rate=1e-4,
        bf16=True,
        logging_steps=10**6,
        save_strategy="no",
        report_to=[],
        use_cpu=opts.cpu,
        disable_tqdm=True,
        dataloader_num_workers=0,
        optim="adamw_torch_fused" if cuda else "adamw_torch",
    )
    ds = {
        "zero_optimization": {"stage": stage},
        "bf16": {"enabled": "auto"},
        "train_micro_batch_size_per_gpu": "auto",
        "gradient_accumulation_steps": "auto",
        "gradient_clipping": "auto",
    }
    if row == "trainer-zl":
        from zerolaunch.hf import Trainer, TrainingArguments

        args = TrainingArguments(**common, deepspeed=ds)
    elif row == "trainer-ds":
        from transformers import Trainer, TrainingArguments

        args = TrainingArguments(**common, deepspeed=ds)
    else:
        from transformers import Trainer, TrainingArguments

        layer = "LlamaDecoderLayer"
        fsdp_config = {
            "fsdp_version": 2,
            "transformer_layer_cls_to_wrap": [layer],
            "reshard_after_forward": stage == 3,
        }
        args = TrainingArguments(**common, fsdp="full_shard auto_wrap", fsdp_config=fsdp_config)
    model = build_model(config, opts.cpu)
    timer = Timer(opts.warmup, cuda)

    class Timing(TrainerCallback):
        def on_step_begin(self, *a, **k):
            timer.begin()

        def on_step_end(self, *a, **k):
            timer.end()

    data = Batches(opts.batch * (opts.warmup + opts.steps), opts.seq, config["vocab_size"])
    trainer = Trainer(model=model, args=args, train_dataset=data, callbacks=[Timing()])
    out = trainer.train()
    return {**timer.result(), "loss": out.training_loss}


def bare_row(stage: int, opts) -> dict:
    """The engine trainer-zl builds, driven by hand: what the Trainer adds is the difference."""
    from zerolaunch.build import build_engine
    from zerolaunch.config import load_recipe

    cuda = not opts.cpu
    device = torch.device("cuda", 0) if cuda else torch.device("cpu")
    config = llama_config(opts.tiny)
    model = build_model(dict(config), opts.cpu)
    ds = {
        "zero_optimization": {"stage": stage},
        "bf16": {"enabled": True},
        "gradient_clipping": 1.0,
        "optimizer": {"type": "AdamW", "params": {"lr": 1e-4, "weight_decay": 0.0}},
    }
    options = load_recipe(ds).engine
    engine = build_engine(model, options, device=device)
    data = Batches(opts.batch * (opts.warmup + opts.steps), opts.seq, config["vocab_size"])
    batches = [
        {
            k: torch.stack([data[i][k] for i in range(j, j + opts.batch)]).to(device)
            for k in ("input_ids", "labels")
        }
        for j in range(0, len(data), opts.batch)
    ]
    timer = Timer(opts.warmup, cuda)
    losses = []
    for batch in batches:
        timer.begin()
        loss = engine(**batch).loss
        engine.backward(loss)
        engine.step()
        timer.end()
        losses.append(loss.item())
    return {**timer.result(), "loss": statistics.mean(losses)}


def worker(opts) -> None:
    import torch.distributed as dist

    if not opts.cpu:
        torch.cuda.set_device(0)
    if opts.row == "bare-zl":
        dist.init_process_group("gloo" if opts.cpu else "nccl")
        result = bare_row(opts.stage, opts)
    else:
        result = trainer_row(opts.row, opts.stage, opts)
    result.update(row=opts.row, stage=opts.stage)
    Path(opts.out).write_text(json.dumps(result))
    if dist.is_initialized():
        dist.destroy_process_group()


def _port() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return str(s.getsockname()[1])


def run_row(row: str, stage: int, opts, forward: list[str]) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "row.json"
        env = dict(
            os.environ,
            **one_rank_torchrun_env(port=_port()),
            # the repo first, then the caller's path (a --target folder of carried wheels such as DeepSpeed)
            PYTHONPATH=os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH", "")) if p),
        )
        if opts.cpu:
            env.update(DS_ACCELERATOR="cpu", OMP_NUM_THREADS=env.get("OMP_NUM_THREADS", "1"))
        cmd = [
            sys.executable,
            __file__,
            *forward,
            "--worker",
            "--row",
            row,
            "--stage",
            str(stage),
            "--out",
            str(out),
        ]
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=opts.timeout)
        if proc.returncode != 0 or not out.is_file():
            tail = (proc.stdout + proc.stderr).strip().splitlines()[-6:]
            return {"row": row, "stage": stage, "error": " | ".join(tail)[-400:]}
        return json.loads(out.read_text())


def table(results: list[dict]) -> str:
    lines = [f"{'stage':>5}  {'row':<14}{'step ms':>10}{'peak GiB':>10}{'loss':>9}  note"]
    for stage in sorted({r["stage"] for r in results}):
        rows = {r["row"]: r for r in results if r["stage"] == stage}
        for name, r in rows.items():
            if "error" in r:
                lines.append(f"{stage:>5}  {name:<14}{'-':>10}{'-':>10}{'-':>9}  failed: {r['error']}")
                continue
            peak = "-" if r["peak_gib"] is None else f"{r['peak_gib']:.2f}"
            lines.append(f"{stage:>5}  {name:<14}{r['step_ms']:>10.1f}{peak:>10}{r['loss']:>9.4f}")
        zl = rows.get("trainer-zl", {}).get("step_ms")
        notes = []
        for peer, label in (("trainer-ds", "zl/ds"), ("trainer-fsdp2", "zl/fsdp2")):
            if zl and rows.get(peer, {}).get("step_ms"):
                notes.append(f"{label} {zl / rows[peer]['step_ms']:.3f}x")
        bare = rows.get("bare-zl", {}).get("step_ms")
        if zl and bare:
            notes.append(f"Trainer overhead over the bare engine {100 * (zl / bare - 1):+.1f}%")
        if notes:
            lines.append(f"{stage:>5}  " + ", ".join(notes))
    return "\n".join(lines)


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--stages", type=int, nargs="+", default=[2, 3])
    p.add_argument("--rows", default=",".join(ROWS), help=f"comma-separated subset of {','.join(ROWS)}")
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--seq", type=int, default=2048)
    p.add_argument("--tiny", action="store_true", help="a 2-layer Llama instead of the 1B shape")
    p.add_argument(
        "--cpu", action="store_true", help="run on the CPU (gloo): a smoke run, no timing worth reading"
    )
    p.add_argument("--timeout", type=float, default=1800)
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--row", help=argparse.SUPPRESS)
    p.add_argument("--stage", type=int, help=argparse.SUPPRESS)
    p.add_argument("--out", help=argparse.SUPPRESS)
    opts = p.parse_args(argv)
    if opts.worker:
        return worker(opts)
    rows = [r for r in opts.rows.split(",") if r]
    unknown = sorted(set(rows) - set(ROWS))
    if unknown:
        p.error(f"unknown rows {unknown}; choose from {','.join(ROWS)}")
    forward = (
        [
            "--steps",
            str(opts.steps),
            "--warmup",
            str(opts.warmup),
            "--batch",
            str(opts.batch),
            "--seq",
            str(opts.seq),
        ]
        + (["--tiny"] if opts.tiny else [])
        + (["--cpu"] if opts.cpu else [])
    )
    results = [run_row(row, stage, opts, forward) for stage in opts.stages for row in rows]
    print(table(results), flush=True)


if __name__ == "__main__":
    main()
