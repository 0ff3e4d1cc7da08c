"""`zerolaunch train RECIPE [--gpus N | --cpu N] [--set k=v]... [--run-dir D] [--resume auto|PATH] ...`.

typer + rich only: flags in, `zerolaunch.launch.launcher.launch(...)` out (imported inside the command, so
`zerolaunch --help` never imports torch). A UserError (bad recipe, bad flag, no GPU) is printed as one
paragraph with exit code 2; a failed run exits 1, an interrupted one 130.
"""

from __future__ import annotations

from typing import Annotated

import typer


def train(
    recipe: Annotated[str, typer.Argument(help="Recipe file (YAML/JSON) or a DeepSpeed ds_config.json.")],
    gpus: Annotated[
        int | None, typer.Option("--gpus", help="Workers per node, one per GPU (default: all).")
    ] = None,
    cpu: Annotated[int | None, typer.Option("--cpu", help="Run N gloo workers on the CPU instead.")] = None,
    sets: Annotated[
        list[str] | None,
        typer.Option(
            "--set",
            help="Override a recipe value, e.g. --set train.steps=50 (repeatable; YAML values).",
            metavar="KEY=VALUE",
        ),
    ] = None,
    run_dir: Annotated[
        str | None, typer.Option("--run-dir", help="Run folder (overrides train.run_dir).")
    ] = None,
    resume: Annotated[
        str | None, typer.Option("--resume", help="auto (latest checkpoint, if any) or a checkpoint path.")
    ] = None,
    restart: Annotated[
        bool,
        typer.Option(
            "--restart",
            help="Start over in a run dir that holds an earlier run: its files are moved aside to "
            "RUN_DIR/previous-<time>/ first (nothing is deleted). With --resume of another run's checkpoint: "
            "start over from that checkpoint.",
        ),
    ] = False,
    nnodes: Annotated[
        int | None, typer.Option("--nnodes", help="Nodes in the job (default 1, or SLURM_NNODES).")
    ] = None,
    node_rank: Annotated[
        int | None, typer.Option("--node-rank", help="This node's rank (static backend).")
    ] = None,
    rdzv_endpoint: Annotated[
        str | None, typer.Option("--rdzv-endpoint", help="HOST:PORT of node 0, the same on every node.")
    ] = None,
    rdzv_backend: Annotated[
        str | None, typer.Option("--rdzv-backend", help="c10d or static (default c10d; static under SLURM).")
    ] = None,
    verify: Annotated[
        bool,
        typer.Option(
            "--verify/--no-verify",
            help="Check every checkpoint file against the crc32s in its manifest when --resume or "
            "model.init_from reads it (--no-verify: read a damaged one unchecked).",
        ),
    ] = True,
    max_restarts: Annotated[
        int, typer.Option("--max-restarts", help="Restart a failed worker group K times.")
    ] = 0,
    run_id: Annotated[str | None, typer.Option("--run-id", help="Job id, the same on every node.")] = None,
    timeout: Annotated[float, typer.Option("--timeout", help="Collective timeout, seconds.")] = 600.0,
    all_ranks: Annotated[
        bool, typer.Option("--all-ranks", help="Show every rank's output, prefixed.")
    ] = False,
    slurm: Annotated[
        bool | None,
        typer.Option(
            "--slurm/--no-slurm", help="Take nodes, ranks and endpoint from SLURM_* (default: if set)."
        ),
    ] = None,
    hostfile: Annotated[
        str | None,
        typer.Option("--hostfile", help="DeepSpeed hostfile ('HOST slots=N'): start every host over ssh."),
    ] = None,
    include: Annotated[
        str, typer.Option("--include", help="With --hostfile: only these hosts/slots, e.g. h1:0,1@h2.")
    ] = "",
    exclude: Annotated[
        str, typer.Option("--exclude", help="With --hostfile: all but these hosts/slots, e.g. h1:3.")
    ] = "",
    exports: Annotated[
        list[str] | None,
        typer.Option("--export", help="With --hostfile: send variable NAME (or NAME=VALUE) to every host."),
    ] = None,
    stop_on_stdin_eof: Annotated[bool, typer.Option("--stop-on-stdin-eof", hidden=True)] = False,
) -> None:
    """Train a model from a recipe on N GPUs or CPU workers (torch elastic under the hood)."""
    from rich.console import Console

    from zerolaunch.config.errors import UserError
    from zerolaunch.launch.launcher import LaunchRequest, launch
    from zerolaunch.launch.slurm import apply_slurm, render_origins

    console = Console()
    request = LaunchRequest(
        recipe=recipe,
        gpus=gpus,
        cpu=cpu,
        sets=list(sets or []),
        run_dir=run_dir,
        resume=resume,
        restart=restart,
        verify=verify,
        nnodes=1 if nnodes is None else nnodes,
        node_rank=node_rank,
        rdzv_endpoint=rdzv_endpoint,
        rdzv_backend=rdzv_backend or "c10d",
        max_restarts=max_restarts,
        run_id=run_id,
        timeout_seconds=timeout,
        all_ranks=all_ranks,
    )
    try:
        if hostfile is not None:
            from zerolaunch.launch.hostfile import launch_hosts

            if nnodes is not None or node_rank is not None or rdzv_backend is not None or slurm:
                raise UserError(
                    "--hostfile decides nodes, node ranks and the (static) rendezvous itself; drop "
                    "--nnodes/--node-rank/--rdzv-backend/--slurm"
                )
            code = launch_hosts(
                request,
                hostfile=hostfile,
                include=include,
                exclude=exclude,
                exports=list(exports or []),
                console=console,
            )
            if code:
                raise typer.Exit(code)
            return
        if include or exclude or exports:
            raise UserError("--include, --exclude and --export only apply with --hostfile HOSTS")
        if stop_on_stdin_eof:
            from zerolaunch.launch.hostfile import stop_when_stdin_closes

            stop_when_stdin_closes()
        request, origins = apply_slurm(
            request, force=slurm, nnodes_given=nnodes is not None, backend_given=rdzv_backend is not None
        )
        if origins:
            console.print(render_origins(origins))
        code = launch(request, console)
    except UserError as err:
        from .errors import print_user_error

        print_user_error(err)  # soft-wrapped: one paragraph, never cut at 80 columns in a log
        raise typer.Exit(err.exit_code) from None
    if code:
        raise typer.Exit(code)


def register(app: typer.Typer) -> None:
    app.command("train")(train)


if __name__ == "__main__":
    _app = typer.Typer(add_completion=False)
    register(_app)
    _app()
