"""`launch(request, console) -> exit code`: what `zerolaunch train` does after parsing its flags.

Resolve the recipe for world size nnodes x nproc, write run_dir/recipe.resolved.json, show the resolved
table, then run `python -m zerolaunch.worker RUN_DIR/recipe.resolved.json` on every local rank through
`torch.distributed.launcher.api.elastic_launch`. Single node: rendezvous on 127.0.0.1 at a port the OS
picked. Multi-node: at --rdzv-endpoint, with c10d (ranks by arrival) or static (--node-rank). A failure is
summarised as a panel (failures.py) and exit code 1; Ctrl-C stops every worker and exits 130.
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

from zerolaunch.launch import env
from zerolaunch.launch.devices import Workers, choose_workers
from zerolaunch.launch.ports import LOOPBACK, LaunchError, free_port, parse_endpoint
from zerolaunch.launch.runlock import RunLock, lock_name
from zerolaunch.launch.writable import check_writable

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
    # The workers' parent: each worker checks it is still there after arming PR_SET_PDEATHSIG (worker.py).
    env.set_launcher_pid(os.getpid())
    # pytorch issue 135712: a c10d restart reuses the rendezvous store and fails or hangs without this.
    os.environ["TORCH_DISABLE_SHARE_RDZV_TCP_STORE"] = "1"
    # Worker stdout goes to log files; unbuffered, rank 0's progress reaches the terminal as it happens.
    os.environ["PYTHONUNBUFFERED"] = "1"
    if workers.device == "cpu" or workers.nproc_per_node > 1:
        # as torchrun: N workers each spawning a thread per core would oversubscribe the machine
        os.environ.setdefault("OMP_NUM_THREADS", "1")
    # The agent's own chatter (configs, closing signals, its per-failure ERROR lines) would bury the
    # failure panel, which says the same once, with the root cause first.
    logging.getLogger("torch.distributed.elastic").setLevel(logging.CRITICAL)


def launch(req: LaunchRequest, console) -> int:
    """Run the job; returns the process exit code (0 ok, 1 training failed, 130 interrupted)."""
    from zerolaunch.config import load_recipe

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
    from zerolaunch.launch.preflight import preflight

    # bad input that every worker would meet: exit 2 before any starts
    for note in preflight(recipe, req.resume, world_size=req.nnodes * workers.nproc_per_node):
        console.print(note, markup=False, highlight=False, soft_wrap=True)
    run_dir = Path(recipe.train.run_dir)
    # before anything is written or started: a folder the run cannot write fails here, not in a worker
    check_writable(run_dir, "run_dir")
    check_writable(recipe.checkpoint.dir or run_dir / "checkpoints", "checkpoint.dir")
    lock = RunLock(run_dir, lock_name(req.nnodes, req.node_rank)).acquire()
    try:
        if lock.note:
            console.print(lock.note, markup=False, highlight=False, soft_wrap=True)
        return _launch_locked(req, recipe, rdzv, workers, run_dir, console)
    finally:
        lock.release()


def _launch_locked(req: LaunchRequest, recipe, rdzv: Rendezvous, workers: Workers, run_dir: Path, console):
    from zerolaunch.config import save_resolved
    from zerolaunch.config.table import print_run_recipe

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

    from zerolaunch.launch import failures
    from zerolaunch.launch.logs import ALL_RANKS_PREFIX, ConsoleLines, RunLogsSpecs
    from zerolaunch.launch.restarts import RestartAnnouncer, failures_noted
    from zerolaunch.report import LiveProgress

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
        from zerolaunch.util.exit_codes import NONFINITE_EXIT_CODE

        if failure.exitcode == NONFINITE_EXIT_CODE:
            # train.max_nonfinite_steps stopped the run on every rank: its message once, its own exit code
            # (README "When things go wrong"), no traceback panel.
            message = report.exception.removeprefix("NonFiniteStop: ")
            console.print(
                f"{message}\nfull log: {report.log_path}", markup=False, highlight=False, soft_wrap=True
            )
            return NONFINITE_EXIT_CODE
        from zerolaunch.config.errors import UserError

        if failure.exitcode == UserError.exit_code:
            # a UserError raised in a worker (worker.py): its message once, exit 2, as the launcher's own
            message = report.exception.split(": ", 1)[-1] if ": " in report.exception else report.exception
            console.print(
                f"error: {message}\nfull log: {report.log_path}",
                markup=False,
                highlight=False,
                soft_wrap=True,
            )
            return UserError.exit_code
        # in a log or a pipe the console is 80 columns: let the panel be as wide as its longest line
        panel_width = None if console.is_terminal else 1000
        console.print(failures.render(report, restarts_used=len(logs.attempts) - 1), width=panel_width)
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
    finally:
        logs.close()
    return 0
