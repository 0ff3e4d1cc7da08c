"""config/paths.py: path-valued builder args start at the recipe's folder, one rule for model and data.

Recipes are loaded from a working directory other than their folder, so a path taken from the current
directory would fail or point elsewhere. Covers zerolaunch's own data builders (text, hf_text: missing path
is exit 2 at load), a tokenizer hub id not in the cache, and a user builder (existing paths resolved, others
passed as written, non-path args untouched). The HF model path: tests/e2e/test_preflight.py.
"""

from pathlib import Path

import pytest

from zerolaunch.config import load_recipe
from zerolaunch.config.errors import RecipeError


def _recipe(folder: Path, data: str) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "r.yaml"
    path.write_text(f"data:\n{data}\ntrain: {{steps: 1, micro_batch_size: 2}}\n")
    return path


@pytest.fixture
def elsewhere(tmp_path, monkeypatch):
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    monkeypatch.chdir(cwd)
    return cwd


def test_text_data_path_starts_at_the_recipe_folder(tmp_path, elsewhere):
    recipes = tmp_path / "recipes"
    (recipes / "data").mkdir(parents=True)
    (recipes / "data" / "input.txt").write_text("hello " * 100)
    (elsewhere / "data").mkdir()  # a same-named folder in the working directory must not win
    recipe = _recipe(
        recipes, "  builder: zerolaunch.data.text:build\n  args: {path: data/input.txt, seq_len: 8}"
    )
    loaded = load_recipe(str(recipe))
    assert loaded.data.args["path"] == str((recipes / "data" / "input.txt").resolve())
    assert loaded.data.args["seq_len"] == 8


def test_hf_text_path_list_and_tokenizer_folder(tmp_path, elsewhere):
    recipes = tmp_path / "recipes"
    for name in ("a.txt", "b.jsonl"):
        (recipes / "corpus").mkdir(parents=True, exist_ok=True)
        (recipes / "corpus" / name).write_text("x")
    (recipes / "tok").mkdir()
    recipe = _recipe(
        recipes,
        "  builder: zerolaunch.data.hf_text:build\n"
        "  args: {path: [corpus/a.txt, corpus/b.jsonl], tokenizer: tok, seq_len: 8}",
    )
    args = load_recipe(str(recipe)).data.args
    assert args["path"] == [str((recipes / "corpus" / n).resolve()) for n in ("a.txt", "b.jsonl")]
    assert args["tokenizer"] == str((recipes / "tok").resolve())


def test_missing_path_of_a_zerolaunch_builder_is_refused_at_load(tmp_path, elsewhere):
    (elsewhere / "input.txt").write_text("in the working directory only")
    recipe = _recipe(tmp_path / "recipes", "  builder: zerolaunch.data.text:build\n  args: {path: input.txt}")
    with pytest.raises(RecipeError) as info:
        load_recipe(str(recipe))
    msg = str(info.value)
    assert "data.args.path" in msg and "does not exist" in msg and "recipe's folder" in msg
    assert "r.yaml" in msg


def test_uncached_tokenizer_hub_id_is_refused(tmp_path, elsewhere, monkeypatch):
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "empty-cache"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    (tmp_path / "recipes").mkdir()
    (tmp_path / "recipes" / "c.txt").write_text("x")
    recipe = _recipe(
        tmp_path / "recipes",
        "  builder: zerolaunch.data.hf_text:build\n  args: {path: c.txt, tokenizer: some-org/never-cached}",
    )
    with pytest.raises(RecipeError, match=r"data\.args\.tokenizer.*is not cached"):
        load_recipe(str(recipe))


def test_user_builder_paths(tmp_path, elsewhere):
    recipes = tmp_path / "recipes"
    (recipes / "shards").mkdir(parents=True)
    (recipes / "vocab.json").write_text("{}")
    (recipes / "data.py").write_text("def build(**kw):\n    return [kw]\n")
    recipe = _recipe(
        recipes,
        "  builder: data.py:build\n"
        "  args: {shard_dir: shards, vocab_file: vocab.json, cache_dir: ./not-yet, name: shards, "
        "tokenizer: gpt2-never-cached-here}",
    )
    args = load_recipe(str(recipe)).data.args
    assert args["shard_dir"] == str((recipes / "shards").resolve())
    assert args["vocab_file"] == str((recipes / "vocab.json").resolve())
    assert args["cache_dir"] == "./not-yet"  # does not exist: the builder may create it
    assert args["name"] == "shards"  # not a path-valued name
    assert args["tokenizer"] == "gpt2-never-cached-here"  # a user builder may fetch it itself


def test_a_set_path_starts_at_the_current_directory(tmp_path, elsewhere):
    (elsewhere / "mine.txt").write_text("typed on the command line " * 10)
    recipe = _recipe(
        tmp_path / "recipes", "  builder: zerolaunch.data.text:build\n  args: {path: nowhere.txt, seq_len: 8}"
    )
    loaded = load_recipe(str(recipe), overrides=["data.args.path=mine.txt"])
    assert loaded.data.args["path"] == str((elsewhere / "mine.txt").resolve())
