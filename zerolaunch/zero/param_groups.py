"""Which parameters the engine manages, and how they split into optimizer param groups.

This module owns two pure decisions: every parameter counted once (tied weights: the first registered name
wins, later names are recorded as aliases) and nanoGPT's weight-decay grouping (decay tensors of 2+ dims,
none for biases / norm gains; frozen params are in no group). It allocates nothing and knows no layout.
"""

from __future__ import annotations

import torch
from torch import nn

DECAY_GROUP = 0
NO_DECAY_GROUP = 1


def collect_params(model: nn.Module) -> list[tuple[str, nn.Parameter]]:
    """(name, param) for every parameter of `model` once, in registration order (tied: first name wins)."""
    seen: set[int] = set()
    out: list[tuple[str, nn.Parameter]] = []
    for name, param in model.named_parameters(remove_duplicate=False):
        if id(param) in seen:
            continue
        seen.add(id(param))
        out.append((name, param))
    return out


def collect_aliases(model: nn.Module) -> dict[str, tuple[str, ...]]:
    """{canonical name: (alias, ...)} for parameters registered under more than one name (tied weights)."""
    first: dict[int, str] = {}
    aliases: dict[str, list[str]] = {}
    for name, param in model.named_parameters(remove_duplicate=False):
        if id(param) in first:
            aliases.setdefault(first[id(param)], []).append(name)
        else:
            first[id(param)] = name
    return {k: tuple(v) for k, v in aliases.items()}


def split_decay_groups(named_params: list[tuple[str, torch.Tensor]], weight_decay: float) -> list[dict]:
    """Two groups, always in this order: [decay (dim >= 2), no decay (dim < 2)]; frozen params excluded.

    Each group is dict(names=[...], params=[...], weight_decay=float). A group may be empty (a model with no
    biases); callers keep both so group indices (DECAY_GROUP, NO_DECAY_GROUP) mean the same everywhere.
    """
    if weight_decay < 0:
        raise ValueError(f"optimizer.weight_decay must be >= 0, got {weight_decay}; use 0 to turn decay off")
    decay = {"names": [], "params": [], "weight_decay": float(weight_decay)}
    no_decay = {"names": [], "params": [], "weight_decay": 0.0}
    for name, param in named_params:
        if not param.requires_grad:
            continue
        target = decay if param.dim() >= 2 else no_decay
        target["names"].append(name)
        target["params"].append(param)
    return [decay, no_decay]
