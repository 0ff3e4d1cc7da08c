"""zerolaunch as a library. Run: `torchrun --nproc-per-node 2 examples/my_train.py --config recipe.yaml`, or
`zerolaunch train recipe.yaml` with `entrypoint: examples/my_train.py` (no --config: the run's recipe)."""

import argparse

import torch

import zerolaunch

parser = argparse.ArgumentParser()
parser.add_argument("--config", help="recipe / ds_config file; default: the zerolaunch train recipe")
parser.add_argument("--steps", type=int, default=30)
parser.add_argument("--save", help="checkpoint folder written at the end")
args = parser.parse_args()

torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Embedding(256, 64), torch.nn.Linear(64, 256))  # a bigram LM
engine = zerolaunch.initialize(model, args.config)  # starts the process group under torchrun
g = torch.Generator().manual_seed(engine.rank)  # each rank its own data
for step in range(args.steps):
    tokens = (torch.randint(0, 256, (8, 1), generator=g) + torch.arange(33)) % 256  # next = this + 1
    logits = engine(tokens[:, :-1])  # (B, T, 256)
    loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), tokens[:, 1:].flatten().to(logits.device))
    engine.backward(loss)
    engine.step()
    if engine.rank == 0:
        print(f"step {step} loss {loss.item():.4f}", flush=True)
if args.save:
    engine.save_checkpoint(args.save)
