"""A run dir or checkpoint.dir that already holds a run is never written over silently.

Before anything of a new run is written, the launcher looks for what an earlier run left: logged steps in
`run_dir/metrics.jsonl`, a `summary.json`, checkpoints (`step_*`, `latest`) in the checkpoint root. A fresh
start (no `--resume`) over any of it would replace metrics.jsonl and overwrite same-named steps while older
ones survive, leaving one folder with two runs' checkpoints under one `latest`. So it is refused (exit 2)
naming what is there, unless `--resume` continues that run or `--restart` moves it aside first: the run's
own files (never other files in the folder) go to `previous-<time of its last write>/` in the run dir, and
the checkpoints of a checkpoint.dir outside the run dir to `previous-<time>/` inside that checkpoint.dir.
Nothing is deleted. `--resume` of another run's checkpoint (outside this checkpoint root) starts this
run's history there, so it counts as a fresh start: refused over an earlier run, or after --restart moved it
aside; into an empty run dir it simply starts from that checkpoint. The folder name comes from the old run's files, not the clock, so the launchers of a
multi-node job sharing the run dir pick the same one.

Owns: the look and the move. Not: the locks (runlock.py) nor what `--resume` loads (train/checkpointing.py).
"""

from __future__ import annotations

import datetime
import json
import os
import re
from dataclasses import dataclass, field
from pathlib import Path

from zerolaunch.config.errors import UserError
from zerolaunch.util.atomic import write_text_atomic

RUN_FILES = ("metrics.jsonl", "summary.json", "recipe.resolved.json", "logs", "tensorboard", "csv_monitor")
"""What a run writes into its run dir (the monitor folders included), moved aside by --restart."""
OWNER_NAME = ".zerolaunch-run.json"
"""In a checkpoint.dir outside its run dir: which run dir writes there, so another run can name it."""
PREVIOUS_PREFIX = "previous-"
_CHECKPOINT_ENTRY = re.compile(r"^(step_\d+|latest|\.tmp-.*|\.trash-.*)$")


class PreviousRunFound(UserError):
    """A fresh start in a folder that holds another run's steps or checkpoints."""


@dataclass
class PreviousRun:
    run_dir: Path
    checkpoint_root: Path
    logged_steps: list[int] = field(default_factory=list)
    """Steps in metrics.jsonl."""
    last_logged: float | None = None
    """time_unix of its last record."""
    has_summary: bool = False
    checkpoints: list[str] = field(default_factory=list)
    """step_* folders in the checkpoint root, oldest first."""
    latest: str | None = None
    recipe_source: str | None = None
    owner_run_dir: str | None = None
    """The run dir named in the checkpoint root's owner file, when another run dir wrote it."""

    @property
    def in_run_dir(self) -> bool:
        return bool(self.logged_steps or self.has_summary)

    @property
    def in_checkpoint_root(self) -> bool:
        return bool(self.checkpoints or self.latest)

    def __bool__(self) -> bool:
        return self.in_run_dir or self.in_checkpoint_root


def _inside(path: Path, folder: Path) -> bool:
    try:
        path.resolve().relative_to(folder.resolve())
    except ValueError:
        return False
    return True


def find_previous(run_dir, checkpoint_root) -> PreviousRun:
    run_dir, root = Path(run_dir), Path(checkpoint_root)
    found = PreviousRun(run_dir, root)
    metrics = run_dir / "metrics.jsonl"
    if metrics.is_file():
        for line in metrics.read_bytes().splitlines():
            try:
                record = json.loads(line)
            except ValueError:
                continue
            if isinstance(record, dict) and isinstance(record.get("step"), int):
                found.logged_steps.append(record["step"])
                if isinstance(record.get("time_unix"), (int, float)):
                    found.last_logged = float(record["time_unix"])
    found.has_summary = (run_dir / "summary.json").is_file()
    if root.is_dir():
        steps = sorted(p.name for p in root.iterdir() if re.fullmatch(r"step_\d+", p.name) and p.is_dir())
        found.checkpoints = steps
        pointer = root / "latest"
        if pointer.is_file():
            try:
                found.latest = pointer.read_text().strip() or "(empty)"
            except (OSError, UnicodeDecodeError):
                found.latest = "(unreadable)"
        try:
            owner = json.loads((root / OWNER_NAME).read_text()).get("run_dir")
        except (OSError, ValueError, AttributeError):
            owner = None
        if isinstance(owner, str) and Path(owner).resolve() != run_dir.resolve():
            found.owner_run_dir = owner
    try:
        source = json.loads((run_dir / "recipe.resolved.json").read_text()).get("source")
        found.recipe_source = source if isinstance(source, str) and found.in_run_dir else None
    except (OSError, ValueError, AttributeError):
        pass
    return found


