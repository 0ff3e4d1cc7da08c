"""Seeding and RNG state of a worker: the same recipe seed gives the same run, and a resume continues the
same random streams.

Model init and dropout draw from torch's global generators, seeded with the recipe seed on every rank (the
engine broadcasts rank 0's weights anyway); data order is the data builder's, which gets the seed and its
rank. numpy is not used by zerolaunch and is left alone.
"""

from __future__ import annotations

import random

import torch


def seed_all(seed: int, device: torch.device) -> None:
    random.seed(seed)
    torch.manual_seed(seed)  # also seeds every CUDA device
    if device.type == "cuda":
        torch.cuda.manual_seed(seed)


def rng_state(device: torch.device) -> dict:
    """JSON + tensors, as checkpoint `extra` accepts (python's state is a tuple of ints)."""
    state = {"python": random.getstate(), "torch": torch.get_rng_state()}
    if device.type == "cuda":
        state["cuda"] = torch.cuda.get_rng_state(device)
    return state


def set_rng_state(state: dict, device: torch.device) -> None:
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    torch.set_rng_state(state["torch"].to(torch.uint8).cpu())
    if device.type == "cuda" and "cuda" in state:
        torch.cuda.set_rng_state(state["cuda"].to(torch.uint8).cpu(), device)
