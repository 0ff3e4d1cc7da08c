"""The resolved recipe as a rich table: every value, where it came from, and how it was resolved.

Rows are the leaves of `Recipe.to_json()` (see `schema.flat_items`), then the accepted DeepSpeed keys that
do nothing here, each with its reason. `recipe show` prints every row; a run prints only the rows whose
value is not a default (`print_run_recipe`), as a table on a terminal and as whole `key = value` lines in
a log or a pipe, where a table would be cut to the pipe's 80 columns. rich is imported lazily so
`import zerolaunch.config` stays light.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from .schema import Recipe, flat_items

if TYPE_CHECKING:
    from rich.table import Table

ORIGIN_STYLES = {
    "default": "dim",
    "file": "cyan",
    "--set": "bold magenta",
    "auto": "green",
    "derived": "yellow",
}


def _show(value: Any) -> str:
    if isinstance(value, str):
        return value
    return json.dumps(value)


def recipe_rows(recipe: Recipe, *, changed_only: bool = False) -> list[tuple[str, str, str, str]]:
    """(key, value, origin, note) of every leaf, then of each accepted key that does nothing (origin "").

    `changed_only`: leave out the leaves whose value is the default (origin "default").
    """
    rows = []
    shown = set()
    for key, value in flat_items(recipe):
        shown.add(key)
        origin = recipe.origins.get(key, "default")
        if changed_only and origin == "default":
            continue
        rows.append((key, _show(value), origin, recipe.notes.get(key, "")))
    for key, note in sorted(recipe.notes.items()):
        if key not in shown:
            rows.append((key, "", "", note))
    return rows


def render_recipe_table(recipe: Recipe, title: str | None = None, *, changed_only: bool = False) -> Table:
    from rich.markup import escape
    from rich.table import Table

    table = Table(title=title or f"recipe {recipe.source or '(dict)'}", title_justify="left")
    # ratios, not minimum widths: a minimum is the longest word, and a table wider than the console is
    # cropped at its edge (an 80-column pipe lost the end of every note); these fold to any width
    table.add_column("key", overflow="fold", ratio=5)
    table.add_column("value", overflow="fold", ratio=3)
    table.add_column("from", no_wrap=True)
    table.add_column("note", overflow="fold", ratio=4)
    for key, value, origin, note in recipe_rows(recipe, changed_only=changed_only):
        if not origin:
            table.add_row(f"[dim]{escape(key)}[/]", "", "", escape(note))
            continue
        table.add_row(
            escape(key), escape(value), f"[{ORIGIN_STYLES.get(origin, '')}]{origin}[/]", escape(note)
        )
    return table


def print_run_recipe(recipe: Recipe, console) -> None:
    """What `zerolaunch train` shows before it starts: the values that are not defaults, nothing cut."""
    source = recipe.source or "(dict)"
    rows = recipe_rows(recipe, changed_only=True)
    defaults = sum(1 for key, _ in flat_items(recipe) if recipe.origins.get(key, "default") == "default")
    footer = (
        f"{defaults} more keys at their defaults: `zerolaunch recipe show {source}` lists every key, "
        "recipe.resolved.json in the run dir holds them all"
    )
    if console.is_terminal:
        console.print(
            render_recipe_table(recipe, f"recipe {source} (values that are not defaults)", changed_only=True)
        )
        console.print(footer, style="dim", markup=False, highlight=False, soft_wrap=True)
        return
    # a file or a pipe: whole lines, however long, so no key, value or note is ever cut or folded
    lines = [f"recipe {source} (values that are not defaults):"]
    for key, value, origin, note in rows:
        detail = "; ".join(part for part in (origin, note) if part)
        lines.append(f"  {key} = {value}" + (f"  ({detail})" if detail else ""))
    lines.append(footer)
    for line in lines:
        console.print(line, markup=False, highlight=False, soft_wrap=True)