def _step_list(names: list[str]) -> str:
    if len(names) <= 4:
        return ", ".join(names)
    return f"{len(names)} checkpoints, {names[0]}, {names[1]} ... {names[-1]}"


def describe(found: PreviousRun) -> str:
    """What is there, in one clause: the logged steps, the checkpoints, which run."""
    parts = []
    if found.logged_steps:
        when = ""
        if found.last_logged is not None:
            when = ", last at " + _stamp(found.last_logged, human=True)
        parts.append(
            f"{found.run_dir / 'metrics.jsonl'} logs {len(found.logged_steps)} step(s) "
            f"(up to step {max(found.logged_steps)}{when})"
        )
    elif found.has_summary:
        parts.append(f"{found.run_dir / 'summary.json'} of a finished run")
    if found.in_checkpoint_root:
        where = f"{found.checkpoint_root}" + (
            f" (written by the run in {found.owner_run_dir})" if found.owner_run_dir else ""
        )
        held = _step_list(found.checkpoints) if found.checkpoints else "no step folder"
        parts.append(f"{where} holds {held}, latest -> {found.latest or '(none)'}")
    if found.recipe_source:
        parts.append(f"from recipe {found.recipe_source}")
    return "; ".join(parts)


def _stamp(seconds: float, *, human: bool = False) -> str:
    moment = datetime.datetime.fromtimestamp(seconds, tz=datetime.timezone.utc)
    return moment.strftime("%Y-%m-%d %H:%M:%S UTC" if human else "%Y%m%d-%H%M%S")


def _last_write(found: PreviousRun) -> float:
    """When the old run last wrote: the folder name for --restart, the same on every node."""
    candidates = [found.run_dir / name for name in ("metrics.jsonl", "summary.json")]
    candidates.append(found.checkpoint_root / "latest")
    candidates += [found.checkpoint_root / name for name in found.checkpoints]
    times = []
    for path in candidates:
        try:
            times.append(path.stat().st_mtime)
        except OSError:
            pass
    return max(times) if times else 0.0


def aside_folder(found: PreviousRun) -> Path:
    """run_dir/previous-<time>/: where --restart moves this old run's run-dir files."""
    return found.run_dir / f"{PREVIOUS_PREFIX}{_stamp(_last_write(found))}"


def aside_places(found: PreviousRun) -> list[Path]:
    """Every folder --restart would move this old run into."""
    dest = aside_folder(found)
    places = [dest] if found.in_run_dir or _inside(found.checkpoint_root, found.run_dir) else []
    if found.in_checkpoint_root and not _inside(found.checkpoint_root, found.run_dir):
        places.append(found.checkpoint_root / dest.name)
    return places


def refusal(found: PreviousRun, *, what: str) -> PreviousRunFound:
    if what == "run_dir":
        head = f"run dir {found.run_dir} already holds a run: {describe(found)}"
        new_folder = "start in a new folder with --run-dir NEW_DIR"
    else:
        head = f"checkpoint.dir {found.checkpoint_root} already holds checkpoints: {describe(found)}"
        new_folder = "give this run its own --set checkpoint.dir=NEW_DIR"
    places = " and ".join(f"{p}/" for p in aside_places(found))
    return PreviousRunFound(
        f"{head}. A fresh start would overwrite its files. Continue that run with --resume auto, "
        f"{new_folder}, or pass --restart to move the old run aside to {places} (nothing is deleted)."
    )


