"""Which parameters the engine manages, and how they split into optimizer param groups.

This module owns three pure decisions: every parameter counted once (tied weights: the first registered name
wins, later names are recorded as aliases); the default grouping (one group of every trainable param, all
decayed, as DeepSpeed does with `model.parameters()`; or nanoGPT's split, decay on 2+ dims only, when
`decay_1d` is off); and the client's own groups (DeepSpeed's `model_parameters`: params or dicts with
`params` and any of lr, weight_decay, betas, eps, name). Frozen params are in no group. It allocates
nothing and knows no layout. The default grouping rule itself is plan.py's, torch-free, so that
estimate-memory groups params the same way.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
from torch import nn

from .plan import DECAY_GROUP, default_group, default_num_groups

GROUP_OPTION_KEYS = ("lr", "weight_decay", "betas", "eps", "name")
"""What a client's group dict may set besides `params` (DeepSpeed's / torch's per-group options)."""


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
    biases); callers keep both so group indices (plan.DECAY_GROUP, plan.NO_DECAY_GROUP) mean the same everywhere.
    """
    return default_groups(named_params, weight_decay, decay_1d=False)


def _group(names, params, weight_decay: float, **extra) -> dict:
    return {"names": list(names), "params": list(params), "weight_decay": float(weight_decay), **extra}


def default_groups(
    named_params: list[tuple[str, torch.Tensor]], weight_decay: float, decay_1d: bool
) -> list[dict]:
    """decay_1d: one group of every trainable param, all decayed (DeepSpeed's `model.parameters()`);
    otherwise split_decay_groups' two groups. The rule is plan.default_group's (estimate-memory's too)."""
    if weight_decay < 0:
        raise ValueError(f"optimizer.weight_decay must be >= 0, got {weight_decay}; use 0 to turn decay off")
    groups = [
        _group([], [], weight_decay if g == DECAY_GROUP else 0.0) for g in range(default_num_groups(decay_1d))
    ]
    for name, param in named_params:
        if param.requires_grad:
            target = groups[default_group(param.dim(), decay_1d)]
            target["names"].append(name)
            target["params"].append(param)
    return groups


def client_groups(
    named_params: list[tuple[str, torch.Tensor]], model_parameters: Iterable, weight_decay: float
) -> list[dict]:
    """The optimizer's groups from DeepSpeed-style `model_parameters`, in the client's order.

    An iterable of params is one group; an iterable of dicts is one group each (`params`: a param or an
    iterable of them; lr / weight_decay / betas / eps / name as torch's param groups; unset ones take the
    optimizer's). Frozen params are dropped (DeepSpeed's ZeRO does the same). Every trainable param of the
    model must be in exactly one group: a trainable param no group holds would get grads and never step.
    """
    name_of = {id(p): n for n, p in named_params}
    items = list(model_parameters)
    if not items:
        raise ValueError("model_parameters is empty; pass model.parameters() or a list of param group dicts")
    if all(isinstance(i, dict) for i in items):
        raw_groups = items
    elif any(isinstance(i, dict) for i in items):
        raise ValueError("model_parameters mixes params and group dicts; give all params or all dicts")
    else:
        raw_groups = [{"params": items}]
    groups, seen = [], {}
    for g, raw in enumerate(raw_groups):
        unknown = sorted(set(raw) - {"params", *GROUP_OPTION_KEYS})
        if "params" not in raw:
            raise ValueError(f"model_parameters group {g} has no 'params' key")
        if unknown:
            raise ValueError(
                f"model_parameters group {g}: unknown key(s) {unknown}; a group may set params and "
                f"{', '.join(GROUP_OPTION_KEYS)}"
            )
        params = raw["params"]
        params = [params] if torch.is_tensor(params) else list(params)
        names = []
        for p in params:
            if id(p) not in name_of:
                raise ValueError(
                    f"model_parameters group {g} holds a tensor that is not a parameter of the model"
                )
            name = name_of[id(p)]
            if name in seen:
                raise ValueError(
                    f"model_parameters: {name} is in group {seen[name]} and group {g}; give it once"
                )
            seen[name] = g
            if p.requires_grad:
                names.append(name)
        wd = float(raw.get("weight_decay", weight_decay))
        if wd < 0:
            raise ValueError(f"model_parameters group {g}: weight_decay must be >= 0, got {wd}")
        extra = {k: raw[k] for k in ("lr", "betas", "eps", "name") if k in raw}
        if "betas" in extra:
            extra["betas"] = tuple(float(b) for b in extra["betas"])
        groups.append(_group(names, [dict(named_params)[n] for n in names], wd, **extra))
    missing = [n for n, p in named_params if p.requires_grad and n not in seen]
    if missing:
        raise ValueError(
            f"model_parameters leaves out {len(missing)} trainable param(s), e.g. {missing[:3]}; add them to a "
            "group, or set requires_grad=False on the ones that should not train"
        )
    return groups


def optimizer_groups(
    named_params: list[tuple[str, torch.Tensor]],
    weight_decay: float,
    decay_1d: bool,
    param_groups: list[dict] | None = None,
) -> list[dict]:
    """The engine's groups: the client's (`param_groups` from client_groups, re-bound to these params by
    name: the engine may have moved the model) or the default ones."""
    if param_groups is None:
        return default_groups(named_params, weight_decay, decay_1d)
    by_name = dict(named_params)
    return [{**g, "params": [by_name[n] for n in g["names"]]} for g in param_groups]
