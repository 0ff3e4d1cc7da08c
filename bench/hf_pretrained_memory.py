"""A pretrained model under the Trainer at ZeRO stage 3 on CPU gloo ranks: host memory per rank, three ways in.

    PYTHONPATH=$PWD OMP_NUM_THREADS=1 python bench/hf_pretrained_memory.py          # ~340M-param Llama, fp32
    PYTHONPATH=$PWD OMP_NUM_THREADS=1 python bench/hf_pretrained_memory.py --size small --world 4 --file-dtype bf16
    PYTHONPATH=$PWD python bench/hf_pretrained_memory.py --tiny                    # a smoke run (tests/unit)

A Llama built from a config (random init, seed 0, no download) is written with save_pretrained to a temporary
folder, in --file-dtype (bf16: a dtype change at load, the training dtype being fp32); then, for each way,
--world ranks (fresh processes, torchrun's variables set here, gloo) load it as fp32 and run
`from zerolaunch.hf import Trainer, TrainingArguments` at stage 3, fp32, for --steps steps:
- meta:  zerolaunch.models.hf.build(path=dir, meta=True): no weights until the engine fills each unit from the
         folder's safetensors files as it shards it (docs/hf-trainer.md).
- plain: AutoModelForCausalLM.from_pretrained(dir, dtype=fp32) before the TrainingArguments exist: transformers'
         own load, the whole model on every rank until the engine shards it.
- guide: the same call after the TrainingArguments (DeepSpeed's guide's order): under stage-3 arguments
         from_pretrained builds on meta and the engine fills the units from the files (hf/meta_load.py).
Per rank: the model's full size (parameters and buffers, as built), VmRSS / RssAnon / VmHWM from
/proc/self/status after the process group is up (base), after the model is built and after the engine is built
(the first callback of train(), where the engine exists), the process's peak RSS over the whole run (getrusage
ru_maxrss), and the largest RssAnon sampled on a thread up to the engine and over the run. RSS counts the pages
of a mapped safetensors file (page cache, shared by the ranks of a host, given back under pressure); RssAnon is
the rank's own memory. Each way's ranks are fresh processes, so peaks are not carried from one way to the
other. A measurement, not a test; --tiny only checks that it runs (tests/unit/test_bench_hf_pretrained_memory.py).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
WAYS = ("meta", "plain", "guide")
# hidden 2048 with few layers: ~340M parameters (1.35 GB fp32), the plain way's two ranks stay under ~10 GiB
FULL = dict(
    vocab_size=32000,
    hidden_size=2048,
    intermediate_size=5632,
    num_hidden_layers=4,
    num_attention_heads=16,
    num_key_value_heads=16,
    max_position_embeddings=256,
    tie_word_embeddings=False,
)
# ~117M parameters (0.44 GiB fp32): four ranks of every way fit a shared 23 GiB box
SMALL = dict(FULL, hidden_size=1024, intermediate_size=2816)
# the embeddings dominate (2 x 32000 x 256 fp32 = 65 MB): large enough that holding the model shows in RSS
# above the noise, small enough to load, shard and step in seconds
TINY = dict(
    vocab_size=32000,
    hidden_size=256,
    intermediate_size=512,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=64,
    tie_word_embeddings=False,
)


def llama(tiny: bool, size: str = "full"):
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    return LlamaForCausalLM(LlamaConfig(**(TINY if tiny else {"full": FULL, "small": SMALL}[size])))


def model_bytes(model) -> int:
    """The whole model's size as built (a meta model's tensors have their shapes and dtypes, no storage)."""
    tensors = list(model.parameters()) + list(model.buffers())
    return sum(t.numel() * t.element_size() for t in tensors)


def proc_status() -> dict:
    """VmRSS, VmHWM, RssAnon and RssFile of this process, in bytes."""
    out = {}
    for line in Path("/proc/self/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "VmHWM", "RssAnon", "RssFile"):
            out[key] = int(value.split()[0]) * 1024  # kB
    return {"rss": out["VmRSS"], "hwm": out["VmHWM"], "anon": out["RssAnon"], "file": out["RssFile"]}


class AnonSampler:
    """The largest RssAnon seen, sampled every few ms on a thread: VmHWM has no private-memory counterpart,
    and the file-backed pages of a mapped safetensors file (page cache, shared by the ranks) count in VmHWM."""

    def __init__(self, period_s: float = 0.005):
        import threading

        self.max = 0
        self.period_s = period_s
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while not self.stop.is_set():
            self.max = max(self.max, proc_status()["anon"])
            self.stop.wait(self.period_s)

    def take(self) -> int:
        """The largest so far, this moment's included."""
        self.max = max(self.max, proc_status()["anon"])
        return self.max


