"""Typed reads of the raw recipe tree, recording where each resolved value came from.

`Resolver` turns raw values into checked Python values (an int that is an int, an lr that is > 0), raises
`RecipeError` naming the dotted key, its file/line or --set flag, the bad value and the fix, and fills the
`origins` / `notes` maps that the recipe table shows. It knows nothing of which keys exist (schema.py,
deepspeed.py) or how "auto" is computed (auto.py passes the computation in).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from .errors import RecipeError
from .tree import MISSING, Path, RawTree

AUTO = "auto"
DS: Path = ("deepspeed",)


class Resolver:
    def __init__(self, tree: RawTree, world_size: int) -> None:
        self.tree = tree
        self.world_size = world_size
        self.origins: dict[str, str] = {}
        self.notes: dict[str, str] = {}
        self.paths: dict[str, Path] = {}
        """Output key -> the tree path its value was read from, for keys the user wrote (engine option
        problems are reported at that path: the recipe key or the DeepSpeed key as written)."""

    # ---- raw access -------------------------------------------------------------------------------------
    def raw(self, path: Path) -> Any:
        return self.tree.get(path)

    def given(self, path: Path) -> bool:
        """Present with a concrete value (not missing, not "auto")."""
        value = self.raw(path)
        return value is not MISSING and value != AUTO

    def is_auto(self, path: Path) -> bool:
        return self.raw(path) == AUTO

    def where(self, path: Path) -> str:
        return self.tree.where(path)

    def record(self, key: str, origin: str, note: str | None = None) -> None:
        self.origins[key] = origin
        if note:
            self.notes[key] = note

    def fail(self, path: Path, problem: str, fix: str) -> RecipeError:
        end = "" if fix.endswith(".") else "."
        return RecipeError(f"{self.where(path)}: `{self.tree.key(path)}` {problem}. {fix}{end}")

    # ---- typed conversion ---------------------------------------------------------------------------------
    def convert(self, path: Path, value: Any, kind: str, **limits: Any) -> Any:
        if value == AUTO:
            raise self.fail(
                path,
                'is "auto", which zerolaunch cannot resolve for this key',
                'Give a value; "auto" is resolved for batch sizes, lr, betas, eps, weight_decay, '
                "gradient_clipping, bf16/fp16.enabled, warmup/total steps and the three bucket sizes",
            )
        check = _CONVERTERS[kind]
        result = check(self, path, value, limits)
        if isinstance(result, tuple):  # a list: the limits hold for each item (one per param group)
            for i, item in enumerate(result):
                broken = limit_problem(item, limits)
                if broken is not None:
                    need, _ = broken
                    raise self.fail(
                        path,
                        f"item {i} must be {need} (got {value[i]!r} in {list(value)!r})",
                        f"Give each param group a value {need}",
                    )
            return result
        broken = limit_problem(result, limits)
        if broken is not None:
            need, fix = broken
            raise self.fail(path, f"must be {need} (got {value!r})", fix)
        return result

    def value(
        self,
        key: str,
        path: Path,
        kind: str,
        default: Any,
        *,
        auto: Callable[[], tuple[Any, str]] | None = None,
        default_note: str | None = None,
        **limits: Any,
    ) -> Any:
        """The checked value at `path` (or `default`), recording its origin under output key `key`."""
        raw = self.raw(path)
        if raw is MISSING:
            self.record(key, "default", default_note)
            return default
        self.paths[key] = path
        if raw == AUTO and auto is not None:
            resolved, note = auto()
            self.record(key, "auto", f"auto: {note}")
            return resolved
        result = self.convert(path, raw, kind, **limits)
        self.record(key, self.tree.origin(path))
        return result


def limit_problem(result: float, limits: dict) -> tuple[str, str] | None:
    """(what the value must be, the fix) when `result` breaks the min / max / gt limits, else None."""
    low, high, gt = limits.get("min"), limits.get("max"), limits.get("gt")
    if low is not None and high is not None and not low <= result <= high:
        return f"between {low} and {high}", f"Use a value from {low} to {high}"
    if gt is not None and not result > gt:
        return f"> {gt}", "Use a positive value"
    if low is not None and result < low:
        return f">= {low}", f"Use a value of at least {low}"
    if high is not None and result > high:
        return f"<= {high}", f"Use a value of at most {high}"
    return None


_SAMPLES = (2**20, "2**20 = 1,048,576 samples, more than any accelerator holds in one micro-batch")
_MICRO_STEPS = (2**20, "2**20 = 1,048,576 micro-batches, past which one optimizer step would take days")
_GLOBAL = (2**30, "2**30 = 1,073,741,824 samples per optimizer step")
_STEPS = (2**40, "2**40 = 1.1e12 steps, a million steps a day for 3,000 years")
_ELEMENTS = (2**40, "2**40 = 1.1e12 elements, 4 TiB in fp32: more than any machine's memory")
_INT64 = (2**63 - 1, "2**63 - 1, the largest integer torch and the checkpoint format store")
INT_BOUNDS: dict[str, tuple[int, str]] = {
    "micro_batch_size": _SAMPLES,
    "train_micro_batch_size_per_gpu": _SAMPLES,
    "gradient_accumulation_steps": _MICRO_STEPS,
    "global_batch_size": _GLOBAL,
    "train_batch_size": _GLOBAL,
    "steps": _STEPS,
    "warmup_steps": _STEPS,
    "warmup_num_steps": _STEPS,
    "total_num_steps": _STEPS,
    "log_every": _STEPS,
    "every": _STEPS,
    "loss_scale_window": _STEPS,
    "hysteresis": _STEPS,
    "keep": (2**20, "2**20 = 1,048,576 checkpoints"),
    "buffer_count": (2**10, "1,024 staging buffers"),
    "reduce_bucket_size": _ELEMENTS,
    "stage3_prefetch_bucket_size": _ELEMENTS,
    "stage3_param_persistence_threshold": _ELEMENTS,
    "stage3_max_live_parameters": _ELEMENTS,
    "stage3_max_reuse_distance": _ELEMENTS,
}
"""The largest value each integer key may take, by key name (both spellings), and why: a bound no machine
reaches, so that 1e30 is refused here rather than hanging a run or failing inside torch. Keys not listed are
held to int64. A tighter rule of the engine's (zero/option_rules.py) still applies on top."""


