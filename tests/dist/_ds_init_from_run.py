"""Make DeepSpeed 0.19.8 checkpoints of the built-in GPT and record DeepSpeed's loss on given batches.

    python tests/dist/_ds_init_from_run.py OUT_DIR PROBES.pt

On 2 CPU gloo ranks (FileStore rendezvous), for each case of CASES (ZeRO stage, bf16): build
`zerolaunch.models.gpt:build(**GPT_ARGS)` from seed 0, train it 2 AdamW steps with DeepSpeed on per-rank
random tokens, `save_checkpoint(OUT_DIR/<case>)`, then run DeepSpeed's forward on every batch of PROBES.pt
(a list of {"input_ids", "labels"}) and record the losses. Rank 0 writes OUT_DIR/results.pt:
{case: {"losses": [float per probe], "weights": DeepSpeed's own zero_to_fp32 state dict}}. The caller starts
zerolaunch from each checkpoint with model.init_from and compares (tests/dist/test_ds_init_from.py).
"""

from __future__ import annotations

import sys
from pathlib import Path

import _ds_ranks
import _spawn
import torch

WORLD_SIZE = 2
GPT_ARGS = {"size": "tiny", "vocab_size": 64, "seq_len": 16}
CASES = {
    "zero1_fp32": (1, False),
    "zero2_fp32": (2, False),
    "zero3_fp32": (3, False),
    "zero3_bf16": (3, True),
}


def _config(stage: int, bf16: bool) -> dict:
    return {
        "train_micro_batch_size_per_gpu": 2,
        "gradient_accumulation_steps": 1,
        "optimizer": {"type": "AdamW", "params": {"lr": 0.01, "weight_decay": 0.1, "torch_adam": True}},
        "zero_optimization": {"stage": stage, "stage3_param_persistence_threshold": 0},
        "bf16": {"enabled": bf16},
        "steps_per_print": 1000,
    }


def _worker(rank: int, world_size: int, store_path: str, out_dir: str, probes_path: str) -> None:
    _ds_ranks.init_rank(rank, world_size, store_path)
    deepspeed = _ds_ranks.init_deepspeed()
    from deepspeed.utils.zero_to_fp32 import get_fp32_state_dict_from_zero_checkpoint

    from zerolaunch.models import gpt

    probes = torch.load(probes_path)
    results = {}
    for case, (stage, bf16) in CASES.items():
        torch.manual_seed(0)
        model = gpt.build(**GPT_ARGS)
        engine, *_ = deepspeed.initialize(
            model=model, model_parameters=model.parameters(), config=_config(stage, bf16)
        )
        gen = torch.Generator().manual_seed(100 + rank)
        for _ in range(2):
            ids = torch.randint(0, GPT_ARGS["vocab_size"], (2, GPT_ARGS["seq_len"]), generator=gen)
            loss = engine(input_ids=ids, labels=torch.roll(ids, -1, 1)).loss
            engine.backward(loss)
            engine.step()
        save_dir = Path(out_dir) / case
        engine.save_checkpoint(str(save_dir))
        with torch.no_grad():
            losses = [engine(**b).loss.float().item() for b in probes]
        torch.distributed.barrier()
        if rank == 0:
            weights = get_fp32_state_dict_from_zero_checkpoint(str(save_dir))
            results[case] = {"losses": losses, "weights": {k: v.clone() for k, v in weights.items()}}
        engine.destroy()
    _ds_ranks.finish(rank, results, Path(out_dir) / "results.pt")


def main(out_dir: str, probes: str) -> None:
    _spawn.start_ranks(_worker, WORLD_SIZE, out_dir, probes)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
