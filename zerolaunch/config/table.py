"""The resolved recipe as a rich table: every value, where it came from, and how it was resolved.

Rows are the leaves of `Recipe.to_json()` (see `schema.flat_items`), then the accepted DeepSpeed keys that
do nothing here, each with its reason. rich is imported lazily so `import zerolaunch.config` stays light.
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


def render_recipe_table(recipe: Recipe, title: str | None = None) -> Table:
    from rich.table import Table

    table = Table(title=title or f"recipe {recipe.source or '(dict)'}", title_justify="left")
    table.add_column("key", overflow="fold", min_width=24)
    table.add_column("value", overflow="fold", min_width=10)
    table.add_column("from", no_wrap=True)
    table.add_column("note", overflow="fold", min_width=16)
    shown = set()
    for key, value in flat_items(recipe):
        origin = recipe.origins.get(key, "default")
        table.add_row(
            key, _show(value), f"[{ORIGIN_STYLES.get(origin, '')}]{origin}[/]", recipe.notes.get(key, "")
        )
        shown.add(key)
    for key, note in sorted(recipe.notes.items()):
        if key not in shown:
            table.add_row(f"[dim]{key}[/]", "", "", note)
    return table
