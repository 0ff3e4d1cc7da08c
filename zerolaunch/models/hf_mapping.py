"""transformers' own checkpoint conversion mapping, applied one group of tensors at a time.

transformers 5 keeps some weights in memory under other names or layouts than save_pretrained writes them:
MoE experts fused into 3-D `experts.gate_up_proj` / `experts.down_proj` (per-expert `w1/w2/w3` or
`*_proj.weight` on disk), GPT-NeoX's `embed_out` called `lm_head`, and so on. `from_pretrained` applies the
mapping (`conversion_mapping.get_model_conversion_mapping`, `core_model_loading.WeightConverter` /
`WeightRenaming`) to a whole state dict; `save_pretrained` applies its reverse (`revert_weight_conversion`).

This module owns the same two passes cut into groups, so the stage 3 loader and the HF folder writers never
hold more than one group (one fused tensor and the file tensors it is built from):
- `LoadPlan`: file names -> the model's names, by transformers' `rename_source_key` (the function
  from_pretrained calls), and `LoadPlan.load(target, read)` runs the group's converter on tensors read on
  demand.
- `SavePlan`: the model's names -> save_pretrained's names, by the reversed transforms, grouped as
  `revert_weight_conversion` groups them; `SavePlan.convert(group, tensors)` runs one group.
Nothing here copies a mapping: the transforms, their regexes and their ops are transformers'. With a
transformers that has no conversion mapping (4.x), names on disk are the names in memory and both plans are
the identity.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

import torch
from torch import nn


def _core():
    """transformers.core_model_loading, or None for a transformers without conversion mappings (4.x)."""
    try:
        from transformers import core_model_loading
        from transformers.conversion_mapping import get_model_conversion_mapping  # noqa: F401
    except ImportError:
        return None
    return core_model_loading


def load_transforms(model: nn.Module) -> list:
    """The transforms from_pretrained applies to `model`'s checkpoint names (legacy renamings included)."""
    if _core() is None:
        return []
    from transformers.conversion_mapping import get_model_conversion_mapping

    return get_model_conversion_mapping(model)


def save_transforms(model: nn.Module) -> list:
    """The transforms save_pretrained reverses, chosen as `revert_weight_conversion` chooses them: those a
    `from_pretrained` used (`model._weight_conversions`), else the model's default mapping without the
    legacy renamings and without PrefixChange (a model built from a config never had the prefix)."""
    if model is None:
        return []
    core = _core()
    if core is None:
        return []
    used = getattr(model, "_weight_conversions", None)
    if used is not None:
        return list(used)
    from transformers.conversion_mapping import get_model_conversion_mapping

    transforms = get_model_conversion_mapping(model, add_legacy=False)
    return [t for t in transforms if not isinstance(t, core.PrefixChange)]


@dataclass
class Group:
    """One converter's worth of tensors: `sources` [(name, source pattern)] become `targets`."""

    first: str
    converter: object | None
    """A transformers WeightConverter template (deep-copied per use), None for a plain rename."""
    sources: list[tuple[str, str]] = field(default_factory=list)
    targets: list[str] = field(default_factory=list)


def _targets(first: str, converter) -> list[str]:
    # a one-to-many converter renames to its first target pattern; the others replace it in the same name,
    # as from_pretrained lists them when it reports unexpected keys.
    if converter is None or len(converter.target_patterns) == 1:
        return [first]
    head = converter.target_patterns[0]
    return [first.replace(head, t) for t in converter.target_patterns]


def _run(group: Group, read: Callable[[str], torch.Tensor], model: nn.Module) -> dict[str, torch.Tensor]:
    if group.converter is None:
        ((name, _),) = group.sources
        return {group.targets[0]: read(name)}
    converter = copy.deepcopy(group.converter)
    for name, pattern in group.sources:
        # a callable is read when the converter materializes its inputs (the "sync loading" path)
        converter.add_tensor(group.first, name, pattern, lambda n=name: read(n))
    out = converter.convert(group.first, model=model, config=getattr(model, "config", None))
    return {k: v[0] if isinstance(v, list) else v for k, v in out.items()}


