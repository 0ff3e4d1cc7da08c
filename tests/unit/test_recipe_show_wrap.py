"""`recipe show` at 80 and 120 columns breaks a long key only between its parts (after `.` or `_`), never
mid-word (`train.micro_batch_si` / `ze`), and stays within the width. Leaves out: the notes' content
(test_output_80_columns.py checks none is lost)."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from zerolaunch.cli.app import app
from zerolaunch.config import load_recipe
from zerolaunch.config.table import break_long_words, recipe_rows

REPO = Path(__file__).resolve().parents[2]
RECIPES = [REPO / "recipes" / "deepspeed" / "zero1.json", REPO / "recipes" / "tiny-gpt.yaml"]


@pytest.mark.parametrize("columns", [80, 120])
@pytest.mark.parametrize("recipe", RECIPES, ids=lambda p: p.name)
def test_keys_break_between_their_parts(recipe, columns):
    result = CliRunner().invoke(
        app, ["recipe", "show", str(recipe)], env={"COLUMNS": str(columns)}, terminal_width=columns
    )
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert all(len(line) <= columns for line in lines), max(lines, key=len)
    body = [line for line in lines if line.startswith("│")]
    pieces = [p for p in (line.split("│")[1].strip() for line in body) if p]
    keys = [key for key, *_ in recipe_rows(load_recipe(recipe))]
    broken = 0
    for key in keys:
        joined = ""
        while joined != key:
            assert pieces, f"{key} is not shown whole"
            piece = pieces.pop(0)
            joined += piece
            assert key.startswith(joined), (key, joined)
            if joined != key:
                broken += 1
                assert piece[-1] in "._", f"{key} breaks mid-word after {piece!r}"
    assert not pieces
    if columns == 80:
        assert broken  # the check above saw long keys broken at all


def test_break_long_words():
    assert (
        break_long_words("from deepspeed.train_micro_batch_size", 16)
        == "from deepspeed.train_\nmicro_batch_size"
    )
    assert break_long_words("short words stay", 5) == "short words stay"
    assert break_long_words("abcdefghij", 4) == "abcdefghij"  # no place to break: rich folds it
