"""The ranks of tests/hf/test_pretrained_memory.py: `python tests/hf/_pretrained_memory_run.py WARMUP FOLDER OUT.json`
spawns 2 CPU gloo ranks that load FOLDER the guide's way at ZeRO stage 3 (zerolaunch's TrainingArguments,
then `AutoModelForCausalLM.from_pretrained(FOLDER, dtype=torch.float32)`, then the Trainer) and train one
step, each sampling its private memory (RssAnon in /proc/self/status) on a thread every 2 ms, after the same
run of the tiny model in WARMUP. Rank 0 writes OUT.json: per rank, the rise of RssAnon over the baseline
after the warm-up run, right after from_pretrained, at its largest up to the first callback of train() (the engine is built then), and at
its largest over the step; the model's bytes, and the engine's own bytes (master, optimizer state, grads).
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import threading
from pathlib import Path

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "dist"))

import _ds_ranks  # noqa: E402
import _spawn  # noqa: E402
import torch  # noqa: E402


def private_bytes() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("RssAnon:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError("no RssAnon in /proc/self/status")


class PeakSampler:
    """The largest RssAnon since the last take(), sampled on a thread (no counterpart of VmHWM exists for it)."""

    def __init__(self):
        self.peak = private_bytes()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(0.002):
            self.peak = max(self.peak, private_bytes())

    def take(self) -> int:
        """The largest so far, this moment's included; the next period starts from now."""
        peak = max(self.peak, private_bytes())
        self.peak = private_bytes()
        return peak

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()


def train_once(folder: str, probe=None):
    """The arguments, then from_pretrained, the Trainer, one step; returns the trainer."""
    from transformers import AutoModelForCausalLM

    from zerolaunch.hf import Trainer, TrainingArguments

    args = TrainingArguments(
        output_dir=tempfile.mkdtemp(),
        per_device_train_batch_size=1,
        max_steps=1,
        learning_rate=1e-5,
        save_strategy="no",
        report_to=[],
        use_cpu=True,
        disable_tqdm=True,
        dataloader_num_workers=0,
        optim="adamw_torch",
        deepspeed={"zero_optimization": {"stage": 3}},
    )
    if probe is not None:
        probe.started()
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    if probe is not None:
        probe.loaded(model)
    vocab = model.config.vocab_size

    class Tokens(torch.utils.data.Dataset):
        def __len__(self):
            return 2

        def __getitem__(self, i):
            ids = torch.arange(16) * (i + 3) % vocab
            return {"input_ids": ids, "labels": ids}

    trainer = Trainer(
        model=model, args=args, train_dataset=Tokens(), callbacks=[] if probe is None else [probe]
    )
    trainer.train()
    return trainer


def worker(rank: int, world_size: int, store: str, warmup: str, folder: str, out: str) -> None:
    _ds_ranks.init_rank(rank, world_size, store)
    import gc

    import torch.distributed as dist
    from transformers import TrainerCallback

    # a run of a tiny model first: what any run adds once per process (imports, the Trainer's and gloo's
    # first allocations) is then in the baseline, not in the rise measured against the model's size
    train_once(warmup)
    gc.collect()
    rise = {}
    base = sampler = None

    class Probe(TrainerCallback):
        def started(self):
            # the arguments are made (a few MB of their own, in the warm-up's baseline too)
            nonlocal base, sampler
            base = private_bytes()
            sampler = PeakSampler()

        def loaded(self, model):
            rise["loaded"] = private_bytes() - base
            rise["model_bytes"] = sum(p.numel() * p.element_size() for p in model.parameters())

        def on_train_begin(self, *a, **k):
            rise["built"] = sampler.take() - base

    trainer = train_once(folder, Probe())
    rise["step"] = sampler.take() - base
    sampler.stop()
    engine = trainer.zero_engine
    owned = engine.memory_bytes()
    record = {
        **rise,
        "unit_bytes": sorted(4 * f.numel for f in engine.sharding.flats if f is not None),
        "engine_shard_bytes": owned["master"] + owned["optimizer"] + owned["grads"],
    }
    records = [None] * world_size
    dist.all_gather_object(records, record)
    if rank == 0:
        Path(out).write_text(json.dumps(records))
    from zerolaunch.zero.comm import destroy_default_group

    destroy_default_group(every_rank_finished=True)


if __name__ == "__main__":
    warmup, folder, out = sys.argv[1:4]
    _spawn.start_ranks(worker, 2, warmup, folder, out)
