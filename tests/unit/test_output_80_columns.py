"""What the commands print fits 80 columns without losing content: `recipe show` folds its notes instead of
cropping them, estimate-memory picks units that fit a small model's numbers, and every command's help spells
`--set` as KEY=VALUE. Leaves out: the end-of-run tables and step lines (test_report_tables.py,
test_report_reporter.py) and a run's closing lines (tests/e2e/test_run_dir_guard.py).
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from typer.testing import CliRunner

from zerolaunch.cli.app import app

REPO = Path(__file__).resolve().parents[2]
TINY = str(REPO / "recipes" / "tiny-gpt.yaml")


def _invoke(*args: str) -> str:
    result = CliRunner().invoke(app, list(args), env={"COLUMNS": "80"}, terminal_width=80)
    assert result.exit_code == 0, result.output
    return result.output


def test_recipe_show_folds_every_note_into_80_columns():
    from zerolaunch.config import load_recipe
    from zerolaunch.config.table import recipe_rows

    out = _invoke("recipe", "show", TINY)
    lines = out.splitlines()
    assert all(len(line) <= 80 for line in lines), max(lines, key=len)
    assert "…" not in out
    # the note column is the last cell of each table line; its pieces, in order, hold every note whole
    notes = "".join(line.split("│")[-2] for line in lines if line.startswith("│")).replace(" ", "")
    for *_, note in recipe_rows(load_recipe(TINY)):
        assert note.replace(" ", "") in notes, note
    assert "DeepSpeed'sdefault" in notes


def test_estimate_memory_of_a_small_model_uses_units_that_fit_it():
    out = _invoke("estimate-memory", TINY)
    assert "params 120,576 (121 k)" in out and "0.000 B" not in out
    assert "per GPU, MiB:" in out
    gpu_table = out[out.index("per GPU") : out.index("per CPU node")]
    rows = [line for line in gpu_table.splitlines() if re.match(r"^ [0-3] ", line)]
    # every row's params and peak are visible numbers (they read 0.00 in GiB), except stage 3 on one GPU
    # without offload, whose params are views of the fp32 master (counted under optim)
    assert rows and all(float(row.split()[-2]) > 1 for row in rows), rows
    aliased = [row.split()[:2] for row in rows if float(row.split()[2]) == 0]
    assert aliased == [["3", "-"]], rows


@pytest.mark.parametrize("command", [["train"], ["estimate-memory"], ["recipe", "show"]])
def test_help_spells_set_as_key_value(command):
    out = _invoke(*command, "--help")
    line = next(line for line in out.splitlines() if "--set" in line)
    assert "KEY=VALUE" in line and "K=V" not in line.replace("KEY=VALUE", "") and "list[str]" not in line
