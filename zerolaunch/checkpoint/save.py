"""Saving a checkpoint from every rank of a running engine, crash-safely; finding the latest one.

Flow (see [Note: atomic save] in atomic.py): rank 0 clears leftovers and creates `root/.tmp-step_N/`;
every rank writes `rank_{r}.safetensors` (its fragment state, + replicated state on rank 0, + its extra
tensors) and a small `rank_{r}.json`; rank 0 merges those into `manifest.json`, renames the folder to
`step_N`, moves `latest` and prunes to `keep`. Ranks agree on success after each phase with one tiny
all-reduce, so a failure on one rank raises on all of them instead of hanging the others in a barrier.
The folder must be on a filesystem all ranks see (one node, or a shared mount).

Owns: the folder protocol and the engine-facing side of writing. Not: the manifest schema (manifest.py)
or the byte format (tensorfile.py).
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import torch

from zerolaunch.checkpoint.contract import CheckpointEngine, ParamSpecLike
from zerolaunch.checkpoint.errors import CheckpointError
from zerolaunch.checkpoint.extra import encode_extra
from zerolaunch.checkpoint.manifest import (
    MANIFEST_NAME,
    Manifest,
    ParamEntry,
    RankEntry,
    ReplicatedEntry,
    rank_file_name,
)
from zerolaunch.checkpoint.model16 import frozen_names, wants_16bit_model, write_16bit_model
from zerolaunch.checkpoint.tensorfile import dtype_name, write_safetensors
from zerolaunch.util.atomic import (
    TMP_PREFIX,
    clean_stale,
    publish,
    remove_path,
    remove_tree,
    write_json,
    write_text_atomic,
)
from zerolaunch.util.disk_errors import disk_error, disk_errors, is_disk_error
from zerolaunch.zero import comm

LATEST_NAME = "latest"
_STEP_DIR = re.compile(r"^step_(\d+)$")


def step_dir_name(step: int) -> str:
    return f"step_{step:06d}"


def save_checkpoint(
    engine: CheckpointEngine,
    root,
    *,
    step: int,
    extra: dict | None = None,
    keep: int | None = None,
    group=None,
    exclude_frozen_parameters: bool = False,
) -> Path:
    """Collective over `group`: write `root/step_{step}` from every rank and point `root/latest` at it.

    exclude_frozen_parameters: as DeepSpeed's, the params with requires_grad False are not saved (nor in the
    16-bit model); the manifest names them (`excluded_frozen`), and loading keeps the model's values."""
    if keep is not None and keep < 1:
        raise CheckpointError(f"checkpoint.keep must be >= 1 (or unset to keep all), got {keep}")
    root = Path(root)
    rank = comm.rank(group)
    final = root / step_dir_name(step)
    tmp = root / f"{TMP_PREFIX}{final.name}"
    try:
        _write_collectively(engine, root, tmp, final, step, extra, keep, group, exclude_frozen_parameters)
    except Exception as err:
        if rank == 0:
            # every rank is past the phase that failed (each phase ends in an agreement): nothing writes
            # into tmp any more, and a leftover .tmp-step_* must not look like a checkpoint
            remove_path(tmp)
        if is_disk_error(err):
            raise disk_error(
                err,
                path=final,
                what=f"the checkpoint of step {step} (rank {rank}) to",
                fix="point checkpoint.dir at another disk (--set checkpoint.dir=DIR)",
                after=_intact(root, final),
            ) from None
        raise
    return final


def _intact(root: Path, final: Path) -> str:
    done = [p.name for _, p in complete_checkpoints(root) if p != final]
    if not done:
        return "No earlier checkpoint of this run was saved."
    return f"The partial folder was removed; {done[-1]} is intact (--resume auto continues from it)."


def _write_collectively(
    engine: CheckpointEngine, root, tmp, final, step, extra, keep, group, exclude_frozen_parameters
):
    rank, world_size = comm.rank(group), comm.world_size(group)
    device = getattr(engine, "device", None) or torch.device("cpu")
    _collectively(lambda: prepare_folder(root, tmp) if rank == 0 else None, group, device, "prepare", rank)
    excluded = frozen_names(engine) if exclude_frozen_parameters else set()
    _collectively(
        lambda: write_rank_files(engine, tmp, rank, extra or {}, excluded), group, device, "write", rank
    )
    # stage3_gather_16bit_weights_on_model_save: written inside tmp, so it is published atomically too
    if wants_16bit_model(engine):
        _collectively(
            lambda: write_16bit_model(engine, tmp, rank=rank, exclude_frozen_parameters=bool(excluded)),
            group,
            device,
            "16-bit model",
            rank,
        )
    _collectively(
        lambda: (
            finalize(engine, tmp, final, world_size, step=step, keep=keep, excluded=excluded)
            if rank == 0
            else None
        ),
        group,
        device,
        "publish",
        rank,
    )
    return final


