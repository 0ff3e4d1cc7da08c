"""`launch(request, console) -> exit code`: what `zerolaunch train` does after parsing its flags.

Resolve the recipe for world size nnodes x nproc, write run_dir/recipe.resolved.json, show the resolved
table, then run `python -m zerolaunch.worker RUN_DIR/recipe.resolved.json` on every local rank through
`torch.distributed.launcher.api.elastic_launch`. Single node: rendezvous on 127.0.0.1 at a port the OS
picked. Multi-node: at --rdzv-endpoint, with c10d (ranks by arrival) or static (--node-rank). A failure is
summarised once on stderr, as a panel (failures.py) and exit code 1, or a worker's UserError paragraph and
exit code 2; Ctrl-C stops every worker and exits 130. Before anything is written, the run dir and the
checkpoint.dir are locked and checked for an earlier run (previous_run.py); a run that ends well prints
where its results are.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import signal
import sys
import uuid
from dataclasses import dataclass, field
from pathlib import Path

from zerolaunch.checkpoint.manifest import MANIFEST_NAME
from zerolaunch.config import load_recipe, save_resolved
from zerolaunch.config.errors import UserError
from zerolaunch.config.table import print_run_recipe
from zerolaunch.launch import env, failures
from zerolaunch.launch.devices import Workers, choose_workers
from zerolaunch.launch.ports import LOOPBACK, LaunchError, check_endpoint, free_port, parse_endpoint
from zerolaunch.launch.preflight import preflight
from zerolaunch.launch.previous_run import check_previous_run, write_owner
from zerolaunch.launch.restarts import RestartAnnouncer, failures_noted
from zerolaunch.launch.runlock import RunLock, lock_name
from zerolaunch.launch.writable import check_writable
from zerolaunch.report import LiveProgress
from zerolaunch.util.disk_errors import disk_errors
from zerolaunch.util.exit_codes import NONFINITE_EXIT_CODE

RDZV_BACKENDS = ("c10d", "static")
MONITOR_INTERVAL_SECONDS = 0.1
"""How often the agent polls its workers: a dead rank ends the job this fast, not at a collective timeout."""


@dataclass(frozen=True)
class LaunchRequest:
    recipe: str
    gpus: int | None = None
    cpu: int | None = None
    sets: list[str] = field(default_factory=list)
    run_dir: str | None = None
    resume: str | None = None
    restart: bool = False
    """--restart: move an earlier run in run_dir / checkpoint.dir aside (previous_run.py) and start over."""
    verify: bool = True
    """False (--no-verify): resume / model.init_from read checkpoint files without checking their crc32s."""
    nnodes: int = 1
    node_rank: int | None = None
    rdzv_endpoint: str | None = None
    rdzv_backend: str = "c10d"
    max_restarts: int = 0
    run_id: str | None = None
    timeout_seconds: float = 600.0
    all_ranks: bool = False


@dataclass(frozen=True)
class Rendezvous:
    backend: str
    endpoint: str
    configs: dict
    local_addr: str | None
    run_id: str


def plan_rendezvous(req: LaunchRequest) -> Rendezvous:
    if req.rdzv_backend not in RDZV_BACKENDS:
        raise LaunchError(
            f"--rdzv-backend must be one of {', '.join(RDZV_BACKENDS)}, got {req.rdzv_backend!r}"
        )
    if req.nnodes < 1:
        raise LaunchError(f"--nnodes must be >= 1, got {req.nnodes}")
    if req.node_rank is not None and not 0 <= req.node_rank < req.nnodes:
        raise LaunchError(
            f"--node-rank {req.node_rank} is outside 0..{req.nnodes - 1} (--nnodes {req.nnodes})"
        )
    if req.nnodes == 1 and req.rdzv_endpoint is None:
        # one node: everything on loopback, at a port nobody else holds
        endpoint, local_addr = f"{LOOPBACK}:{free_port()}", LOOPBACK
    else:
        if req.rdzv_endpoint is None:
            raise LaunchError(
                f"--nnodes {req.nnodes} needs --rdzv-endpoint HOST:PORT (node 0's address, the same on every "
                "node), e.g. --rdzv-endpoint 10.0.0.1:29500"
            )
        host, port = parse_endpoint(req.rdzv_endpoint)
        endpoint, local_addr = f"{host}:{port}", None
        if host in (LOOPBACK, "localhost"):
            local_addr = LOOPBACK
        # before anything is written: a port another program holds would leave the workers waiting silently
        hosts_the_store = req.nnodes == 1 or (req.rdzv_backend == "static" and not req.node_rank)
        check_endpoint(host, port, must_host=hosts_the_store)
    configs: dict = {}
    if req.rdzv_backend == "static":
        if req.nnodes > 1 and req.node_rank is None:
            raise LaunchError(
                "--rdzv-backend static with --nnodes > 1 needs --node-rank (0 on the first node)"
            )
        configs["rank"] = req.node_rank or 0
    run_id = req.run_id or (uuid.uuid4().hex[:12] if req.nnodes == 1 else "zerolaunch")
    return Rendezvous(req.rdzv_backend, endpoint, configs, local_addr, run_id)


def _worker_args(req: LaunchRequest, resolved: Path, workers: Workers) -> list[str]:
    args = ["-m", "zerolaunch.worker", str(resolved), "--device", workers.device]
    args += ["--timeout", str(req.timeout_seconds)]
    if req.resume:
        args += ["--resume", req.resume]
    if not req.verify:
        args.append("--no-verify")
    return args


def _prepare_env(workers: Workers) -> None:
    # The workers' parent: each worker checks it is still there after arming its guards (orphans.py).
    env.set_launcher_pid(os.getpid())
    # pytorch issue 135712: a c10d restart reuses the rendezvous store and fails or hangs without this.
    os.environ["TORCH_DISABLE_SHARE_RDZV_TCP_STORE"] = "1"
    # Worker stdout goes to log files; unbuffered, rank 0's progress reaches the terminal as it happens.
    os.environ["PYTHONUNBUFFERED"] = "1"
    if workers.device == "cpu" or workers.nproc_per_node > 1:
        # as torchrun: N workers each spawning a thread per core would oversubscribe the machine
        os.environ.setdefault("OMP_NUM_THREADS", "1")
    if workers.device == "cpu":
        # transformers imports DeepSpeed's glue wherever DeepSpeed is installed (though nothing here runs it),
        # and DeepSpeed then warns on every rank that it found no GPU; on CPU workers that is what was asked
        os.environ.setdefault("DS_ACCELERATOR", "cpu")
    # The agent's own chatter (configs, closing signals, its per-failure ERROR lines) would bury the
    # failure panel, which says the same once, with the root cause first.
    logging.getLogger("torch.distributed.elastic").setLevel(logging.CRITICAL)


def launch(req: LaunchRequest, console) -> int:
    """Run the job; returns the process exit code (0 ok, 1 training failed, 130 interrupted)."""
    if req.max_restarts < 0:
        raise LaunchError(f"--max-restarts must be >= 0, got {req.max_restarts}")
    if not req.timeout_seconds > 0:
        raise LaunchError(f"--timeout must be a positive number of seconds, got {req.timeout_seconds}")
    workers = choose_workers(req.gpus, req.cpu)
    rdzv = plan_rendezvous(req)
    overrides = list(req.sets) + ([f"train.run_dir={req.run_dir}"] if req.run_dir else [])
    recipe = load_recipe(
        req.recipe, overrides=overrides, world_size=req.nnodes * workers.nproc_per_node, check_builders=True
    )

    # bad input that every worker would meet: exit 2 before any starts
    for note in preflight(recipe, req.resume, world_size=req.nnodes * workers.nproc_per_node):
        console.print(note, markup=False, highlight=False, soft_wrap=True)
    run_dir = Path(recipe.train.run_dir)
    checkpoint_root = Path(recipe.checkpoint.dir or run_dir / "checkpoints")
    # before anything is written or started: a folder the run cannot write fails here, not in a worker
    check_writable(run_dir, "run_dir")
    check_writable(checkpoint_root, "checkpoint.dir")
    with disk_errors(fix="point --run-dir (or checkpoint.dir) at another disk"):
        return _launch_in(req, recipe, rdzv, workers, run_dir, checkpoint_root, console)


def _launch_in(req, recipe, rdzv, workers, run_dir: Path, checkpoint_root: Path, console) -> int:
    name = lock_name(req.nnodes, req.node_rank)
    locks = [RunLock(run_dir, name, run_dir=run_dir).acquire()]
    try:
        if checkpoint_root.resolve() != run_dir.resolve():
            # two runs (other run dirs) saving into one checkpoint.dir would interleave their steps
            locks.append(RunLock(checkpoint_root, name, what="checkpoint.dir", run_dir=run_dir).acquire())
        for lock in locks:
            if lock.note:
                console.print(lock.note, markup=False, highlight=False, soft_wrap=True)
        # before anything moves: a resume with nothing left to train leaves every folder as it is
        done = _finished_checkpoint(req.resume, checkpoint_root, recipe.train.steps)
        if done is not None:
            # lazy: it imports torch, which the launcher does not need until here
            from zerolaunch.checkpoint.save import nothing_to_do

            line = nothing_to_do(done[1], recipe.train.steps, where=done[0])
            console.print(line, markup=False, highlight=False, soft_wrap=True)
            return 0
        moved = check_previous_run(run_dir, checkpoint_root, resume=req.resume, restart=req.restart)
        if moved:
            console.print(moved, markup=False, highlight=False, soft_wrap=True)
        write_owner(checkpoint_root, run_dir)
        return _launch_locked(req, recipe, rdzv, workers, run_dir, console)
    finally:
        for lock in reversed(locks):
            lock.release()


def _finished_checkpoint(resume: str | None, checkpoint_root: Path, steps: int) -> tuple[Path, int] | None:
    """(folder, step) of the checkpoint --resume would load when it is at train.steps or past it, else None.

    A `latest` that names no complete checkpoint is refused here (CheckpointError), before any worker."""
    if not resume:
        return None
    import json

    # lazy: it imports torch, which the launcher does not need until here
    from zerolaunch.checkpoint.save import latest_checkpoint, resolve_checkpoint

    if resume == "auto":
        found = latest_checkpoint(checkpoint_root) if checkpoint_root.is_dir() else None
    else:
        found = resolve_checkpoint(resume)
    if found is None:
        return None
    try:
        step = json.loads((found / MANIFEST_NAME).read_text())["step"]
    except (OSError, ValueError, KeyError, TypeError):
        return None  # a damaged manifest: the worker's load names what is wrong
    return (found, step) if isinstance(step, int) and step >= steps else None


def _launch_locked(req: LaunchRequest, recipe, rdzv: Rendezvous, workers: Workers, run_dir: Path, console):
    resolved = save_resolved(recipe, run_dir)
    print_run_recipe(recipe, console)
    where = f"{req.nnodes} node(s) x " if req.nnodes > 1 else ""
    console.print(
        f"launching {where}{workers.nproc_per_node} {workers.device} worker(s); run dir {run_dir}; "
        f"logs {run_dir / 'logs'}",
        markup=False,
        highlight=False,
        soft_wrap=True,
    )
    _prepare_env(workers)
    checkpoint_root = Path(recipe.checkpoint.dir or run_dir / "checkpoints")
    return _run_agent(
        req,
        rdzv,
        workers,
        _worker_args(req, resolved, workers),
        run_dir,
        console,
        recipe.train.steps,
        checkpoint_root,
    )


def _run_agent(
    req,
    rdzv: Rendezvous,
    workers: Workers,
    args: list[str],
    run_dir: Path,
    console,
    total_steps: int,
    checkpoint_root: Path,
) -> int:
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.elastic.rendezvous.api import RendezvousError
    from torch.distributed.launcher.api import LaunchConfig, elastic_launch

    # lazy: logs.py subclasses torch's elastic log specs, imported with the agent just above
    from zerolaunch.launch.logs import ALL_RANKS_PREFIX, ConsoleLines, RunLogsSpecs

    # torch's elastic loggers set their own level (LOGLEVEL, default WARNING) at import: quiet each one,
    # or "Received 2 death signal, shutting down workers" precedes the launcher's one line on Ctrl-C
    for name in list(logging.root.manager.loggerDict):
        if name.startswith("torch.distributed.elastic"):
            logging.getLogger(name).setLevel(logging.CRITICAL)

    # A bar only when this terminal shows rank 0 alone; with --all-ranks torch's tee prints straight to it.
    progress = LiveProgress(
        run_dir, console, total_steps=total_steps, interactive=console.is_terminal and not req.all_ranks
    )
    announcer = RestartAnnouncer(
        console,
        max_restarts=req.max_restarts,
        metrics_path=run_dir / "metrics.jsonl",
        checkpoint_root=checkpoint_root,
        resume=req.resume,
    )
    logs = RunLogsSpecs(
        run_dir / "logs",
        all_ranks=req.all_ranks,
        max_restarts=req.max_restarts,
        rank0_stdout=ConsoleLines(console) if progress.active else None,
        announcer=announcer,
    )
    config = LaunchConfig(
        min_nodes=req.nnodes,
        max_nodes=req.nnodes,
        nproc_per_node=workers.nproc_per_node,
        run_id=rdzv.run_id,
        role="default",
        rdzv_endpoint=rdzv.endpoint,
        rdzv_backend=rdzv.backend,
        rdzv_configs=rdzv.configs,
        max_restarts=req.max_restarts,
        monitor_interval=MONITOR_INTERVAL_SECONDS,
        logs_specs=logs,
        log_line_prefix_template=ALL_RANKS_PREFIX if req.all_ranks else None,
        local_addr=rdzv.local_addr,
    )
    from rich.console import Console

    # a failure is said once, on stderr (`2>err.log` keeps it), in the launcher's words
    err_console = Console(stderr=True, highlight=False)
    try:
        # Workers write through pipes, never a terminal: the launcher owns it and draws the bar from
        # metrics.jsonl (a no-op when this console is not a terminal; rank 0's plain lines still arrive).
        with progress, failures_noted(announcer):
            elastic_launch(config, sys.executable)(*args)
    except ChildFailedError as err:
        logs.close()
        rank, failure = failures.root_cause(err.failures)
        _, stderr_log = logs.log_files(failure.local_rank)
        report = failures.describe(rank, failure, stderr_log)
        # ranks the agent stopped (SIGTERM) did not fail on their own: candidates for the hung one
        failed = {r for r, f in err.failures.items() if not failures.is_secondary(f)}
        hint = failures.timeout_hint(report, failed, set(logs.global_ranks.values()), req.timeout_seconds)
        report = dataclasses.replace(report, hint=hint)
        # a rank of this node missing from the failures exited 0: before the others, since they failed
        local_of = {g: local for local, g in logs.global_ranks.items()}
        exited_ok = sorted(set(local_of) - set(err.failures))
        report = failures.early_exit(report, exited_ok, lambda r: logs.log_files(local_of[r])[1])

        if failure.exitcode == NONFINITE_EXIT_CODE:
            # train.max_nonfinite_steps stopped the run on every rank: its message once, its own exit code
            # (README "When things go wrong"), no traceback panel.
            message = report.exception.removeprefix("NonFiniteStop: ")
            err_console.print(
                f"{message}\nfull log: {report.log_path}", markup=False, highlight=False, soft_wrap=True
            )
            return NONFINITE_EXIT_CODE

        if failure.exitcode == UserError.exit_code:
            # a UserError raised in a worker (worker.py): its message once, exit 2, as the launcher's own
            message = report.exception.split(": ", 1)[-1] if ": " in report.exception else report.exception
            err_console.print(
                f"error: {message}\nfull log: {report.log_path}",
                markup=False,
                highlight=False,
                soft_wrap=True,
            )
            return UserError.exit_code
        # in a log or a pipe the console is 80 columns: let the panel be as wide as its longest line
        panel_width = None if err_console.is_terminal else 1000
        err_console.print(failures.render(report, restarts_used=len(logs.attempts) - 1), width=panel_width)
        return 1
    except SignalException as err:
        logs.close()
        console.print(
            f"interrupted by {signal.Signals(err.sigval).name}: all workers stopped", highlight=False
        )
        return 128 + int(err.sigval)
    except KeyboardInterrupt:
        logs.close()
        console.print("interrupted: all workers stopped", highlight=False)
        return 130
    except RendezvousError as err:
        logs.close()
        raise LaunchError(
            f"rendezvous at {rdzv.endpoint} ({rdzv.backend}) failed: {err}. Check that every node uses the same "
            "--rdzv-endpoint, --nnodes and --run-id, and that node 0 is reachable on that port"
        ) from None
    except (ValueError, OSError):
        # torch's agent reading a worker's error record that a full or read-only disk left empty or cut
        # (a JSONDecodeError is a ValueError): say what the disk says, not the parser
        logs.close()
        problem = failures.disk_problem([run_dir, checkpoint_root])
        if problem is None:
            raise
        raise problem from None
    finally:
        logs.close()
        logs.remove_error_files()
    for line in where_results_went(run_dir, checkpoint_root, logs.attempt_dir()):
        console.print(line, markup=False, highlight=False, soft_wrap=True)
    return 0


def where_results_went(run_dir: Path, checkpoint_root: Path, log_dir: Path | None) -> list[str]:
    """The run's last lines: where its final checkpoint, metrics, summary and logs are."""
    # lazy: it imports torch, which the launcher does not need until here
    from zerolaunch.checkpoint import CheckpointError, latest_checkpoint

    try:
        final = latest_checkpoint(checkpoint_root) if checkpoint_root.is_dir() else None
    except CheckpointError:
        final = None
    rows = [
        (
            "final checkpoint",
            f"{final}  (zerolaunch convert-checkpoint {checkpoint_root} OUT)" if final else None,
        ),
        ("metrics", run_dir / "metrics.jsonl"),
        ("summary", run_dir / "summary.json"),
        ("logs", log_dir),
    ]
    return ["results:"] + [
        f"  {name:<18}{value}"
        for name, value in rows
        if value is not None and (isinstance(value, str) or Path(value).exists())
    ]