def int_bound(path: Path) -> tuple[int, str]:
    return INT_BOUNDS.get(path[-1] if path else "", _INT64)


def _int(r: Resolver, path: Path, value: Any, limits: dict) -> int:
    # DeepSpeed configs write sizes as 5e8 / 2e8: integral floats are ints.
    if isinstance(value, float) and math.isfinite(value) and value.is_integer():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int):
        raise r.fail(path, f"must be an integer, got {value!r}", "Write a whole number, e.g. 8 or 5e8")
    bound, why = int_bound(path)
    if "max" not in limits and not -(2**63) <= value <= bound:
        side = "above" if value > 0 else "below"
        raise r.fail(
            path, f"is {value:.3g}, {side} the limit of {why}", f"Use a value from {-(2**63):,} to {bound:,}"
        )
    return value


MODEL_DIMS = (2**24, "2**24 = 16,777,216, past any real model's vocabulary, context, width or depth")
MODEL_DIM_NAMES = frozenset(
    "vocab_size seq_len max_seq_len block_size n_positions max_position_embeddings d_model hidden_size "
    "n_embd intermediate_size n_inner ffn_dim n_layer num_hidden_layers num_layers n_head num_attention_heads "
    "num_key_value_heads head_dim".split()
)


def check_model_dims(r: Resolver, path: Path, args: dict) -> None:
    """Size arguments of a builder (model.args, data.args, a Hugging Face model's inline config) held to
    MODEL_DIMS: the builder runs in the workers, where `vocab_size: 2**40` would fail inside torch."""
    bound, why = MODEL_DIMS
    for mapping, where in ((args, path), (args.get("config"), path + ("config",))):
        if not isinstance(mapping, dict):
            continue
        for name, value in mapping.items():
            if name not in MODEL_DIM_NAMES or isinstance(value, bool) or not isinstance(value, (int, float)):
                continue
            if not math.isfinite(value) or value > bound:
                raise r.fail(
                    where + (name,), f"is {value:.3g}, above the limit of {why}", f"Use at most {bound:,}"
                )


def _float(r: Resolver, path: Path, value: Any, limits: dict) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise r.fail(path, f"must be a number, got {value!r}", "Write a number, e.g. 3e-4")
    return float(value)


def _float_or_list(r: Resolver, path: Path, value: Any, limits: dict) -> float | tuple[float, ...]:
    """A number, or a list of numbers (one per optimizer param group, as DeepSpeed's scheduler `_format_param`
    takes them); `Resolver.convert` holds each item to the limits. The list's length is checked when the engine
    has its groups."""
    if not isinstance(value, (list, tuple)):
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            raise r.fail(
                path,
                f"must be a number or a list of numbers (one per param group), got {value!r}",
                "Write a number, e.g. 3e-4, or one per param group, e.g. [3e-4, 1e-4]",
            )
        return float(value)
    if not value:
        raise r.fail(path, "is an empty list", "Give one number per param group, or a single number for all")
    for i, v in enumerate(value):
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
            raise r.fail(
                path,
                f"must be a list of numbers (one per param group), but item {i} is {v!r} (in {list(value)!r})",
                "Write numbers only, e.g. [3e-4, 1e-4]",
            )
    return tuple(float(v) for v in value)


