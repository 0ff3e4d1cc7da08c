"""`python -m zerolaunch.worker RUN_DIR/recipe.resolved.json [--device cpu|cuda] [--timeout S] [--resume R]`:
one training process, as the elastic agent starts it.

Owns the process's edges: torchelastic's environment (read through zerolaunch.launch.env: RANK, LOCAL_RANK,
WORLD_SIZE, TORCHELASTIC_RESTART_COUNT), the process group (nccl with device_id on CUDA, gloo on CPU, with
the collective timeout), and `@record`, which writes the exception to TORCHELASTIC_ERROR_FILE so the launcher
can show the root cause. The training itself is train/loop.py, or
the recipe's `entrypoint:` script (zerolaunch.train.entrypoint.run_entrypoint).
"""

from __future__ import annotations

import argparse
import datetime
import os
import signal
import sys
import time

from zerolaunch.launch import env, orphans


def _parse(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m zerolaunch.worker")
    p.add_argument("recipe", help="the run dir's recipe.resolved.json")
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    p.add_argument("--timeout", type=float, default=600.0, help="collective timeout, seconds")
    p.add_argument("--resume", default=None, help="auto, or a checkpoint folder / root")
    p.add_argument(
        "--no-verify",
        dest="verify",
        action="store_false",
        help="read checkpoint files without checking the manifest's crc32s",
    )
    return p.parse_args(argv)


def _attempt_store(worker_env: env.WorkerEnv, timeout: datetime.timedelta):
    """The store the process group rendezvouses in, or None for torch's env:// default.

    When the agent shares its own store with the workers (TORCHELASTIC_USE_AGENT_STORE=True: the static
    backend always does), that store outlives a restart, and torch's env:// adds no per-attempt prefix: a
    restarted gloo group can read the dead attempt's addresses and fail with "connection refused" (seen on
    torch 2.13). A prefix per restart keeps every attempt's keys apart. c10d with
    TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 gets a fresh store per attempt and needs nothing.
    """
    if not worker_env.agent_store:
        return None
    import torch.distributed as dist

    addr, port = env.master_addr_port()
    client = dist.TCPStore(addr, port, is_master=False, timeout=timeout)
    return dist.PrefixStore(f"zerolaunch/attempt_{worker_env.restart_count}", client)


class _Interrupt:
    """Whether this worker got Ctrl-C's SIGINT (forwarded by the agent to every worker)."""

    seen = False


def _on_sigint(signum, frame) -> None:
    _Interrupt.seen = True
    raise KeyboardInterrupt


def _interrupted_within(wait_s: float) -> bool:
    """True once SIGINT has arrived, waiting up to `wait_s` for it.

    On Ctrl-C the first worker to stop breaks the collective its peers are in, so a peer can raise gloo's
    "Connection closed by peer" a moment before its own SIGINT is handled; that peer is interrupted, not crashed.
    """
    deadline = time.monotonic() + wait_s
    try:
        while not _Interrupt.seen and time.monotonic() < deadline:
            time.sleep(0.05)
    except KeyboardInterrupt:
        pass
    return _Interrupt.seen


def main(argv: list[str] | None = None) -> None:
    # a kill -9 of the launcher takes this worker with it (armed before torch is imported)
    orphans.die_with_parent(env.launcher_pid())
    signal.signal(signal.SIGINT, _on_sigint)
    from torch.distributed.elastic.multiprocessing.errors import record

    from zerolaunch.config.errors import UserError
    from zerolaunch.train.nonfinite import NonFiniteStop
    from zerolaunch.util.exit_codes import NONFINITE_EXIT_CODE

    USER_ERROR_EXIT_CODE = UserError.exit_code

    try:
        record(_main_on_disk)(sys.argv[1:] if argv is None else argv)
    except NonFiniteStop:
        # record() wrote the message to the error file (the launcher prints it once); a distinct exit code,
        # and no traceback: the stop is the loop's decision, not a crash.
        sys.exit(NONFINITE_EXIT_CODE)
    except UserError:
        # bad input only a worker could meet (a damaged checkpoint, a builder's ValueError is not one):
        # record() wrote the message and traceback to the error file; the launcher prints the message once
        # and exits USER_ERROR_EXIT_CODE, as for bad input it catches itself.
        sys.exit(USER_ERROR_EXIT_CODE)
    except KeyboardInterrupt:
        # Ctrl-C: the agent forwards the launcher's SIGINT; the launcher prints the one line about it
        sys.exit(130)
    except Exception:
        if _interrupted_within(2.0):
            sys.exit(130)  # a collective broken by a peer that stopped first on the same Ctrl-C
        # record() has the traceback in the error record, which the launcher's panel shows; the log gets it
        # too, prefixed as torch's exception hook does, which keeps it out of the launcher's echo
        _print_dying_traceback()
        sys.exit(1)


def _print_dying_traceback() -> None:
    import traceback

    try:
        rank = env.WorkerEnv.read().rank
    except Exception:  # the environment itself is what failed: still print the traceback
        rank = 0
    text = traceback.format_exc().rstrip("\n")
    try:
        print("\n".join(f"[rank{rank}]: {line}" for line in text.split("\n")), file=sys.stderr, flush=True)
    except OSError:
        pass  # the log's disk is full: the error record still has it


def _output_path() -> str | None:
    """The file this process's stdout goes to (the rank's stdout.log), when it is one."""
    try:
        path = os.readlink("/proc/self/fd/1")
    except OSError:
        return None
    return path if os.path.isfile(path) else None


def _main_on_disk(argv: list[str]) -> None:
    """_main, with a write the disk refused (full, read-only, no permission) said as one paragraph."""
    from zerolaunch.util.disk_errors import disk_error, is_disk_error

    try:
        _main(argv)
    except OSError as err:
        if not is_disk_error(err):
            raise
        # no filename: a write to an open file, most often this rank's output log
        path = None if err.filename else _output_path()
        raise disk_error(err, path=path, fix="give the run another --run-dir") from None


def _main(argv: list[str]) -> None:
    import torch
    import torch.distributed as dist

    from zerolaunch.config import load_resolved
    from zerolaunch.train.context import RunContext
    from zerolaunch.train.loop import run_training
    from zerolaunch.zero import comm

    args = _parse(argv)
    worker_env = env.WorkerEnv.read()
    rank, local_rank, world_size = worker_env.rank, worker_env.local_rank, worker_env.world_size
    restart_count = worker_env.restart_count
    recipe = load_resolved(args.recipe)

    if recipe.entrypoint:
        # a user script replaces the built-in loop. No group is started for it: a plain torchrun script calls
        # init_process_group itself (a second one would fail), and zerolaunch.initialize() starts one from
        # torchrun's env when the script did not. The backend follows --device, the timeout --timeout.
        from zerolaunch.train.entrypoint import run_entrypoint

        if args.device == "cuda":
            torch.cuda.set_device(local_rank)
        try:
            backend = "nccl" if args.device == "cuda" else "gloo"
            run_entrypoint(recipe, args.recipe, backend=backend, timeout_s=args.timeout)
        except BaseException:
            comm.destroy_default_group(every_rank_finished=False)
            raise
        comm.destroy_default_group(every_rank_finished=True)
        return

    timeout = datetime.timedelta(seconds=args.timeout)
    store = _attempt_store(worker_env, timeout)
    if args.device == "cuda":
        torch.cuda.set_device(local_rank)
        device = torch.device("cuda", local_rank)
        # device_id binds the communicator eagerly: a wrong GPU count fails here, not in the first collective
        dist.init_process_group(
            "nccl", timeout=timeout, device_id=device, store=store, rank=rank, world_size=world_size
        )
    else:
        device = torch.device("cpu")
        dist.init_process_group("gloo", timeout=timeout, store=store, rank=rank, world_size=world_size)
    ctx = RunContext(
        rank=rank,
        local_rank=local_rank,
        world_size=world_size,
        device=device,
        group=None,
        restart_count=restart_count,
        resume=args.resume,
        verify_checkpoints=args.verify,
    )
    try:
        run_training(recipe, ctx)
    except BaseException:
        comm.destroy_default_group(every_rank_finished=False)
        raise
    comm.destroy_default_group(every_rank_finished=True)


if __name__ == "__main__":
    main()
