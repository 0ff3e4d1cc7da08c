"""`python tests/hf/_hf_checkpointing.py OUT.pt`: the zerolaunch Trainer door with
TrainingArguments(gradient_checkpointing=True) against the same run without it, at ZeRO stages 0-3, on 2 CPU
gloo ranks spawned here (tests/hf/_hf_run.py's tiny Llama, data and arguments); rank 0 saves the logged
losses and grad norms, the saved weights and whether the decoder recomputed its layers."""

from __future__ import annotations

import gc
import os
import sys
import tempfile

import _hf_run
import torch
from _hf_run import _ds_ranks, _spawn


def _checkpointed_layers(model) -> int:
    """Decoder layers transformers recomputes in backward (their checkpointing flag; 0 without it)."""
    layers = [m for m in model.modules() if type(m).__name__ == "LlamaDecoderLayer"]
    return sum(bool(getattr(m, "gradient_checkpointing", False)) for m in layers)


def checkpointing(rank: int, tmp: str) -> dict:
    from zerolaunch.hf import Trainer, TrainingArguments

    results = {}
    for stage in (0, 1, 2, 3):
        for on in (False, True):
            out = os.path.join(tmp, f"stage{stage}_{on}")
            kw = _hf_run.common_args(out, deepspeed={"zero_optimization": {"stage": stage}})
            args = TrainingArguments(**kw, gradient_checkpointing=on)
            trainer = Trainer(model=_hf_run.tiny_llama(), args=args, train_dataset=_hf_run.TokenData())
            trainer.train()
            trainer.save_model(out)
            torch.distributed.barrier()
            results[(stage, on)] = {
                **_hf_run.history(trainer),
                "weights": _hf_run.read_weights(out) if rank == 0 else None,
                "checkpointed_layers": _checkpointed_layers(trainer.model),
            }
            del trainer
            gc.collect()
    return results


def worker(rank: int, world_size: int, store: str, out_path: str) -> None:
    _ds_ranks.init_rank(rank, world_size, store)
    with tempfile.TemporaryDirectory() as tmp:
        tmp = _ds_ranks.shared_tmp(rank, tmp)
        results = checkpointing(rank, tmp)
    _ds_ranks.finish(rank, results, out_path)


def run(out_dir, timeout: float = 900) -> dict:
    import subprocess

    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env = {**os.environ, "PYTHONPATH": root, "OMP_NUM_THREADS": "1", "DS_ACCELERATOR": "cpu"}
    out = os.path.join(str(out_dir), "checkpointing.pt")
    proc = subprocess.run(
        [sys.executable, os.path.abspath(__file__), out],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=timeout,
    )
    assert proc.returncode == 0, f"the checkpointing runs failed:\n{proc.stdout[-4000:]}"
    return torch.load(out, weights_only=False)


if __name__ == "__main__":
    _spawn.start_ranks(worker, 2, sys.argv[1])
