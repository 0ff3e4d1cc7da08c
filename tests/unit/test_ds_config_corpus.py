"""tests/data/ds_configs: real DeepSpeed configs, each with its expected outcome in EXPECTED.tsv.

A row says `loads` (load_recipe succeeds and the recipe table renders), `needs <package>` (a monitor:
loads where the package is installed, else refused naming the extra) or `refused: <text>` (a RecipeError
whose message names the reason). Every *.json in the folder must have a row, so a new config cannot be added
without stating what zerolaunch does with it.
"""

import importlib.util
from pathlib import Path

import pytest

from zerolaunch.config import RecipeError, load_recipe
from zerolaunch.config.table import render_recipe_table

CORPUS = Path(__file__).resolve().parents[1] / "data" / "ds_configs"


def _rows() -> list[tuple[str, int, str]]:
    rows = []
    for line in (CORPUS / "EXPECTED.tsv").read_text().splitlines():
        if line.startswith("#") or not line.strip():
            continue
        name, world, outcome, _source = line.split("\t")
        rows.append((name, int(world), outcome))
    return rows


def test_every_config_has_an_expected_outcome():
    listed = {name for name, _, _ in _rows()}
    assert listed == {p.name for p in CORPUS.glob("*.json")}


@pytest.mark.parametrize(("name", "world_size", "outcome"), _rows(), ids=[r[0] for r in _rows()])
def test_corpus_config(name, world_size, outcome):
    path = CORPUS / name
    if outcome.startswith("needs "):
        package = outcome.removeprefix("needs ")
        if importlib.util.find_spec(package) is None:
            outcome = f"refused: `pip install zerolaunch[{package}]`"
        else:
            outcome = "loads"
    if outcome == "loads":
        recipe = load_recipe(path, world_size=world_size)
        render_recipe_table(recipe)
        return
    assert outcome.startswith("refused: "), outcome
    with pytest.raises(RecipeError) as err:
        load_recipe(path, world_size=world_size)
    assert outcome.removeprefix("refused: ") in str(err.value)