def worker(opts) -> None:
    import torch
    import torch.distributed as dist
    from transformers import TrainerCallback

    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    from zerolaunch.hf import Trainer, TrainingArguments

    sampler = AnonSampler()
    points = {"base": proc_status()}

    def arguments():
        return TrainingArguments(
            output_dir=tempfile.mkdtemp(),
            per_device_train_batch_size=1,
            max_steps=opts.steps,
            learning_rate=1e-5,
            logging_steps=1,
            save_strategy="no",
            report_to=[],
            use_cpu=True,
            disable_tqdm=True,
            dataloader_num_workers=0,
            optim="adamw_torch",
            deepspeed={"zero_optimization": {"stage": 3}},
        )

    args = arguments() if opts.way == "guide" else None
    if opts.way == "meta":
        from zerolaunch.models.hf import build

        model = build(path=opts.dir, meta=True, dtype="fp32")
    else:
        from transformers import AutoModelForCausalLM

        model = AutoModelForCausalLM.from_pretrained(opts.dir, dtype=torch.float32)
    points["model"] = proc_status()
    points["model"]["anonmax"] = sampler.take()
    size = model_bytes(model)
    vocab = model.config.vocab_size

    class Probe(TrainerCallback):
        def on_train_begin(self, *a, **k):
            # create_optimizer_and_scheduler built the engine before train() calls back
            assert trainer.zero_engine is not None and trainer.zero_engine.stage == 3
            points["engine"] = {**proc_status(), "anonmax": sampler.take()}

    class Data(torch.utils.data.Dataset):
        def __init__(self):
            g = torch.Generator().manual_seed(1)
            self.ids = torch.randint(0, vocab, (opts.steps * 2, opts.seq), generator=g)

        def __len__(self):
            return len(self.ids)

        def __getitem__(self, i):
            return {"input_ids": self.ids[i], "labels": self.ids[i]}

    args = args if args is not None else arguments()
    trainer = Trainer(model=model, args=args, train_dataset=Data(), callbacks=[Probe()])
    out = trainer.train()
    anon_peak = sampler.take()
    sampler.stop.set()
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # kB on Linux
    result = {
        "way": opts.way,
        "rank": rank,
        "model_bytes": size,
        **{f"{p}_{k}": v for p, d in points.items() for k, v in d.items()},
        "peak": peak,
        "anon_peak": anon_peak,
        "loss": out.training_loss,
    }
    Path(opts.out).write_text(json.dumps(result))
    from zerolaunch.zero.comm import destroy_default_group

    destroy_default_group(every_rank_finished=True)


def _port() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return str(s.getsockname()[1])


def start_way(way: str, folder: str, opts, tmp: str) -> list[tuple[subprocess.Popen, str]]:
    """The way's --world ranks as fresh processes, each with the file it writes its result to."""
    world = opts.world
    port = _port()
    ranks = []
    for rank in range(world):
        out = os.path.join(tmp, f"{way}{rank}.json")
        env = dict(
            os.environ,
            RANK=str(rank),
            LOCAL_RANK=str(rank),
            WORLD_SIZE=str(world),
            LOCAL_WORLD_SIZE=str(world),
            MASTER_ADDR="127.0.0.1",
            MASTER_PORT=port,
            OMP_NUM_THREADS="1",
            PYTHONPATH=os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH", "")) if p),
        )
        cmd = [sys.executable, __file__, "--worker", "--way", way, "--dir", folder, "--out", out]
        cmd += ["--steps", str(opts.steps), "--seq", str(opts.seq)]
        proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        ranks.append((proc, out))
    return ranks


def collect(way: str, ranks: list[tuple[subprocess.Popen, str]], timeout: float) -> list[dict]:
    """The ranks' results in rank order; any failure ends the run with that rank's output."""
    failed = []
    for rank, (proc, out) in enumerate(ranks):
        try:
            text, _ = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            for p, _ in ranks:
                p.kill()
            raise SystemExit(f"{way}: the ranks did not finish within {timeout:.0f} s") from None
        if proc.returncode != 0 or not os.path.isfile(out):
            failed.append(f"{way} rank {rank} (exit {proc.returncode}):\n{text[-3000:]}")
    if failed:
        raise SystemExit("\n".join(failed))
    return [json.loads(Path(out).read_text()) for _, out in ranks]


