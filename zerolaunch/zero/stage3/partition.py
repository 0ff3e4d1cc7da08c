"""Stage 3 units: which modules are gathered as one, and which unit owns each parameter.

This module owns two pure decisions over the module tree (it allocates nothing and issues no collective):

- Unit detection. By default the children of the largest `nn.ModuleList` whose items all share one class
  (a transformer's layers) each become a unit; `ZeroOptions.stage3_units` overrides that with module class
  names or dotted module paths (outermost match wins). Everything else belongs to the root unit (index 0).
- Parameter ownership. A unit's *region* is its module subtree minus the subtrees of other units (the root's
  region is every module outside the units). A parameter used by the region of exactly one unit belongs to
  that unit; one used by several regions (tied weights) belongs to the root unit, which stays gathered for
  the whole forward and backward, so every user of the tie sees it. Frozen parameters (requires_grad
  False) are sharded in their unit like trainable ones (DeepSpeed ZeRO-3 does the same: a LoRA base or a
  reference model is never whole on a rank), kept apart so that they get no grad, master or optimizer
  state. Parameters with fewer than `persistence_threshold` elements, trainable or frozen, are not
  sharded: they stay resident on every rank.

The gather/free machinery (unit_buffers.py), materialization (materialize.py) and the engine
(unit_sharding.py) read the `Partition` built here.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from torch import nn

from ..param_groups import collect_params

ROOT = 0


@dataclass
class Unit:
    index: int
    name: str
    """Module path of the unit ("" for the root unit)."""
    module: nn.Module
    region: list[tuple[str, nn.Module]] = field(default_factory=list)
    """(path, module) of every module whose own tensors this unit materializes, in registration order."""
    params: list[tuple[str, nn.Parameter]] = field(default_factory=list)
    """The sharded trainable parameters the unit owns (canonical names), in registration order."""
    frozen: list[tuple[str, nn.Parameter]] = field(default_factory=list)
    """The sharded frozen parameters (requires_grad False) the unit owns, in registration order."""


@dataclass
class Partition:
    units: list[Unit]
    """units[0] is the root unit; the others in module registration order."""
    persistent: list[tuple[str, nn.Parameter]]
    """Trainable parameters under the persistence threshold: resident on every rank."""
    frozen: list[tuple[str, nn.Parameter]]
    """Frozen parameters (requires_grad False) under the persistence threshold, or not floating point:
    resident on every rank, never stepped."""
    home_unit: dict[str, int]
    """Canonical param name -> the unit that holds it (owner rule above)."""
    init_unit: dict[str, int]
    """Canonical param name -> the unit whose init initializes it: the owner when its region uses the
    param, else the first unit that does (a weight tied between two blocks is the root's, but the first
    block's reset_parameters initializes it)."""


def _class_keys(path: str, module: nn.Module) -> set[str]:
    cls = type(module)
    return {cls.__name__, f"{cls.__module__}.{cls.__qualname__}", path}


def find_unit_modules(model: nn.Module, unit_classes: tuple[str, ...] = ()) -> list[tuple[str, nn.Module]]:
    """(path, module) of every non-root unit, in registration order."""
    if unit_classes:
        wanted = set(unit_classes)
        found: list[tuple[str, nn.Module]] = []
        for path, module in model.named_modules():
            if module is model or any(path.startswith(p + ".") for p, _ in found):
                continue
            if _class_keys(path, module) & wanted:
                found.append((path, module))
        if not found:
            present = sorted({type(m).__name__ for m in model.modules()})
            raise ValueError(
                f"zero.stage3_units {list(unit_classes)} match no module of {type(model).__name__}; "
                f"use module class names (present: {', '.join(present)}) or dotted module paths"
            )
        return found
    best: tuple[int, str, nn.ModuleList] | None = None
    for path, module in model.named_modules():
        if not isinstance(module, nn.ModuleList) or len(module) < 2:
            continue
        if len({type(child) for child in module}) != 1:
            continue
        numel = sum(p.numel() for p in module.parameters())
        if numel > 0 and (best is None or numel > best[0]):
            best = (numel, path, module)
    if best is None:
        return []
    _, path, module_list = best
    prefix = f"{path}." if path else ""
    return [(f"{prefix}{i}", child) for i, child in enumerate(module_list)]


def _unit_of(path: str, unit_paths: list[str]) -> int:
    for i, unit_path in enumerate(unit_paths, start=1):
        if path == unit_path or path.startswith(unit_path + "."):
            return i
    return ROOT


def partition(
    model: nn.Module, unit_classes: tuple[str, ...] = (), persistence_threshold: int = 0
) -> Partition:
    """Split `model` into units and decide where every parameter lives (see the module docstring)."""
    if persistence_threshold < 0:
        raise ValueError(
            f"zero.stage3_param_persistence_threshold must be >= 0 elements, got {persistence_threshold}"
        )
    found = find_unit_modules(model, unit_classes)
    unit_paths = [p for p, _ in found]
    units = [Unit(ROOT, "", model)] + [Unit(i, p, m) for i, (p, m) in enumerate(found, start=1)]
    users: dict[int, set[int]] = {}
    for path, module in model.named_modules():
        u = _unit_of(path, unit_paths)
        units[u].region.append((path, module))
        for p in module._parameters.values():
            if p is not None:
                users.setdefault(id(p), set()).add(u)
    persistent: list[tuple[str, nn.Parameter]] = []
    frozen: list[tuple[str, nn.Parameter]] = []
    home: dict[str, int] = {}
    init: dict[str, int] = {}
    for name, p in collect_params(model):
        using = users.get(id(p), {ROOT})
        owner = next(iter(using)) if len(using) == 1 else ROOT
        home[name] = owner
        init[name] = owner if owner in using else min(using)
        if p.numel() < persistence_threshold or not p.is_floating_point():
            # an integer tensor cannot live in a float unit buffer: it stays whole (it cannot train either)
            (persistent if p.requires_grad else frozen).append((name, p))
        elif p.requires_grad:
            units[owner].params.append((name, p))
        else:
            units[owner].frozen.append((name, p))
    return Partition(units, persistent, frozen, home, init)
