"""What the estimate needs to know about a model: its trainable parameters (name, shape, in registration
order, shared ones once), its frozen ones, its linear layers (for LoRA), its stage-3 units, DeepSpeed's
"largest layer", and, when it is a GPT-style decoder, the sizes that drive activation memory.

Owns the three ways to get one: from a real module built on the meta device (`from_module`, exact), from a
built-in GPT size (`from_gpt_size`, built on meta too) and from a bare parameter count (`synthetic_gpt`, a
GPT-shaped stand-in, torch-free). It does not do any memory arithmetic (that is `estimate.py`).
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass

from zerolaunch.memory.arch import Arch, Linear, Unit
from zerolaunch.memory.engine_layout import ParamSpec
from zerolaunch.util.sizes import EstimateError

DEFAULT_VOCAB = 50304
DEFAULT_SEQ_LEN = 1024

# GPT-3 paper shapes (n_layer, d_model, n_head): a bare --params count borrows the width of the nearest one
# and gets as many layers as fit, so the per-parameter sizes the layout sees look like a real decoder's.
_GPT3_SHAPES = (
    (12, 768, 12),
    (24, 1024, 16),
    (24, 1536, 16),
    (24, 2048, 16),
    (32, 2560, 32),
    (32, 4096, 32),
    (40, 5120, 40),
    (48, 6144, 48),
    (64, 8192, 64),
    (96, 12288, 96),
)


@dataclass(frozen=True)
class ModelShape:
    specs: tuple[ParamSpec, ...]
    """Trainable parameters in registration order (a shared parameter appears once)."""
    units: tuple[Unit, ...]
    """Stage-3 units in forward order; the root unit ("") first."""
    largest_layer_numel: int
    """DeepSpeed's largest layer: max over modules of their own (non-recursive) parameter elements."""
    frozen: tuple[ParamSpec, ...]
    """Frozen floating-point parameters (requires_grad False: a LoRA base) in registration order: whole in
    the compute dtype at stages 0-2, sharded in their unit at stage 3 (resident under the persistence
    threshold), as the engine keeps them."""
    arch: Arch | None
    """None when the model is not recognizably a GPT-style decoder: activations are then not estimated."""
    source: str
    """Where the shape came from, shown above the table."""
    exact: bool
    """False for a --params stand-in: totals are exact, the split into tensors is assumed."""
    frozen_fixed_bytes: int = 0
    """Bytes of frozen non-floating-point parameters: never cast, never sharded (whole on every rank)."""
    linears: tuple[Linear, ...] = ()
    """The linear layers, in module order (what `--lora-rank` adapts: memory/lora.py)."""

    @property
    def numel(self) -> int:
        """Trainable elements."""
        return sum(s.numel for s in self.specs)

    @property
    def frozen_numel(self) -> int:
        """Frozen floating-point elements."""
        return sum(s.numel for s in self.frozen)

    def unit_specs(self, unit: Unit) -> list[ParamSpec]:
        """The unit's trainable params."""
        by_name = {s.name: s for s in self.specs}
        return [by_name[n] for n in unit.param_names if n in by_name]

    def unit_frozen_specs(self, unit: Unit) -> list[ParamSpec]:
        """The unit's frozen floating-point params."""
        by_name = {s.name: s for s in self.frozen}
        return [by_name[n] for n in unit.param_names if n in by_name]


def _gpt_params(n_layer: int, d_model: int, vocab: int, seq_len: int, d_ff: int) -> list[tuple[str, tuple]]:
    """Parameter names and shapes of zerolaunch/models/gpt.py's decoder (tied lm_head, biases, pre-LN)."""
    t = "transformer."
    out: list[tuple[str, tuple]] = [
        (t + "wte.weight", (vocab, d_model)),
        (t + "wpe.weight", (seq_len, d_model)),
    ]
    for i in range(n_layer):
        p = f"{t}h.{i}."
        out += [
            (p + "ln_1.weight", (d_model,)),
            (p + "ln_1.bias", (d_model,)),
            (p + "attn.qkv.weight", (3 * d_model, d_model)),
            (p + "attn.qkv.bias", (3 * d_model,)),
            (p + "attn.proj.weight", (d_model, d_model)),
            (p + "attn.proj.bias", (d_model,)),
            (p + "ln_2.weight", (d_model,)),
            (p + "ln_2.bias", (d_model,)),
            (p + "mlp.fc.weight", (d_ff, d_model)),
            (p + "mlp.fc.bias", (d_ff,)),
            (p + "mlp.proj.weight", (d_model, d_ff)),
            (p + "mlp.proj.bias", (d_model,)),
        ]
    out += [(t + "ln_f.weight", (d_model,)), (t + "ln_f.bias", (d_model,))]
    return out


