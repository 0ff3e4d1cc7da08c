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


_BREAK_AFTER = "._:/-,"
"""Where a dotted key, a builder path or a file name may break across lines (after the character)."""
_FROM_WIDTH = 7  # "default" / "derived"
_TABLE_OVERHEAD = 13  # 5 borders and one space of padding each side of 4 columns


def break_long_words(text: str, width: int) -> str:
    """`text` with every word longer than `width` broken onto lines after a `.`, `_`, `:`, `/`, `-` or `,`
    (mid-word only where a piece between them is itself longer): rich folds a long word at the column edge,
    mid-name (`train.micro_batch_si` / `ze`)."""
    if width < 1:
        return text
    words = []
    for word in text.split(" "):
        if len(word) <= width:
            words.append(word)
            continue
        pieces, line, start = [], "", 0
        for i, char in enumerate(word):
            if char in _BREAK_AFTER or i == len(word) - 1:
                piece = word[start : i + 1]
                start = i + 1
                if line and len(line) + len(piece) > width:
                    pieces.append(line)
                    line = ""
                line += piece
        pieces.append(line)
        words.append("\n".join(pieces))
    return " ".join(words)


def _shares(free: int, natural: list[int], weights: tuple[int, ...]) -> list[int]:
    """Widths that add up to at most `free`: by `weights`, but no column wider than its longest cell, the
    room it leaves going to the others (a wide console shows every row on one line)."""
    widths = list(natural)
    open_ = set(range(len(natural)))
    left = free
    while open_:
        total = sum(weights[i] for i in open_)
        share = {i: max(1, left * weights[i] // total) for i in open_}
        fits = [i for i in open_ if natural[i] <= share[i]]
        if not fits:
            for i in open_:
                widths[i] = share[i]
            break
        for i in fits:
            left -= natural[i]
            open_.remove(i)
    return widths


def render_recipe_table(
    recipe: Recipe, title: str | None = None, *, changed_only: bool = False, width: int | None = None
) -> Table:
    """`width`: the console's; the columns are then sized for it and long names break between their parts."""
    from rich.markup import escape
    from rich.table import Table

    table = Table(title=title or f"recipe {recipe.source or '(dict)'}", title_justify="left")
    # ratios, not minimum widths: a minimum is the longest word, and a table wider than the console is
    # cropped at its edge (an 80-column pipe lost the end of every note); these fold to any width
    rows = recipe_rows(recipe, changed_only=changed_only)
    free = max(width - _TABLE_OVERHEAD - _FROM_WIDTH, 24) if width else 0
    natural = [
        max([len(title)] + [len(row[i]) for row in rows])
        for i, title in ((0, "key"), (1, "value"), (3, "note"))
    ]
    key_w, value_w, note_w = _shares(free, natural, (5, 3, 4)) if free else (None, None, None)
    table.add_column("key", overflow="fold", ratio=5, width=key_w)
    table.add_column("value", overflow="fold", ratio=3, width=value_w)
    table.add_column("from", no_wrap=True, width=_FROM_WIDTH if free else None)
    table.add_column("note", overflow="fold", ratio=4, width=note_w)

    def cell(text: str, column_width: int | None) -> str:
        return escape(break_long_words(text, column_width) if column_width else text)

    for key, value, origin, note in rows:
        if not origin:
            table.add_row(f"[dim]{cell(key, key_w)}[/]", "", "", cell(note, note_w))
            continue
        table.add_row(
            cell(key, key_w),
            cell(value, value_w),
            f"[{ORIGIN_STYLES.get(origin, '')}]{origin}[/]",
            cell(note, note_w),
        )
    return table


def print_run_recipe(recipe: Recipe, console) -> None:
    """What `zerolaunch train` shows before it starts: the values that are not defaults, nothing cut."""
    source = recipe.source or "(dict)"
    rows = recipe_rows(recipe, changed_only=True)
    if recipe.entrypoint:
        # values derived from defaults (a batch, a cosine over 100 steps) are the built-in loop's: a script
        # trains as it says itself, and only what the recipe itself sets can reach it
        rows = [row for row in rows if row[2] != "derived"]
    defaults = sum(1 for key, _ in flat_items(recipe) if recipe.origins.get(key, "default") == "default")
    footer = (
        f"{defaults} more keys at their defaults: `zerolaunch recipe show {source}` lists every key, "
        "recipe.resolved.json in the run dir holds them all"
    )
    if recipe.entrypoint:
        footer += (
            ". The entrypoint script sets its own batch, schedule and steps; the recipe's train and deepspeed "
            "values apply only where it calls zerolaunch.initialize(model) without a config"
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
