"""Loading a zerolaunch checkpoint into a running engine, at the same or another world size / stage.

The engine pulls what it owns through `read(kind, name, start, stop)` (checkpoint/reader.py), so the saved
layout never has to match the live one. Before anything is loaded, the checkpoint's params are checked
against the engine's (names, shapes, trainable): a mismatch is an error naming the param, not a silent
partial load. Collective-free: every rank reads the files it needs on its own.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from zerolaunch.checkpoint.contract import CheckpointEngine, ParamSpecLike
from zerolaunch.checkpoint.deepspeed import find_deepspeed_checkpoint
from zerolaunch.checkpoint.errors import CheckpointError
from zerolaunch.checkpoint.reader import CheckpointReader
from zerolaunch.checkpoint.save import resolve_checkpoint
from zerolaunch.zero import comm


def check_compatible(
    reader: CheckpointReader, specs: Iterable[ParamSpecLike], *, strict: bool = True
) -> None:
    """The engine's params match the checkpoint's in names, shapes and trainability. A frozen param the
    checkpoint left out (saved with exclude_frozen_parameters) is missing only with `strict` (DeepSpeed's
    load_module_strict: its strict module.load_state_dict refuses the missing keys)."""
    saved = reader.params
    live = {s.name: s for s in specs}
    excluded = set(reader.manifest.excluded_frozen)
    missing = [n for n in live if n not in saved and (strict or n not in excluded or live[n].trainable)]
    unexpected = [n for n in saved if n not in live]
    if missing and all(n in excluded for n in missing) and not unexpected:
        raise CheckpointError(
            f"{reader.folder} was saved with exclude_frozen_parameters: it lacks the frozen params "
            f"{missing[:5]}; load it with load_module_strict=False (as DeepSpeed) to keep the model's values"
        )
    if missing or unexpected:
        raise CheckpointError(
            f"{reader.folder} does not match the model: params missing from the checkpoint "
            f"{missing[:5]}, params the model lacks {unexpected[:5]}; is model.args the same "
            "as in the run that saved it?"
        )
    for name, spec in live.items():
        p = saved.get(name)
        if p is None:  # a frozen param left out of the checkpoint: it keeps the model's values
            continue
        if tuple(p.shape) != tuple(spec.shape):
            raise CheckpointError(
                f"{reader.folder}: param {name!r} has shape {list(p.shape)} in the checkpoint, "
                f"{list(spec.shape)} in the model"
            )
        if p.trainable != bool(spec.trainable):
            raise CheckpointError(
                f"{reader.folder}: param {name!r} is {'' if p.trainable else 'not '}trainable "
                f"in the checkpoint but {'' if spec.trainable else 'not '}in the model"
            )


def load_checkpoint(
    engine: CheckpointEngine, path_or_root, *, group=None, verify: bool = True, strict: bool = True
) -> dict:
    """Load weights, optimizer state, replicated state and engine meta; return this rank's `extra`.

    strict=False also loads a checkpoint saved with exclude_frozen_parameters: the frozen params it left out
    keep the model's values (DeepSpeed's load_checkpoint(..., load_module_strict=False)).

    `path_or_root` is a checkpoint folder or a root with `latest`. At another world size, ranks beyond
    the saved world size get rank 0's `extra` (RNG streams cannot be re-sliced; the data position can).
    """
    if find_deepspeed_checkpoint(Path(path_or_root)) is not None:
        raise CheckpointError(
            f"{path_or_root} is a DeepSpeed checkpoint: --resume continues zerolaunch checkpoints only (their "
            f"optimizer layout). Start from its weights with `model.init_from: {path_or_root}` (read directly, "
            "no conversion; the optimizer starts fresh)"
        )
    folder = resolve_checkpoint(Path(path_or_root))
    with CheckpointReader(folder, verify=verify) as reader:
        check_compatible(reader, engine.param_specs(), strict=strict)
        engine.load_fragment_state(reader.read)
        excluded = set(reader.manifest.excluded_frozen)
        load_frozen = getattr(engine, "load_frozen_state", None)
        if load_frozen is not None:  # the frozen params the engine shards (stage 3), from either layout
            load_frozen(lambda name, a, b: None if name in excluded else reader.read_frozen(name, a, b))
        replicated = reader.replicated_state()
        live = engine.replicated_state()
        # frozen params are replicated on one side and sharded on the other when the stage changed
        frozen = {p.name for p in reader.manifest.params if not p.trainable}
        for name in frozen & set(live) - set(replicated) - excluded:
            replicated[name] = reader.frozen_param(name)
        for name in frozen & set(replicated) - set(live):
            del replicated[name]
        for name in reader.manifest.excluded_frozen:  # left out at save: the model's values stay
            if name in live and name not in replicated:
                replicated[name] = live[name]
        if set(replicated) != set(live):
            raise CheckpointError(
                f"{folder}: buffers/frozen params differ: checkpoint has "
                f"{sorted(set(replicated) - set(live))[:5]} extra, lacks "
                f"{sorted(set(live) - set(replicated))[:5]}"
            )
        for name, tensor in replicated.items():
            if tuple(tensor.shape) != tuple(live[name].shape):
                raise CheckpointError(
                    f"{folder}: buffer {name!r} has shape {list(tensor.shape)} in the "
                    f"checkpoint, {list(live[name].shape)} in the model"
                )
        engine.load_replicated_state(replicated)
        engine.load_state_meta(reader.manifest.state_meta)
        return reader.extra(comm.rank(group))
