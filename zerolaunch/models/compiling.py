"""`train.compile`: torch.compile of each repeated block of the model, in place, for every ZeRO stage
(`compile_scope: blocks`, the default), or of the model's whole forward (`compile_scope: model`, below).

Owns which modules are compiled and how. The blocks are those stage 3 gathers as units
(`zero.stage3.partition.find_unit_modules`: the children of the model's largest ModuleList of one class, or
`zero.stage3_units`), at every stage, so the same code is compiled whatever the engine does around it.
Only each block's `forward` is replaced by its compiled version (not `module.compile()`, which compiles
`_call_impl` with the module's hooks inside): the stage-3 gather/free hooks, the engine's gradient hooks
and activation checkpointing (which calls the block) all stay eager around the compiled code, and the
module tree and parameter names do not change (checkpoints, stage 3 units and HF saving see the eager
model). The blocks share one class, so dynamo compiles the forward once and reuses it for every block.
With `compile_scope: model` the model's own `forward` is replaced by its compiled version (one graph,
activation checkpointing traced by dynamo); only the engine's gradient hooks stay eager (they run in
backward), which is why the config allows it only where the engine hooks nothing inside the forward: stages
0-2 without overlap_step, and stage 3 at world size 1 with nothing to gather (Engine.forward_hooks_free).
"""

from __future__ import annotations

import torch
from torch import nn

from zerolaunch.util.errors import TrainError
from zerolaunch.zero.stage3.partition import find_unit_modules


def compile_blocks(
    model: nn.Module, *, backend: str, unit_classes: tuple[str, ...] = (), compile_kwargs: dict | None = None
) -> int:
    """Replace the forward of every repeated block by torch.compile of it; returns how many blocks.
    compile_kwargs: torch.compile's other arguments (DeepSpeed's engine.compile passes them on)."""
    try:
        blocks = find_unit_modules(model, unit_classes)
    except ValueError as e:
        raise TrainError(f"train.compile: {e}") from None
    if not blocks:
        raise TrainError(
            f"train.compile is on but {type(model).__name__} has no repeated blocks (a ModuleList of one "
            "class) to compile; name them with zero.stage3_units: [BlockClassName], or set train.compile: false"
        )
    for _, block in blocks:
        # dynamic=False: the shapes of a training run are fixed; no symbolic shapes to trace or guard.
        block.forward = torch.compile(block.forward, **_arguments(backend, compile_kwargs))
    return len(blocks)


def _arguments(backend: str, compile_kwargs: dict | None) -> dict:
    """torch.compile's arguments: the backend, dynamic=False unless the caller says otherwise."""
    return {"dynamic": False, **(compile_kwargs or {}), "backend": backend}


def compile_model(model: nn.Module, *, backend: str, compile_kwargs: dict | None = None) -> None:
    """train.compile_scope: model -- the model's whole forward (embeddings, blocks, head, loss) as one graph.

    The blocks alone leave out the part of the forward with the largest elementwise work of a language model:
    the loss over (tokens, vocab) logits. On one H200, GPT-1.3B, ZeRO-2: 286.2 ms eager, 282.9 with the
    blocks compiled, 271.8 with the whole forward (bench/RESULTS.md), for 2.6 GiB more peak
    memory (what inductor saves for backward). Only for engines whose hooks run outside the forward (stages 0-2
    without overlap_step, stage 3 at world size 1 with nothing to gather: the config refuses the others, the
    loop checks the built engine); the engine's gradient hooks and activation
    checkpointing (traced by dynamo) still work, and the module tree does not change."""
    model.forward = torch.compile(model.forward, **_arguments(backend, compile_kwargs))


def compile_for(
    model: nn.Module,
    *,
    scope: str,
    backend: str,
    unit_classes: tuple[str, ...] = (),
    compile_kwargs: dict | None = None,
) -> str:
    """train.compile: compile by `scope` (blocks | model); returns what was compiled, for the first step's line."""
    if scope == "model":
        compile_model(model, backend=backend, compile_kwargs=compile_kwargs)
        return "the whole forward"
    n = compile_blocks(model, backend=backend, unit_classes=unit_classes, compile_kwargs=compile_kwargs)
    return f"{n} blocks"
