"""One training script run by DeepSpeed and by zerolaunch: the same config, model, data and param groups.

    python tests/dist/_ds_parity_run.py {deepspeed|zerolaunch} OUT.pt

Spawns 2 CPU gloo ranks (FileStore rendezvous). Each rank trains every case of CASES (ZeRO stage x how the
param groups are passed) for STEPS steps from the same seed-0 model, and rank 0 saves
{case name: {param name: fp32 tensor}} to OUT.pt. The only lines that differ between the engines are the
`initialize` call and how the full weights are read back at the end (a DeepSpeed ZeRO-3 module holds only
shards). Needs deepspeed 0.19.8 for the deepspeed side (DS_ACCELERATOR=cpu is set here).
"""

from __future__ import annotations

import sys

import _ds_ranks
import _spawn
import torch
from torch import nn

WORLD_SIZE = 2
STEPS = 5
STAGES = (1, 2, 3)
# model_parameters: "params" = model.parameters(); "groups" = two dicts with their own decay and lr;
# "none" = not passed (zerolaunch only; DeepSpeed is given model.parameters(), its documented use).
MODES = ("params", "groups", "none")


class Net(nn.Module):
    """Awkward sizes (17, 31, 5: not divisible by the world size) and 1-D params (biases, a norm gain)."""

    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(17, 31)
        self.norm = nn.LayerNorm(31)
        self.fc2 = nn.Linear(31, 5)

    def forward(self, x, y):
        return nn.functional.mse_loss(self.fc2(torch.tanh(self.norm(self.fc1(x)))), y)


def config(stage: int) -> dict:
    return {
        "train_micro_batch_size_per_gpu": 3,
        "gradient_accumulation_steps": 1,
        "gradient_clipping": 1.0,
        "optimizer": {
            "type": "AdamW",
            "params": {
                "lr": 0.01,
                "betas": [0.9, 0.95],
                "eps": 1e-8,
                "weight_decay": 0.1,
                "torch_adam": True,
            },
        },
        "zero_optimization": {
            "stage": stage,
            "reduce_bucket_size": 200,
            "allgather_bucket_size": 200,
            "stage3_param_persistence_threshold": 0,
        },
        "steps_per_print": 1000,
    }


def model_parameters(model: Net, mode: str):
    if mode == "groups":
        decay = [p for n, p in model.named_parameters() if p.dim() >= 2]
        no_decay = [p for n, p in model.named_parameters() if p.dim() < 2]
        return [
            {"params": decay, "weight_decay": 0.3},
            {"params": no_decay, "weight_decay": 0.0, "lr": 0.02, "name": "no_decay"},
        ]
    return model.parameters()


def batch(rank: int, step: int) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(1000 * step + rank)
    return torch.randn(3, 17, generator=gen), torch.randn(3, 5, generator=gen)


def _train_case(which: str, stage: int, mode: str, deepspeed) -> dict[str, torch.Tensor]:
    rank = torch.distributed.get_rank()
    torch.manual_seed(0)
    model = Net()
    if which == "deepspeed":
        engine, *_ = deepspeed.initialize(
            model=model, model_parameters=model_parameters(model, mode), config=config(stage)
        )
    else:
        import zerolaunch

        kwargs = {} if mode == "none" else {"model_parameters": model_parameters(model, mode)}
        engine = zerolaunch.initialize(model, config(stage), device="cpu", **kwargs)
    for step in range(STEPS):
        loss = engine(*batch(rank, step))
        engine.backward(loss)
        engine.step()
    if which == "deepspeed":
        params = list(engine.module.named_parameters())
        with deepspeed.zero.GatheredParameters([p for _, p in params], enabled=stage == 3):
            return {n: p.detach().clone().float() for n, p in params}
    return {n: t.detach().clone().float() for n, t in engine.engine.iter_full_state()}


def _worker(rank: int, world_size: int, store_path: str, which: str, out: str) -> None:
    _ds_ranks.init_rank(rank, world_size, store_path)
    deepspeed = _ds_ranks.init_deepspeed() if which == "deepspeed" else None
    results = {}
    for stage in STAGES:
        for mode in MODES:
            if which == "deepspeed" and mode == "none":
                continue
            results[f"stage{stage}_{mode}"] = _train_case(which, stage, mode, deepspeed)
    _ds_ranks.finish(rank, results, out)


def main(which: str, out: str) -> None:
    _spawn.start_ranks(_worker, WORLD_SIZE, which, out)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