def _collectively(fn, group, device, phase: str, rank: int) -> None:
    """Run fn on this rank, then agree with every rank on whether all of them succeeded."""
    error: BaseException | None = None
    try:
        fn()
    except Exception as e:  # re-raised below, after the other ranks have been told
        error = e
    flag = torch.tensor([0 if error is None else 1], dtype=torch.int32, device=device)
    comm.all_reduce(flag, group, op="max")
    if error is not None:
        raise error
    if int(flag.item()):
        raise CheckpointError(
            f"checkpoint {phase} failed on another rank (its log has the reason); rank {rank} stops too"
        )


def prepare_folder(root: Path, tmp: Path) -> None:
    root.mkdir(parents=True, exist_ok=True)
    clean_stale(root)
    tmp.mkdir()


def write_rank_files(
    engine: CheckpointEngine, folder: Path, rank: int, extra: dict, excluded: set[str] = frozenset()
) -> None:
    """This rank's shard: fragment state (+ replicated state on rank 0) + extra tensors, and its json."""
    fragments = {(f.name, f.start): f for f in engine.owned_fragments()}
    state = engine.fragment_state()
    if getattr(engine, "stage", None) == 0 and rank > 0:
        # Stage 0 replicates the optimizer: rank 0's copy is the checkpoint, the others would be duplicates.
        fragments, state = {}, {}
    tensors: list[tuple[str, torch.Tensor]] = []
    kinds: set[str] = set()
    for key, tensor in state.items():
        kind, name, start = _split_key(key)
        frag = fragments.get((name, start))
        if frag is None:
            raise CheckpointError(f"engine fragment_state key {key!r} names no fragment this rank owns")
        if tensor.numel() not in (frag.stop - frag.start, 1):
            raise CheckpointError(
                f"engine fragment_state {key!r} has {tensor.numel()} elements, the "
                f"fragment {frag.stop - frag.start}"
            )
        kinds.add(kind)
        tensors.append((key, tensor.detach().reshape(-1).to(torch.float32)))
    if rank == 0:
        for name, tensor in engine.replicated_state().items():
            if name not in excluded:
                tensors.append((f"replicated/{name}", tensor.detach()))
    # frozen params stage 3 shards: each rank saves the elements it holds, in their dtype (no fp32 master)
    frozen_state = getattr(engine, "frozen_fragment_state", None)
    frozen_fragments = []
    for key, tensor in (frozen_state() if frozen_state is not None else {}).items():
        name, _, start = key.rpartition("/")
        if name in excluded:
            continue
        frozen_fragments.append([name, int(start), int(start) + tensor.numel()])
        tensors.append((f"frozen/{key}", tensor.detach().reshape(-1)))
    extra_json, extra_tensors = encode_extra(extra)
    tensors.extend(extra_tensors.items())
    path = folder / rank_file_name(rank)
    needed = sum(t.numel() * t.element_size() for _, t in tensors)
    with disk_errors(path, needed_bytes=needed):
        checksums = write_safetensors(path, tensors, metadata={"format": "pt", "zerolaunch_rank": str(rank)})
    entry = {
        "file": path.name,
        "bytes": path.stat().st_size,
        "fragments": [[f.name, f.start, f.stop] for f in fragments.values()],
        "extra": extra_json,
        "extra_tensors": sorted(extra_tensors),
        "kinds": sorted(kinds),
        "checksums": checksums,
        "frozen_fragments": frozen_fragments,
    }
    write_json(folder / f"rank_{rank}.json", entry)


def _split_key(key: str) -> tuple[str, str, int]:
    kind, _, rest = key.partition("/")
    name, _, start = rest.rpartition("/")
    if not kind or not name or not start.isdigit():
        raise CheckpointError(f"engine fragment_state key {key!r} is not 'kind/name/start'")
    return kind, name, int(start)


def finalize(
    engine: CheckpointEngine,
    tmp: Path,
    final: Path,
    world_size: int,
    *,
    step: int,
    keep: int | None,
    excluded: set[str] = frozenset(),
) -> None:
    """Rank 0: merge the rank jsons into the manifest, publish the folder, move `latest`, prune."""
    ranks, kinds, seen = [], set(), set()
    for r in range(world_size):
        part = tmp / f"rank_{r}.json"
        try:
            d = json.loads(part.read_text())
        except FileNotFoundError:
            raise CheckpointError(
                f"rank {r} wrote no {part.name} into {tmp}: is {tmp.parent} on a "
                "filesystem every rank can see?"
            ) from None
        kinds.update(d["kinds"])
        # A fragment several ranks hold (replicated state) is read from the first of them.
        fragments = tuple(tuple(f) for f in d["fragments"] if tuple(f) not in seen)
        seen.update(fragments)
        ranks.append(
            RankEntry(
                d["file"],
                d["bytes"],
                fragments,
                d["extra"],
                tuple(d["extra_tensors"]),
                d.get("checksums"),
                tuple(tuple(f) for f in d.get("frozen_fragments", ())),
            )
        )
    transient = _non_persistent_buffers(engine)
    replicated = tuple(
        ReplicatedEntry(n, tuple(t.shape), dtype_name(t.dtype), n not in transient)
        for n, t in engine.replicated_state().items()
        if n not in excluded
    )
    manifest = Manifest(
        step=step,
        world_size=world_size,
        stage=_engine_stage(engine),
        kinds=tuple(sorted(kinds)),
        params=tuple(_param_entry(s) for s in engine.param_specs() if s.name not in excluded),
        replicated=replicated,
        ranks=tuple(ranks),
        state_meta=engine.state_meta(),
        bucket_numel=_engine_bucket_numel(engine),
        excluded_frozen=tuple(sorted(excluded)),
    )
    manifest.check_coverage(tmp)
    write_json(tmp / MANIFEST_NAME, manifest.to_json())
    for r in range(world_size):
        (tmp / f"rank_{r}.json").unlink()
    publish(tmp, final)
    write_text_atomic(final.parent / LATEST_NAME, final.name + "\n")
    if keep is not None:
        prune(final.parent, keep, protect=final)