def synthetic_gpt(
    total_params: int, vocab_size: int = DEFAULT_VOCAB, seq_len: int = DEFAULT_SEQ_LEN
) -> ModelShape:
    """A GPT-shaped stand-in with exactly `total_params` trainable elements (torch-free).

    The width comes from the GPT-3 shape whose size is nearest, the depth is as many blocks as fit, and the
    remainder (less than one block) becomes extra position rows and a small 1-D tensor, so the count is exact.
    """
    if total_params < 1:
        raise EstimateError(f"--params must be >= 1, got {total_params}")

    def size(n_layer, d):
        return vocab_size * d + seq_len * d + n_layer * (12 * d * d + 13 * d) + 2 * d

    n_layer, d_model, n_head = min(_GPT3_SHAPES, key=lambda s: abs(size(s[0], s[1]) - total_params))
    while d_model > 64 and size(1, d_model) > total_params:
        d_model, n_head = d_model // 2, max(1, n_head // 2)
    if size(1, d_model) > total_params:
        # Too small for any decoder: one flat tensor, no activation estimate.
        spec = ParamSpec("params", (total_params,))
        return ModelShape(
            (spec,),
            (Unit("", ("params",)),),
            total_params,
            (),
            None,
            f"{total_params:,} params as one tensor (assumed)",
            False,
        )
    block = 12 * d_model * d_model + 13 * d_model
    n_layer = (total_params - size(0, d_model)) // block
    # The remainder (< one block) becomes extra rows of the position table, and what is left (< d_model) a
    # small 1-D tensor: no artificial large tensor changes the bucket plan.
    rest = total_params - size(n_layer, d_model)
    named = _gpt_params(n_layer, d_model, vocab_size, seq_len + rest // d_model, 4 * d_model)
    if rest % d_model:
        named.append(("rest", (rest % d_model,)))
    specs = tuple(ParamSpec(n, s) for n, s in named)
    in_block = "transformer.h."
    units = [Unit("", tuple(n for n, _ in named if not n.startswith(in_block)))]
    units += [
        Unit(f"{in_block}{i}", tuple(n for n, _ in named if n.startswith(f"{in_block}{i}.")))
        for i in range(n_layer)
    ]
    largest = max(
        vocab_size * d_model, 4 * d_model * d_model + 4 * d_model, (seq_len + rest // d_model) * d_model
    )
    arch = Arch(n_layer, d_model, n_head, vocab_size, 4 * d_model)
    source = (
        f"{total_params:,} params, shape assumed GPT-like: n_layer={n_layer} d_model={d_model} "
        f"n_head={n_head} vocab={vocab_size} (pass a recipe for exact tensors)"
    )
    d_ff = 4 * d_model
    sizes = {"attn.qkv": (d_model, 3 * d_model), "attn.proj": (d_model, d_model)}
    sizes |= {"mlp.fc": (d_model, d_ff), "mlp.proj": (d_ff, d_model)}
    linears = tuple(
        Linear(f"{in_block}{i}.{name}", n_in, n_out)
        for i in range(n_layer)
        for name, (n_in, n_out) in sizes.items()
    )
    return ModelShape(specs, tuple(units), largest, (), arch, source, False, linears=linears)


def gpt_sizes() -> dict:
    """The built-in GPT sizes, {name: {n_layer, n_head, d_model}}."""
    from zerolaunch.models.gpt import SIZES

    return SIZES


def resolve_gpt_name(name: str) -> str:
    """'gpt-1.3b' / 'gpt-1.3B' / '1.3b' -> '1.3b'; unknown -> EstimateError with a did-you-mean."""
    sizes = gpt_sizes()
    key = name.strip().lower()
    key = key[4:] if key.startswith("gpt-") else key
    if key in sizes:
        return key
    choices = [f"gpt-{k}" for k in sizes]
    near = difflib.get_close_matches(name.strip().lower(), choices, n=1)
    hint = f" Did you mean {near[0]}?" if near else ""
    raise EstimateError(f"--model: unknown model {name!r}.{hint} Built-in models: {', '.join(choices)}")


def from_gpt_size(
    name: str,
    vocab_size: int = DEFAULT_VOCAB,
    seq_len: int = DEFAULT_SEQ_LEN,
    stage3_units: tuple[str, ...] = (),
) -> ModelShape:
    """A built-in GPT, built on the meta device with the real model code (exact tensors)."""
    from zerolaunch.models.gpt import build

    key = resolve_gpt_name(name)
    model = build_on_meta(build, {"size": key, "vocab_size": vocab_size, "seq_len": seq_len})
    return from_module(
        model, source=f"gpt-{key} (vocab {vocab_size}, seq_len {seq_len})", stage3_units=stage3_units
    )


def build_on_meta(builder, args: dict):
    """`builder(**args)` on the meta device: shapes only, no weights allocated."""
    import torch

    meta_arg = getattr(builder, "meta_arg", None)
    if meta_arg is not None:
        # the builder builds on meta itself (models/hf.py: from_pretrained must not run under
        # torch.device("meta"); with meta it builds from config.json and reads no weights)
        return builder(**args, **{meta_arg: True})
    with torch.device("meta"):
        return builder(**args)


def hf_model_on_meta(path: str):
    """An HF causal LM on meta from a config.json file or a model folder: shapes only, no weights read."""
    from pathlib import Path

    import torch

    p = Path(path)
    folder = p.parent if p.is_file() else p
    if not (folder / "config.json").is_file() or (p.is_file() and p.name != "config.json"):
        raise EstimateError(
            f"--model {path}: not a built-in name and not an HF config.json or a folder holding one"
        )
    from zerolaunch.util.hf_env import hf_offline

    hf_offline()
    try:
        import transformers
    except ImportError:
        raise EstimateError(
            f"--model {path}: reading an HF config needs transformers: pip install 'zerolaunch[hf]'"
        ) from None
    try:
        config = transformers.AutoConfig.from_pretrained(str(folder), local_files_only=True)
    except (ValueError, OSError) as exc:
        raise EstimateError(
            f"--model {path}: transformers cannot read {folder / 'config.json'}: {exc}"
        ) from None
    with torch.device("meta"):
        return transformers.AutoModelForCausalLM.from_config(config)


def from_module(model, *, source: str, stage3_units: tuple[str, ...] = ()) -> ModelShape:
    """Exact shape of a real module (typically built on meta)."""
    from zerolaunch.memory.modules import (
        detect_arch,
        detect_linears,
        detect_units,
        largest_layer_numel,
        moe_note,
    )

    specs, frozen, fixed_bytes = [], [], 0
    for name, p in model.named_parameters():  # named_parameters yields a shared tensor once
        if p.requires_grad:
            specs.append(ParamSpec(name, tuple(p.shape)))
        elif p.is_floating_point():
            frozen.append(ParamSpec(name, tuple(p.shape)))
        else:  # the engine keeps an integer tensor whole and uncast (zero/stage3/partition.py)
            fixed_bytes += p.numel() * p.element_size()
    if not specs:
        raise EstimateError(f"{source}: the model has no trainable parameters; nothing to estimate")
    units = detect_units(model, stage3_units)
    note = moe_note(model)
    source = source if note is None else f"{source}; {note}"
    return ModelShape(
        tuple(specs),
        units,
        largest_layer_numel(model),
        tuple(frozen),
        detect_arch(model),
        source,
        True,
        frozen_fixed_bytes=fixed_bytes,
        linears=detect_linears(model),
    )
