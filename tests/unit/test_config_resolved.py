"""The resolved recipe: JSON round trip (recipe.resolved.json), origins for every shown value, the table,
builders imported on demand. Leaves out how values are resolved (the other test_config_* modules).
"""

import io
import json
import sys
from pathlib import Path

import pytest
from rich.console import Console

from zerolaunch.config import (
    RecipeError,
    import_builder,
    load_recipe,
    load_resolved,
    render_recipe_table,
    save_resolved,
)
from zerolaunch.config.schema import flat_items

DS_CONFIGS = Path(__file__).resolve().parents[1] / "data" / "ds_configs"
ORIGINS = {"default", "file", "--set", "auto", "derived"}


@pytest.mark.parametrize("name", ["ds_zero1.json", "hf_zero2.json", "hf_zero3.json"])
def test_round_trip_and_origins_complete(tmp_path, name):
    recipe = load_recipe(DS_CONFIGS / name, overrides=["train.steps=7"], world_size=2)
    path = save_resolved(recipe, tmp_path / "run")
    assert path.name == "recipe.resolved.json"
    again = load_resolved(tmp_path / "run")
    assert again == recipe
    assert json.loads(path.read_text()) == recipe.to_json()
    for key, _ in flat_items(recipe):
        assert recipe.origins.get(key) in ORIGINS, key


def test_a_file_with_the_removed_unused_zero_fields_still_loads(tmp_path):
    # earlier versions wrote allgather_bucket_size and contiguous_gradients, which the engine never read
    recipe = load_recipe(DS_CONFIGS / "hf_zero2.json", world_size=2)
    data = recipe.to_json()
    data["engine"]["zero"] |= {"allgather_bucket_size": 200_000_000, "contiguous_gradients": True}
    (tmp_path / "old.json").write_text(json.dumps(data))
    assert load_resolved(tmp_path / "old.json") == recipe


def test_load_resolved_errors(tmp_path):
    with pytest.raises(RecipeError, match="does not exist"):
        load_resolved(tmp_path / "nothing.json")
    (tmp_path / "other.json").write_text('{"train": {}}')
    with pytest.raises(RecipeError, match="not a resolved zerolaunch recipe"):
        load_resolved(tmp_path / "other.json")


def test_table_shows_values_origins_and_notes():
    recipe = load_recipe(DS_CONFIGS / "hf_zero3.json", overrides=["train.lr=1e-4"], world_size=2)
    console = Console(file=io.StringIO(), width=200, color_system=None)
    console.print(render_recipe_table(recipe))
    text = console.file.getvalue()
    assert "engine.zero.reduce_bucket_size" in text and "4096" in text and "h*h with h=64" in text
    assert "--set" in text and "auto" in text and "derived" in text
    assert "deepspeed.zero_optimization.sub_group_size" in text and "no effect" in text


def test_import_builder_module_and_file_forms(tmp_path):
    (tmp_path / "mine.py").write_text("def build(**kw):\n    return ('built', kw)\nVALUE = 3\n")
    fn = import_builder("mine.py:build", tmp_path)
    assert fn(a=1) == ("built", {"a": 1})
    assert import_builder("json:dumps") is json.dumps
    with pytest.raises(RecipeError, match="has no `nope`"):
        import_builder("mine.py:nope", tmp_path)
    with pytest.raises(RecipeError, match="not callable"):
        import_builder("mine.py:VALUE", tmp_path)
    with pytest.raises(RecipeError, match="cannot be imported"):
        import_builder("no_such_pkg_zl.models:build")
    (tmp_path / "broken.py").write_text("raise RuntimeError('boom')\n")
    with pytest.raises(RecipeError, match="RuntimeError: boom"):
        import_builder("broken.py:build", tmp_path)


def test_check_builders_imports_at_load(tmp_path):
    (tmp_path / "m.py").write_text("def build(**kw):\n    return None\n")
    (tmp_path / "r.yaml").write_text("model:\n  builder: m.py:build\ndata:\n  builder: m.py:missing\n")
    load_recipe(tmp_path / "r.yaml")  # the form is fine; nothing imported
    with pytest.raises(RecipeError, match="data.builder"):
        load_recipe(tmp_path / "r.yaml", check_builders=True)


def test_importing_config_does_not_import_torch():
    import subprocess

    code = "import sys, zerolaunch.config, zerolaunch.config.load; sys.exit('torch' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], timeout=60).returncode == 0