def _non_persistent_buffers(engine: CheckpointEngine) -> set[str]:
    """Buffers registered with persistent=False: named_buffers() lists them, state_dict() does not."""
    module = getattr(engine, "module", None)
    if module is None:
        return set()
    return {n for n, _ in module.named_buffers()} - set(module.state_dict(keep_vars=True))


def _param_entry(spec: ParamSpecLike) -> ParamEntry:
    dtype = spec.dtype if isinstance(spec.dtype, str) else dtype_name(spec.dtype)
    return ParamEntry(
        spec.name,
        tuple(int(d) for d in spec.shape),
        dtype.removeprefix("torch."),
        bool(spec.trainable),
        tuple(getattr(spec, "aliases", ()) or ()),
    )


def _engine_stage(engine: CheckpointEngine) -> int | None:
    options = getattr(engine, "options", None)
    return getattr(getattr(options, "zero", None), "stage", None)


def _engine_bucket_numel(engine: CheckpointEngine) -> int | None:
    options = getattr(engine, "options", None)
    return getattr(getattr(options, "zero", None), "bucket_numel", None)


def complete_checkpoints(root: Path) -> list[tuple[int, Path]]:
    """(step, folder) of every published checkpoint under root, oldest first."""
    root = Path(root)
    if not root.is_dir():
        return []
    out = []
    for child in root.iterdir():
        m = _STEP_DIR.match(child.name)
        if m and (child / MANIFEST_NAME).is_file():
            out.append((int(m.group(1)), child))
    return sorted(out)


def prune(root: Path, keep: int, *, protect: Path) -> None:
    done = [p for _, p in complete_checkpoints(root) if p != protect]
    for path in done[: max(0, len(done) - (keep - 1))]:
        remove_tree(path)


def latest_checkpoint(root) -> Path | None:
    """The folder `root/latest` names; without a `latest`, the newest complete checkpoint (None: none).

    A `latest` that names no complete checkpoint (a missing or half-deleted step, garbage) is a
    CheckpointError naming the newest complete one, never a silent switch to another step: which step a
    run continues from is the user's call."""
    root = Path(root)
    pointer = root / LATEST_NAME
    done = complete_checkpoints(root)
    if not pointer.is_file():
        return done[-1][1] if done else None
    try:
        name = pointer.read_text().strip()
    except (OSError, UnicodeDecodeError):
        name = None
    target = root / name if name else None
    if target is not None and _STEP_DIR.match(name) and (target / MANIFEST_NAME).is_file():
        return target
    if name is None or not _STEP_DIR.match(name):
        problem = "is damaged (it holds no step_* name)"
    elif not target.exists():
        problem = f"names {name}, which does not exist"
    else:
        problem = f"names {name}, which has no {MANIFEST_NAME} (an unfinished or damaged checkpoint)"
    newest = done[-1][1] if done else None
    way = (
        f"The newest complete checkpoint is {newest.name}: resume from it with --resume {newest}, or write "
        f"{newest.name} into {pointer}."
        if newest is not None
        else "No complete checkpoint is left there: start over (--restart) or resume from another folder."
    )
    raise CheckpointError(f"{pointer} {problem}. {way}")


def resolve_checkpoint(path) -> Path:
    """A checkpoint folder itself, or a root whose latest checkpoint is wanted."""
    path = Path(path)
    if (path / MANIFEST_NAME).is_file():
        return path
    if not path.exists():
        raise CheckpointError(f"checkpoint path {path} does not exist")
    found = latest_checkpoint(path)
    if found is None:
        raise CheckpointError(
            f"{path} holds no zerolaunch checkpoint (no {MANIFEST_NAME}, no complete "
            "step_* folder); pass a checkpoint folder or the checkpoint.dir of a run"
        )
    return found


def nothing_to_do(checkpoint_step: int, steps: int, where=None) -> str:
    """What a resume of a finished run says instead of training (`where`: the checkpoint, when known)."""
    checkpoint = f"the checkpoint {where}" if where is not None else "the checkpoint"
    return (
        f"nothing to do: {checkpoint} is at step {checkpoint_step} and train.steps is {steps}. To train "
        f"further, raise it (--set train.steps={max(steps, checkpoint_step) * 2}) with --resume auto."
    )
