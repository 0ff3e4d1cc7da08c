"""The `zerolaunch` command: the typer app and its console-script entry point.

This module owns the command tree only. Each command lives in its own module exposing
`register(app)`: train.py, estimate.py, convert.py, recipe.py. Nothing heavy is imported here (no torch,
no recipe machinery), so `zerolaunch --help` answers instantly.
"""

from __future__ import annotations

import typer

from zerolaunch import __version__

from . import convert, estimate, prepare, recipe, train

app = typer.Typer(
    name="zerolaunch",
    help="Train PyTorch models with ZeRO stage 1/2/3 (and offload) from a YAML/JSON or DeepSpeed recipe.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    context_settings={"help_option_names": ["-h", "--help"]},
)


def _version(value: bool) -> None:
    if value:
        typer.echo(f"zerolaunch {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: bool = typer.Option(
        False, "--version", callback=_version, is_eager=True, help="Print the version and exit."
    ),
) -> None:
    """Train PyTorch models with ZeRO stage 1/2/3 (and offload) from a YAML/JSON or DeepSpeed recipe."""


for _module in (train, estimate, convert, recipe, prepare):
    _module.register(app)


def main() -> None:
    app()
