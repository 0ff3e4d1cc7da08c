"""The engine's hooks on the user's model hold the engine's parts weakly, and go when those parts go.

[Note: weak hooks]
The engine registers hooks on the model it is given: each param's post-accumulate-grad hook (every stage),
stage 3's module forward hooks and its hooks on forward outputs, the overlapped step's publish hooks. The
model usually outlives the engine (a notebook, a second Trainer on the same model, a reference model), so a
hook holding its engine part (a reducer, the stage-3 schedule) would keep it and every buffer it reaches --
grad shards, unit shards, pinned host memory -- for the model's lifetime. At stage 3 it would even outlive the
model: the schedule holds the params, whose hooks autograd keeps where the garbage collector does not look,
so the cycle is never collected. And a dropped engine's grad hooks would keep running, taking each grad (and
setting it to None) before a new engine on the same model saw it.
So every such hook is a `weak_partial`: it holds its target by weak reference and does nothing once the
target is gone; and `remove_with(target, handles)` removes the hooks as the target is collected, leaving the
model as it was given. Dropping the engine is enough (no DeepSpeed-style `destroy()` to call). The user's
model keeps what is its own: at stages 0-2 its params (views of flat buffers the params keep alive); at
stage 3 only the resident params, since the sharded weights live in the engine's shards and go with it. A
module whose params were sharded then holds zero placeholders, so stage 3 leaves `refuse_when_gone` on it:
running it raises by name instead of computing with zeros.
"""

from __future__ import annotations

import weakref
from collections.abc import Iterable


class weak_partial:  # noqa: N801 - used like functools.partial
    """`functools.partial(method, *args)` over a bound method whose object it holds weakly: once that object
    is gone a call does nothing and returns None (which every torch hook reads as "leave it as it is")."""

    __slots__ = ("_method", "_args")

    def __init__(self, method, *args):
        self._method = weakref.WeakMethod(method)
        self._args = args

    def __call__(self, *args, **kwargs):
        method = self._method()
        if method is None:
            return None
        return method(*self._args, *args, **kwargs)

    def __deepcopy__(self, memo):
        # a deep copy of the model (an EMA, a reference model) is no part of the engine: its hooks do nothing
        detached = weak_partial.__new__(weak_partial)
        detached._method = _gone
        detached._args = self._args
        return detached


def _gone() -> None:
    return None


class refuse_when_gone:  # noqa: N801 - a hook, named as weak_partial
    """A hook that does nothing while `target` lives and raises RuntimeError(message) once it is gone: for a
    model that cannot run without it (stage 3's sharded weights go with the engine). A deep copy of the model
    holds copies of what the params hold without the target (stage 3: zero placeholders): its hook always
    raises RuntimeError(copy_message)."""

    __slots__ = ("_target", "_message", "_copy_message")

    def __init__(self, target: object, message: str, copy_message: str):
        self._target = weakref.ref(target)
        self._message = message
        self._copy_message = copy_message

    def __call__(self, *_):
        if self._target is None:
            raise RuntimeError(self._copy_message)
        if self._target() is None:
            raise RuntimeError(self._message)

    def __deepcopy__(self, memo):
        copied = refuse_when_gone.__new__(refuse_when_gone)
        copied._target = None
        copied._message = copied._copy_message = self._copy_message
        return copied


def refusing_modules(model) -> list[str]:
    """Names of the modules of `model` (an nn.Module) that carry a `refuse_when_gone` hook: their weights
    are another engine's (alive or not)."""
    return [
        name or type(module).__name__
        for name, module in model.named_modules()
        if any(isinstance(hook, refuse_when_gone) for hook in module._forward_pre_hooks.values())
    ]


def remove_with(target: object, handles: Iterable) -> None:
    """Remove the hooks of `handles` (torch's RemovableHandle) when `target` is garbage collected."""
    handles = list(handles)
    # the callback holds the handles only (never `target`, which would then never be collected); nothing to
    # remove at interpreter exit
    weakref.finalize(target, _remove, handles).atexit = False


def _remove(handles: list) -> None:
    for handle in handles:
        handle.remove()