def _bool(r: Resolver, path: Path, value: Any, limits: dict) -> bool:
    if not isinstance(value, bool):
        raise r.fail(path, f"must be true or false, got {value!r}", "Write true or false")
    return value


def _str(r: Resolver, path: Path, value: Any, limits: dict) -> str:
    if not isinstance(value, str) or not value:
        raise r.fail(path, f"must be a non-empty string, got {value!r}", "Quote the value if needed")
    return value


def _optional_str(r: Resolver, path: Path, value: Any, limits: dict) -> str | None:
    return None if value is None else _str(r, path, value, limits)


def _choice(r: Resolver, path: Path, value: Any, limits: dict) -> str:
    choices = limits.pop("choices")
    folded = {c.lower(): c for c in choices}
    if not isinstance(value, str) or value.lower() not in folded:
        raise r.fail(
            path, f"must be one of {', '.join(choices)} (got {value!r})", f"Use one of {', '.join(choices)}"
        )
    return folded[value.lower()]


def _optional_choice(r: Resolver, path: Path, value: Any, limits: dict) -> str | None:
    return None if value is None else _choice(r, path, value, limits)


def _betas(r: Resolver, path: Path, value: Any, limits: dict) -> tuple[float, float]:
    ok = isinstance(value, (list, tuple)) and len(value) == 2
    ok = ok and all(isinstance(b, (int, float)) and not isinstance(b, bool) and 0 <= b < 1 for b in value)
    if not ok:
        raise r.fail(path, f"must be two numbers in [0, 1), got {value!r}", "Write e.g. [0.9, 0.95]")
    return (float(value[0]), float(value[1]))


def _mapping(r: Resolver, path: Path, value: Any, limits: dict) -> dict:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise r.fail(path, f"must be a mapping, got {value!r}", "Write key: value pairs under it")
    return dict(value)


def _str_list(r: Resolver, path: Path, value: Any, limits: dict) -> tuple[str, ...]:
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, (list, tuple)) or not all(isinstance(v, str) and v for v in value):
        raise r.fail(path, f"must be a list of names, got {value!r}", "Write e.g. [GPTBlock]")
    return tuple(value)


_CONVERTERS: dict[str, Callable[[Resolver, Path, Any, dict], Any]] = {
    "int": _int,
    "float": _float,
    "float_or_list": _float_or_list,
    "bool": _bool,
    "str": _str,
    "optional_str": _optional_str,
    "choice": _choice,
    "optional_choice": _optional_choice,
    "betas": _betas,
    "mapping": _mapping,
    "str_list": _str_list,
}


_GPT = "zerolaunch.models.gpt:build"
_SYNTHETIC = "zerolaunch.data.synthetic:build"
BUILTIN_ARG_KINDS: dict[str, dict[str, tuple[str, dict]]] = {
    _GPT: {
        "vocab_size": ("int", {"min": 1}),
        "seq_len": ("int", {"min": 1}),
        "n_layer": ("int", {"min": 1}),
        "n_head": ("int", {"min": 1}),
        "d_model": ("int", {"min": 1}),
        "dropout": ("float", {"min": 0.0, "max": 1.0}),
        "activation_checkpointing": ("bool", {}),
        "bias": ("bool", {}),
    },
    _SYNTHETIC: {
        "vocab_size": ("int", {"min": 1}),
        "seq_len": ("int", {"min": 1}),
        "branching": ("int", {"min": 1}),
    },
}
"""The built-in builders' arguments, checked here so that a wrong type is a recipe error at its line rather
than the builder's ValueError in the launcher's probe."""


def check_builtin_args(r: Resolver, path: Path, builder: str, args: dict, sizes: tuple[str, ...]) -> None:
    """Types and ranges of the built-in GPT's / synthetic data's args; `sizes`: the GPT's size names."""
    for name, (kind, limits) in BUILTIN_ARG_KINDS.get(builder, {}).items():
        if name in args:
            r.convert(path + (name,), args[name], kind, **limits)
    if builder == _GPT and "size" in args and args["size"] not in sizes:
        raise r.fail(
            path + ("size",),
            f"is {args['size']!r}, not a built-in GPT size",
            f"Use one of {', '.join(sizes)}",
        )