class LoadPlan:
    """How the tensors of a save_pretrained folder become `model`'s tensors, by transformers' mapping."""

    def __init__(self, model: nn.Module, file_names: Iterable[str]):
        core = _core()
        self.model = model
        self.groups: dict[str, Group] = {}
        self.unexpected: list[str] = []
        self.transforms = load_transforms(model)
        wanted = model.state_dict()
        names = sorted(file_names, key=core.dot_natural_key) if core else list(file_names)
        if core is None:
            for name in names:
                if name in wanted:
                    self.groups[name] = Group(name, None, [(name, name)], [name])
                else:
                    self.unexpected.append(name)
            self.by_target = {name: name for name in self.groups}
            return
        renamings = [t for t in self.transforms if isinstance(t, core.WeightRenaming)]
        converters = [t for t in self.transforms if isinstance(t, core.WeightConverter)]
        by_pattern = {p: c for c in converters for p in c.source_patterns}
        prefix = getattr(model, "base_model_prefix", None)
        for name in names:
            target, pattern = core.rename_source_key(name, renamings, converters, prefix, wanted)
            if target not in wanted and name in wanted:
                # from_pretrained's fallback: a key the renamings should have left alone
                target, pattern = core.rename_source_key(name, [], [], prefix, wanted)
            if target not in wanted:
                self.unexpected.append(name)
                continue
            converter = by_pattern[pattern] if pattern is not None else None
            group = self.groups.get(target)
            if group is None:
                group = self.groups[target] = Group(target, converter, [], _targets(target, converter))
            group.sources.append((name, pattern if pattern is not None else name))
        self.by_target = {t: g.first for g in self.groups.values() for t in g.targets}

    def used_transforms(self) -> list:
        """The transforms that matched a file name: what from_pretrained keeps as `model._weight_conversions`
        (save_pretrained then reverses exactly those)."""
        return [t for t in self.transforms if t.was_used()]

    def group_of(self, target: str) -> Group | None:
        first = self.by_target.get(target)
        return None if first is None else self.groups[first]

    def load(self, group: Group, read: Callable[[str], torch.Tensor]) -> dict[str, torch.Tensor]:
        """{model name: tensor} of one group, its file tensors read by `read(file name)`."""
        return _run(group, read, self.model)


class SavePlan:
    """How `model`'s tensors (names in memory) become the tensors save_pretrained writes."""

    def __init__(self, model: nn.Module | None, names: Iterable[str]):
        """model None: a checkpoint of no known HF model, its names written as they are."""
        core = _core() if model is not None else None
        self.model = model
        self.groups: dict[str, Group] = {}
        transforms = save_transforms(model)
        if core is None or not transforms:
            for name in names:
                self.groups[name] = Group(name, None, [(name, name)], [name])
            self.by_source = {name: name for name in self.groups}
            return
        # the order revert_weight_conversion uses: reversed transforms, converters first, then renamings
        reverse = [t.reverse_transform() for t in transforms[::-1]]
        renamings = [t for t in reverse if isinstance(t, core.WeightRenaming)]
        converters = [t for t in reverse if isinstance(t, core.WeightConverter)]
        self._renamings = renamings
        by_pattern = {p: c for c in converters for p in c.source_patterns}
        for name in sorted(names, key=core.dot_natural_key):
            target, pattern = core.apply_converters(name, converters)
            converter = None
            if pattern is None:
                target = core.apply_renamings(name, renamings)
                pattern = name
            else:
                converter = by_pattern[pattern]
            group = self.groups.get(target)
            if group is None:
                group = self.groups[target] = Group(target, converter)
            group.sources.append((name, pattern))
        self.by_source = {n: g.first for g in self.groups.values() for n, _ in g.sources}

    def convert(self, group: Group, read: Callable[[str], torch.Tensor]) -> dict[str, torch.Tensor]:
        """{saved name: tensor} of one group, its in-memory tensors read by `read(name)`."""
        if group.converter is None:
            ((name, _),) = group.sources
            return {group.first: read(name)}
        out = _run(group, read, self.model)
        # a converter's outputs are named from its own patterns; the renamings apply after it
        core = _core()
        return {core.apply_renamings(k, self._renamings): v for k, v in out.items()}

    def output_shapes(self, meta: Callable[[str], torch.Tensor]) -> dict[str, torch.Tensor]:
        """{saved name: meta tensor of its shape and dtype}, in write order, from meta inputs `meta(name)`
        (the converters' ops run on meta tensors, so no data is read)."""
        out: dict[str, torch.Tensor] = {}
        for group in self.groups.values():
            for name, t in self.convert(group, meta).items():
                out[name] = t
        return out