def from_another_run(resume: str | None, checkpoint_root) -> bool:
    """True when --resume names a checkpoint outside this run's checkpoint root (another run's).

    Resuming it starts this run's history from that checkpoint: whatever this run dir already holds is not
    continued but would be written over (same-named steps) and mixed (metrics.jsonl)."""
    if not resume or resume == "auto":
        return False
    return not _inside(Path(resume), Path(checkpoint_root))


def foreign_resume_refusal(found: PreviousRun, resume: str) -> PreviousRunFound:
    own = found.in_run_dir or _inside(found.checkpoint_root, found.run_dir)
    where = f"run dir {found.run_dir}" if own else f"checkpoint.dir {found.checkpoint_root}"
    new_folder = "--run-dir NEW_DIR" if own else "--set checkpoint.dir=NEW_DIR"
    places = " and ".join(f"{p}/" for p in aside_places(found))
    return PreviousRunFound(
        f"--resume {resume} is a checkpoint of another run, but {where} already holds a run: {describe(found)}. "
        f"Starting there from that checkpoint would overwrite this run's same-named checkpoints and mix the two "
        f"runs' metrics. Either add --restart to move this run aside to {places} (nothing is deleted) and start "
        f"from {resume}, or give the new run its own folder with {new_folder}."
    )


def check_previous_run(run_dir, checkpoint_root, *, resume: str | None, restart: bool) -> str | None:
    """Refuse a fresh start over an earlier run, or with `restart` move that run aside.

    A resume from another run's checkpoint (`from_another_run`) is a fresh start of this run's history: it
    is refused over an earlier run as a fresh start is, and `restart` moves that run aside before it.
    Returns a line to print (where the old run went), or None when there was nothing to do."""
    foreign = from_another_run(resume, checkpoint_root)
    if resume and restart and not foreign:
        raise UserError(
            f"--restart starts over and --resume {resume} continues this run: give one of them. --restart moves "
            "the old run aside; --resume auto continues it. (--restart with --resume of another run's "
            "checkpoint starts over from that checkpoint.)"
        )
    if resume and not foreign:
        return None
    found = find_previous(run_dir, checkpoint_root)
    if not found:
        return None
    if not restart:
        if foreign:
            raise foreign_resume_refusal(found, resume)
        own = found.in_run_dir or _inside(found.checkpoint_root, found.run_dir)
        raise refusal(found, what="run_dir" if own else "checkpoint.dir")
    return set_aside(found)


def set_aside(found: PreviousRun) -> str:
    """Move the old run's files into previous-<time>/ folders; returns the line saying where they went."""
    dest = aside_folder(found)
    places = " and ".join(f"{p}/" for p in aside_places(found))  # before the move: named by the old files
    root = found.checkpoint_root
    root_in_run_dir = _inside(root, found.run_dir)
    for name in RUN_FILES:
        src = found.run_dir / name
        if src.exists() and not (root_in_run_dir and _same(src, root)):
            _move(src, dest / name)
    if root.is_dir():
        ckpt_dest = dest / root.relative_to(found.run_dir) if root_in_run_dir else root / dest.name
        for child in sorted(root.iterdir()):
            if _CHECKPOINT_ENTRY.match(child.name):
                _move(child, ckpt_dest / child.name)
    return f"--restart: moved the previous run aside to {places} (nothing deleted)"


def _same(a: Path, b: Path) -> bool:
    try:
        return a.resolve() == b.resolve()
    except OSError:
        return False


def _move(src: Path, dst: Path) -> None:
    if dst.exists():
        raise UserError(
            f"--restart: cannot move {src} aside, {dst} exists already; move or rename one of them yourself"
        )
    dst.parent.mkdir(parents=True, exist_ok=True)
    try:
        os.rename(src, dst)
    except FileNotFoundError:
        pass  # another node's launcher of the same job moved it first


def write_owner(checkpoint_root, run_dir) -> None:
    """Name this run dir in a checkpoint.dir outside it, so a later run there can say whose they are."""
    root, run_dir = Path(checkpoint_root), Path(run_dir)
    if _inside(root, run_dir):
        return

    write_text_atomic(root / OWNER_NAME, json.dumps({"run_dir": str(run_dir.resolve())}) + "\n")
