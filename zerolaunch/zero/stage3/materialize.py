"""Materializing a (possibly meta-device) model one stage 3 unit at a time.

This module owns the step from "a module tree whose tensors may live on the meta device" to "real tensors
on the compute device", done for one unit's region at a time so that no rank ever holds the whole model:

- the unit's sharded params become views of one fp32 buffer of the unit's size (the caller shards it and
  drops it before the next unit), its resident tensors (small params, buffers) become real
  tensors of their own;
- when the region had meta tensors, it is initialized under a seed every rank agrees on (`unit_seed`):
  `init_fn(module)` for every module of the region when given, else `reset_parameters()` of the outermost
  modules that define one (a module that defines it initializes its own subtree: GPT's Block, nn.Linear);
  tensors that were already real keep their values;
- parameters the region's modules reference but another unit owns (tied weights) get scratch storage while
  the init runs, so an init cannot write into another unit's freed buffer; the owner's init wins.

It does not shard, communicate or know about the optimizer (unit_sharding.py does).
"""

from __future__ import annotations

import torch
from torch import nn

from .partition import Unit


def param_sites(model: nn.Module) -> dict[int, list[tuple[nn.Module, str]]]:
    """id(param) -> every (module, attribute) that holds it (a tied param has several)."""
    sites: dict[int, list[tuple[nn.Module, str]]] = {}
    for module in model.modules():
        for key, p in module._parameters.items():
            if p is not None:
                sites.setdefault(id(p), []).append((module, key))
    return sites


def replace_param(sites, old: nn.Parameter, new: nn.Parameter) -> None:
    for module, key in sites.pop(id(old), []):
        module._parameters[key] = new
        sites.setdefault(id(new), []).append((module, key))


def bind(sites, param: nn.Parameter, value: torch.Tensor) -> nn.Parameter:
    """`value` becomes `param`'s data; a meta param (its data cannot be swapped) is replaced everywhere."""
    if param.is_meta:
        new = nn.Parameter(value, requires_grad=param.requires_grad)
        replace_param(sites, param, new)
        return new
    param.data = value
    return param


def unit_seed(base_seed: int, unit_index: int) -> int:
    return (base_seed + 1_000_003 * (unit_index + 1)) % (2**63)


def _init_region(unit: Unit, init_fn) -> set[int]:
    """Run the init of the unit's region; returns the ids of the modules it covered."""
    region_ids = {id(m) for _, m in unit.region}
    if init_fn is not None:
        for _, module in unit.region:
            init_fn(module)
        return region_ids
    covered: set[int] = set()
    for _, module in unit.region:
        if id(module) in covered:
            continue
        reset = getattr(module, "reset_parameters", None)
        if callable(reset):
            reset()
            covered.update(id(m) for m in module.modules() if id(m) in region_ids)
    return covered


def materialize(
    unit: Unit,
    sites,
    sharded: dict[str, torch.Tensor],
    resident_names: list[str],
    *,
    named_params: dict[str, nn.Parameter],
    device: torch.device,
    seed: int,
    init_fn=None,
    deliver: tuple[str, ...] = (),
) -> tuple[bool, dict[str, torch.Tensor]]:
    """Give every tensor of `unit`'s region real storage; returns (whether the region was initialized,
    {name: value} of the `deliver` params: tied params another unit owns whose init this unit runs).

    sharded: {name: fp32 view in the unit's init buffer} for the unit's sharded params. resident_names:
    the resident params (persistent + small frozen) whose home is this unit. `named_params` is updated in place
    when a meta param is replaced by a new Parameter.
    """
    meta_sites = [
        (path, module, kind, key)
        for path, module in unit.region
        for kind, tensors in (("parameter", module._parameters), ("buffer", module._buffers))
        for key, t in tensors.items()
        if t is not None and t.is_meta
    ]
    # a sharded param may sit outside the region (a tie the root owns): look at the named params too.
    had_meta = bool(meta_sites) or any(named_params[n].is_meta for n in [*sharded, *resident_names])
    # values that were real before an init of the region, restored after it (a partly meta model).
    keep: list[tuple[torch.Tensor, torch.Tensor]] = []
    for name, view in sharded.items():
        p = named_params[name]
        if not p.is_meta:
            view.copy_(p.detach().reshape(view.shape))
            if had_meta:
                keep.append((view, view.clone()))
        named_params[name] = bind(sites, p, view)
    for name in resident_names:
        p = named_params[name]
        if p.is_meta:
            named_params[name] = bind(sites, p, torch.empty(p.shape, dtype=p.dtype, device=device))
            continue
        if p.device != device:
            p.data = p.data.to(device)
        if had_meta:
            keep.append((p.data, p.data.clone()))
    for _, module in unit.region:
        for key, b in module._buffers.items():
            if b is None:
                continue
            if b.is_meta:
                module._buffers[key] = torch.empty(b.shape, dtype=b.dtype, device=device)
                continue
            if b.device != device:
                module._buffers[key] = b = b.to(device)
            if had_meta:
                keep.append((b, b.clone()))
    delivered: dict[str, torch.Tensor] = {}
    if had_meta:
        own = set(sharded) | set(resident_names)
        foreign = _foreign_params(unit, own, named_params)
        saved = [(p, p.data) for p in foreign]
        for p, _ in saved:
            p.data = torch.empty(p.shape, dtype=p.dtype, device=device)
        with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []), torch.no_grad():
            torch.manual_seed(seed)
            covered = _init_region(unit, init_fn)
        for name in deliver:
            delivered[name] = named_params[name].data
        for p, data in saved:
            p.data = data
        with torch.no_grad():
            for tensor, value in keep:
                tensor.copy_(value)
        _check_covered(meta_sites, covered)
    return had_meta, delivered


def _foreign_params(unit: Unit, own: set[str], named_params: dict[str, nn.Parameter]) -> list[nn.Parameter]:
    own_ids = {id(named_params[n]) for n in own}
    out, seen = [], set()
    for _, module in unit.region:
        for p in module._parameters.values():
            if p is not None and id(p) not in own_ids and id(p) not in seen and not p.is_meta:
                seen.add(id(p))
                out.append(p)
    return out


def _check_covered(meta_sites, covered: set[int]) -> None:
    for path, module, kind, key in meta_sites:
        if id(module) not in covered:
            where = f"{path}.{key}" if path else key
            raise ValueError(
                f"{kind} {where!r} ({type(module).__name__}) was built on the meta device and nothing "
                "initializes it; give the module (or an ancestor in its unit) a reset_parameters() that "
                "initializes it, or pass init_fn(module) to the stage 3 engine"
            )
