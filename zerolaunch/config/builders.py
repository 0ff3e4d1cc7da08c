"""Builder strings: "pkg.module:fn" or "path/to/file.py:fn" (relative to the recipe's folder).

`check_builder_spec` validates the form (cheap, always at load); `import_builder` imports the function (user
code, possibly torch: only when asked, and in the worker). Both raise `RecipeError` with the fix.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from .errors import RecipeError

FORM = '"pkg.module:fn" or "path/to/file.py:fn"'


def split_spec(spec: Any, key: str = "builder") -> tuple[str, str]:
    if not isinstance(spec, str) or spec.count(":") != 1:
        raise RecipeError(
            f"`{key}` must be {FORM}, got {spec!r}. Name the module and the function, joined by ':'."
        )
    target, fn = spec.split(":")
    if not target or not fn.isidentifier():
        raise RecipeError(f"`{key}` must be {FORM}, got {spec!r}: `{fn}` is not a function name.")
    return target, fn


def check_builder_spec(spec: Any, base_dir: str | Path, key: str = "builder") -> None:
    """Check the form, and that a file builder's file exists (without importing anything)."""
    target, _ = split_spec(spec, key)
    if target.endswith(".py"):
        path = Path(base_dir) / target
        if not path.is_file():
            raise RecipeError(
                f"`{key}` {spec!r}: the file {path} does not exist. File builders are relative to the recipe's "
                "folder; fix the path."
            )


def import_builder(spec: str, base_dir: str | Path = ".", key: str = "builder") -> Callable[..., Any]:
    """The function named by `spec`, imported now; a clear RecipeError if it cannot be."""
    target, fn_name = split_spec(spec, key)
    try:
        if target.endswith(".py"):
            module = _import_file(Path(base_dir) / target, spec, key)
        else:
            module = importlib.import_module(target)
    except RecipeError:
        raise
    except ModuleNotFoundError as exc:
        raise RecipeError(
            f"`{key}` {spec!r} cannot be imported: {exc}. Install the package, fix the module name, or use the "
            '"path/to/file.py:fn" form for a local file.'
        ) from None
    except Exception as exc:  # user code failing at import time is still the user's error to fix
        raise RecipeError(f"`{key}` {spec!r}: importing it raised {type(exc).__name__}: {exc}") from None
    fn = getattr(module, fn_name, None)
    if fn is None:
        public = sorted(n for n in dir(module) if callable(getattr(module, n)) and not n.startswith("_"))
        raise RecipeError(
            f"`{key}` {spec!r}: {target} has no `{fn_name}`. Callables there: {', '.join(public[:10]) or 'none'}."
        )
    if not callable(fn):
        raise RecipeError(f"`{key}` {spec!r}: `{fn_name}` in {target} is not callable.")
    return fn


def _import_file(path: Path, spec: str, key: str) -> Any:
    path = path.resolve()
    if not path.is_file():
        raise RecipeError(
            f"`{key}` {spec!r}: the file {path} does not exist. Fix the path (relative to the recipe)."
        )
    # One module per file path, so the model and data builders of one file share their module.
    name = "zerolaunch_user_" + hashlib.sha1(str(path).encode()).hexdigest()[:12]
    if name in sys.modules:
        return sys.modules[name]
    module_spec = importlib.util.spec_from_file_location(name, path)
    assert module_spec is not None and module_spec.loader is not None
    module = importlib.util.module_from_spec(module_spec)
    sys.modules[name] = module
    try:
        module_spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[name]
        raise
    return module


DATA_PASSED = ("rank", "world_size", "micro_batch_size", "seed")
"""What the training loop passes a data builder itself, besides data.args."""


def args_problem(fn: Callable[..., Any], args: dict, passed: tuple[str, ...]) -> tuple[str, str, str] | None:
    """(argument, problem, fix) when `fn(**passed, **args)` cannot bind by signature, else None.

    A builder that takes **kwargs accepts anything and is not judged; neither is one whose signature
    cannot be read (a C function)."""
    import inspect

    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return None
    for name in args:
        if name in passed:
            return name, "is passed by zerolaunch itself", f"Remove it; zerolaunch passes {', '.join(passed)}"
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        return None
    named = [n for n, p in params.items() if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]
    for name in args:
        if name not in named:
            choices = [n for n in named if n not in passed]
            from .errors import did_you_mean

            return name, "is not an argument of the builder", did_you_mean(str(name), choices).strip()
    for name, p in params.items():
        required = p.default is inspect.Parameter.empty and p.kind in (
            p.POSITIONAL_OR_KEYWORD,
            p.KEYWORD_ONLY,
        )
        if required and name not in args and name not in passed:
            return name, "is missing: the builder requires it", f"Add {name} under the builder's args"
    return None