def table(results: list[dict]) -> str:
    gib = 2**30
    cols = (
        ("model GiB", "model_bytes"),
        ("base", "base_rss"),
        ("model", "model_rss"),
        ("m.anon", "model_anon"),
        ("engine", "engine_rss"),
        ("e.anon", "engine_anon"),
        ("e.HWM", "engine_hwm"),
        ("e.anonmax", "engine_anonmax"),
        ("peak", "peak"),
        ("anonmax", "anon_peak"),
    )
    lines = [
        "GiB per rank. base / model / engine: VmRSS once the group is up / after the model is built / after the",
        "engine is built; m.anon, e.anon: RssAnon (VmRSS less file-backed pages such as mmap'd safetensors) at",
        "those points; e.HWM: VmHWM up to the engine; peak: ru_maxrss over the run (the 2 steps included);",
        "e.anonmax, anonmax: the largest RssAnon sampled every 5 ms up to the engine / over the run.",
        f"{'way':<6}{'rank':>5}" + "".join(f"{name:>10}" for name, _ in cols),
    ]
    for r in results:
        lines.append(f"{r['way']:<6}{r['rank']:>5}" + "".join(f"{r[key] / gib:>10.3f}" for _, key in cols))
    return "\n".join(lines)


def rises(results: list[dict]) -> str:
    """Private memory (RssAnon) above the base, in % of the model's fp32 bytes: right after the load, at its
    largest up to the engine, at its largest over the run."""
    lines = [
        "% of the model's bytes per rank: RssAnon rise over base after the load / largest up to the engine /",
        "largest over the run.",
        f"{'way':<6}{'rank':>5}{'load':>8}{'build':>8}{'run':>8}",
    ]
    for r in results:
        cells = [r[k] - r["base_anon"] for k in ("model_anon", "engine_anonmax", "anon_peak")]
        lines.append(
            f"{r['way']:<6}{r['rank']:>5}" + "".join(f"{100 * c / r['model_bytes']:>7.0f}%" for c in cells)
        )
    return "\n".join(lines)


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tiny", action="store_true", help="a ~16M-param Llama instead of ~340M (a smoke run)")
    p.add_argument("--size", choices=("full", "small"), default="full", help="full ~340M, small ~117M params")
    p.add_argument("--world", type=int, default=2, help="ranks (gloo, one host)")
    p.add_argument("--file-dtype", choices=("fp32", "bf16"), default="fp32", help="the saved folder's dtype")
    p.add_argument(
        "--ways",
        default=None,
        help=f"comma-separated subset of {','.join(WAYS)} (default: all; --tiny: meta,plain)",
    )
    p.add_argument("--steps", type=int, default=2)
    p.add_argument("--seq", type=int, default=32)
    p.add_argument("--timeout", type=float, default=900)
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--way", help=argparse.SUPPRESS)
    p.add_argument("--dir", help=argparse.SUPPRESS)
    p.add_argument("--out", help=argparse.SUPPRESS)
    opts = p.parse_args(argv)
    if opts.worker:
        return worker(opts)
    ways = [w for w in (opts.ways or ("meta,plain" if opts.tiny else ",".join(WAYS))).split(",") if w]
    unknown = sorted(set(ways) - set(WAYS))
    if unknown:
        p.error(f"unknown ways {unknown}; choose from {','.join(WAYS)}")
    with tempfile.TemporaryDirectory(prefix="zl_pretrained_") as tmp:
        folder = os.path.join(tmp, "model")
        model = llama(opts.tiny, opts.size)
        n = sum(q.numel() for q in model.parameters())
        if opts.file_dtype == "bf16":
            import torch

            model = model.to(torch.bfloat16)
        model.save_pretrained(folder)
        del model
        print(
            f"Llama {n / 1e6:.1f}M parameters {opts.file_dtype} saved to {folder}, loaded as fp32; stage 3, "
            f"{opts.world} gloo ranks",
            flush=True,
        )
        if opts.tiny:
            # the ways side by side: a few MB each, and the smoke run's time is mostly the ranks' imports
            started = [(way, start_way(way, folder, opts, tmp)) for way in ways]
            results = [r for way, ranks in started for r in collect(way, ranks, opts.timeout)]
        else:
            # one way at a time: the ranks of both would not fit the memory being measured
            results = [
                r for way in ways for r in collect(way, start_way(way, folder, opts, tmp), opts.timeout)
            ]
    print(table(results), flush=True)
    print(rises(results), flush=True)


if __name__ == "__main__":
    main()
