"""`zerolaunch recipe show RECIPE [--set KEY=VALUE ...] [--world-size N]`: the resolved recipe as a table.

Also `print_recipe`, which `zerolaunch train` reuses to show what it is about to run. typer + rich only;
the recipe machinery is imported inside the command so `zerolaunch --help` stays instant.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

import typer

from .errors import user_errors

if TYPE_CHECKING:
    from rich.console import Console

    from zerolaunch.config import Recipe

SET_HELP = "Override a recipe value, e.g. --set train.lr=3e-4 --set zero_optimization.stage=3 (repeatable; YAML values)."


def print_recipe(recipe: Recipe, console: Console) -> None:
    from zerolaunch.config import render_recipe_table

    console.print(render_recipe_table(recipe, width=console.width))
    console.print(
        "[dim]from: default = zerolaunch/DeepSpeed default, file = the recipe, --set = the command line, "
        'auto = an "auto" resolved, derived = computed from other values[/]'
    )


def register(app: typer.Typer) -> None:
    recipe_app = typer.Typer(
        help="Inspect recipes (YAML/JSON, or a DeepSpeed ds_config.json).", no_args_is_help=True
    )

    @recipe_app.command("show")
    def show(
        recipe: str = typer.Argument(
            ..., help="Recipe file (.yaml/.yml/.json) or a DeepSpeed ds_config.json."
        ),
        set_: list[str] = typer.Option([], "--set", help=SET_HELP, metavar="KEY=VALUE"),
        world_size: int = typer.Option(1, "--world-size", "-n", help="Ranks the batch rule assumes."),
        as_json: bool = typer.Option(False, "--json", help="Print the resolved recipe as JSON instead."),
        write: Path | None = typer.Option(
            None, "--write", help="Also write DIR/recipe.resolved.json (as `zerolaunch train` does)."
        ),
    ) -> None:
        """Load, check and resolve RECIPE, then show every value and where it came from."""
        from rich.console import Console

        from zerolaunch.config import load_recipe, save_resolved

        with user_errors():
            resolved = load_recipe(recipe, overrides=set_, world_size=world_size, check_builders=True)
            if as_json:
                typer.echo(json.dumps(resolved.to_json(), indent=2))
            else:
                print_recipe(resolved, Console())
            if write is not None:
                path = save_resolved(resolved, write)
                typer.echo(f"wrote {path}", err=as_json)

    app.add_typer(recipe_app, name="recipe")
