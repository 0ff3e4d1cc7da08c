"""Writers that share a run_dir (every node of a multi-node run) must not take each other's temp files.

The two-node e2e test hung under load because both launchers wrote run_dir/recipe.resolved.json through
one fixed temp name: node A's rename moved the temp file node B had just written, B's rename raised
FileNotFoundError, B's launcher died before the rendezvous, and A waited for it. These tests force that
interleaving deterministically: a second writer runs in the middle of the first one's rename.
"""

import json
import os

import pytest

from zerolaunch.config import load_recipe
from zerolaunch.config.load import RESOLVED_NAME, load_resolved, save_resolved
from zerolaunch.util import atomic

RECIPES = os.path.join(os.path.dirname(__file__), "..", "..", "recipes")


def _interleave_second_writer(monkeypatch, second_write):
    """Run `second_write` once, just before the first writer's os.replace."""
    real_replace = os.replace
    state = {"done": False}

    def replace(src, dst):
        if not state["done"]:
            state["done"] = True
            second_write()
        return real_replace(src, dst)

    monkeypatch.setattr(os, "replace", replace)


def test_two_launchers_write_the_resolved_recipe_at_once(tmp_path, monkeypatch):
    recipe = load_recipe(os.path.join(RECIPES, "tiny-gpt.yaml"), world_size=2)
    _interleave_second_writer(monkeypatch, lambda: save_resolved(recipe, tmp_path))
    save_resolved(recipe, tmp_path)  # raised FileNotFoundError with a shared temp name
    assert load_resolved(tmp_path) == recipe
    assert sorted(p.name for p in tmp_path.iterdir()) == [RESOLVED_NAME]


def test_write_text_atomic_with_two_writers(tmp_path, monkeypatch):
    target = tmp_path / "latest"
    _interleave_second_writer(monkeypatch, lambda: atomic.write_text_atomic(target, json.dumps({"w": 2})))
    atomic.write_text_atomic(target, json.dumps({"w": 1}))
    assert json.loads(target.read_text()) == {"w": 1}  # the last rename wins, whole
    assert sorted(p.name for p in tmp_path.iterdir()) == ["latest"]


@pytest.mark.parametrize("name", ["recipe.resolved.json", "latest"])
def test_temp_names_differ_per_writer(name):
    assert atomic.writer_unique_name(name) != atomic.writer_unique_name(name)
