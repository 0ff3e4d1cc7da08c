"""The recipe's `peft:` block -> a checked `PeftSection` (schema.py), or None when the block is absent.

Field names and defaults are PEFT's LoraConfig's; this module checks types and ranges at the key's line, and
that peft is installed (a run that would fail in every worker is refused at load, exit 2). Which module names
exist is only known once the model is built: the launcher's preflight and the worker check that
(models/peft.py target_problem).
"""

from __future__ import annotations

import importlib.util

from .schema import PEFT_BIASES, PeftSection
from .tree import MISSING, Path
from .values import Resolver

P: Path = ("peft",)


def resolve_peft(r: Resolver, entrypoint: str | None) -> PeftSection | None:
    raw = r.raw(P)
    if raw is MISSING or raw is None:
        r.record("peft", "default", "no adapter: every weight trains")
        return None
    r.convert(P, raw, "mapping")
    if importlib.util.find_spec("peft") is None:
        raise r.fail(
            P,
            "needs the peft package, which is not installed",
            "pip install peft, or remove the `peft:` block to train every weight",
        )
    if entrypoint is not None:
        raise r.fail(
            P,
            "applies to the built-in loop's model, but `entrypoint:` runs your own script",
            "Call peft.get_peft_model in the script, or drop `entrypoint:`",
        )
    defaults = PeftSection()
    alpha = r.value("peft.lora_alpha", P + ("lora_alpha",), "float", defaults.lora_alpha, gt=0)
    return PeftSection(
        r=r.value("peft.r", P + ("r",), "int", defaults.r, min=1, max=2**24),
        lora_alpha=int(alpha) if float(alpha).is_integer() else alpha,
        lora_dropout=r.value(
            "peft.lora_dropout", P + ("lora_dropout",), "float", defaults.lora_dropout, min=0.0, max=1.0
        ),
        target_modules=_targets(r),
        bias=r.value("peft.bias", P + ("bias",), "choice", defaults.bias, choices=PEFT_BIASES),
        modules_to_save=r.value("peft.modules_to_save", P + ("modules_to_save",), "str_list", ()),
    )


def _targets(r: Resolver) -> tuple[str, ...] | str | None:
    """A list of module names, "all-linear", or absent (PEFT's default for the model type)."""
    path = P + ("target_modules",)
    raw = r.raw(path)
    if raw is MISSING or raw is None:
        r.record("peft.target_modules", "default", "PEFT's default for the model type")
        return None
    if isinstance(raw, str) and raw.lower() == "all-linear":
        r.record("peft.target_modules", r.tree.origin(path))
        return "all-linear"
    if isinstance(raw, str):
        raise r.fail(
            path,
            f"is {raw!r}: give a list of module names or all-linear",
            f"Write e.g. target_modules: [{raw}] or target_modules: all-linear",
        )
    return r.value("peft.target_modules", path, "str_list", None)
