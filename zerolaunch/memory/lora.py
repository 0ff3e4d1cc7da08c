"""`estimate-memory --lora-rank R`: a model shape with a LoRA adapter over its linear layers (torch-free).

Owns the adapter arithmetic for a shape without a recipe (`--params`, `--model`): every parameter of the
base becomes frozen, and each targeted linear layer of shape (out, in) gains lora_A (r, in) and lora_B
(out, r), r * (in + out) trainable elements, owned by the stage-3 unit that holds the layer, in the order
PEFT's get_peft_model registers them (per layer lora_A, then lora_B). A recipe's `peft:` block is not restated
here: cli/estimate.py applies it with get_peft_model on the meta device, as the training loop does.

Targets: None stands for PEFT's "all-linear" rule (every linear layer but the output head); otherwise module
names, a layer matching when its path is the name or ends in ".name" (PEFT's rule for a list).
"""

from __future__ import annotations

import dataclasses
import difflib

from zerolaunch.memory.arch import Linear, Unit
from zerolaunch.memory.engine_layout import ParamSpec
from zerolaunch.util.sizes import EstimateError, positive_int


def lora_targets(shape, targets: tuple[str, ...] | None) -> list[Linear]:
    """The linear layers of `shape` that a LoRA adapter with these targets adapts (see the module docstring)."""
    if not shape.linears:
        raise EstimateError(
            f"--lora-rank: {shape.source} has no linear layers to adapt (a --params count below one decoder "
            "block is a single flat tensor); give a larger --params, --model or a recipe"
        )
    if targets is None:
        return [lin for lin in shape.linears if not lin.head]
    chosen = []
    for target in targets:
        hits = [lin for lin in shape.linears if lin.module == target or lin.module.endswith(f".{target}")]
        if not hits:
            leaves = sorted({lin.module.rsplit(".", 1)[-1] for lin in shape.linears})
            near = difflib.get_close_matches(target, leaves, n=1, cutoff=0.6)
            hint = f" Did you mean {near[0]}?" if near else ""
            raise EstimateError(
                f"--lora-targets: {target!r} is no linear layer of the model.{hint} Its linear layers: "
                f"{', '.join(leaves)} (or leave --lora-targets out for all of them but the output head)"
            )
        chosen += [lin for lin in hits if lin not in chosen]
    order = {lin.module: i for i, lin in enumerate(shape.linears)}
    return sorted(chosen, key=lambda lin: order[lin.module])


def _unit_index(units: tuple[Unit, ...], module: str) -> int:
    """The unit whose module subtree holds `module` (the deepest; the root unit "" otherwise)."""
    best, depth = 0, -1
    for i, unit in enumerate(units):
        if unit.name and (module == unit.name or module.startswith(unit.name + ".")):
            if len(unit.name) > depth:
                best, depth = i, len(unit.name)
    return best


def with_lora(shape, rank: int, targets: tuple[str, ...] | None = None):
    """`shape` with its parameters frozen and a rank-`rank` LoRA adapter on the targeted linear layers."""
    positive_int(rank, "--lora-rank")
    layers = lora_targets(shape, targets)
    adapter: list[ParamSpec] = []
    added: list[list[str]] = [[] for _ in shape.units]
    for lin in layers:
        a = ParamSpec(f"{lin.module}.lora_A.weight", (rank, lin.in_features))
        b = ParamSpec(f"{lin.module}.lora_B.weight", (lin.out_features, rank))
        adapter += [a, b]
        added[_unit_index(shape.units, lin.module)] += [a.name, b.name]
    units = tuple(
        dataclasses.replace(u, param_names=u.param_names + tuple(names))
        for u, names in zip(shape.units, added, strict=True)
    )
    what = "all linear layers but the output head" if targets is None else ", ".join(targets)
    source = (
        f"{shape.source}; LoRA r={rank} on {len(layers)} linear layers ({what}): "
        f"{sum(s.numel for s in adapter):,} adapter params train, the base's "
        f"{shape.numel + shape.frozen_numel:,} are frozen"
    )
    return dataclasses.replace(
        shape, specs=tuple(adapter), frozen=shape.frozen + shape.specs, units=units, source=source
    )
