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
model as it was given. The engine (through its strategy) is what holds these parts; DeepSpeed's
`engine.destroy()` and FSDP2's state on the module are the alternatives this avoids: dropping the engine is
enough.
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


def remove_with(target: object, handles: Iterable) -> None:
    """Remove the hooks of `handles` (torch's RemovableHandle) when `target` is garbage collected."""
    handles = list(handles)
    # the callback holds the handles only (never `target`, which would then never be collected); nothing to
    # remove at interpreter exit
    weakref.finalize(target, _remove, handles).atexit = False


def _remove(handles: list) -> None:
    for handle in handles:
        handle.remove()
