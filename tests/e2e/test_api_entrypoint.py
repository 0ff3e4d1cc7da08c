"""zerolaunch.train.entrypoint.run_entrypoint: a recipe's `entrypoint:` script run in place of the built-in loop.

Covers: the script runs as __main__ with sys.argv set, its folder on sys.path and ZEROLAUNCH_RECIPE naming the
resolved recipe; the process state is restored afterwards; a missing script is a clear error; and
`initialize(model)` with no config picks up the recipe named by ZEROLAUNCH_RECIPE. Leaves out: torchrun
(test_api_torchrun.py).
"""

import json
import os
import sys
from types import SimpleNamespace

import pytest
import torch

from zerolaunch import api
from zerolaunch.launch.env import RECIPE_ENV
from zerolaunch.train.entrypoint import run_entrypoint

pytestmark = pytest.mark.e2e


def test_script_runs_as_main_with_argv_env_and_path(tmp_path, monkeypatch):
    monkeypatch.delenv(RECIPE_ENV, raising=False)
    (tmp_path / "helper_mod.py").write_text("VALUE = 7\n")
    script = tmp_path / "train me.py"
    out = tmp_path / "seen.json"
    script.write_text(
        "import json, os, sys\n"
        "import helper_mod\n"
        f"json.dump({{'name': __name__, 'argv': sys.argv, 'recipe': os.environ['ZEROLAUNCH_RECIPE'],"
        f" 'helper': helper_mod.VALUE}}, open({str(out)!r}, 'w'))\n"
    )
    resolved = tmp_path / "recipe.resolved.json"
    argv_before, path_before = list(sys.argv), list(sys.path)
    run_entrypoint(SimpleNamespace(entrypoint=str(script)), resolved)
    seen = json.loads(out.read_text())
    assert seen == {"name": "__main__", "argv": [str(script)], "recipe": str(resolved.resolve()), "helper": 7}
    assert sys.argv == argv_before and sys.path == path_before and RECIPE_ENV not in os.environ


def test_entrypoint_with_arguments(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "s.py").write_text("import sys\nopen('argv.txt', 'w').write(' | '.join(sys.argv[1:]))\n")
    run_entrypoint(SimpleNamespace(entrypoint="s.py --steps 3 'a b'"), tmp_path / "r.json")
    assert (tmp_path / "argv.txt").read_text() == "--steps | 3 | a b"


def test_missing_script_is_a_clear_error(tmp_path):
    with pytest.raises(FileNotFoundError, match="entrypoint: .*nope.py is not a file"):
        run_entrypoint(SimpleNamespace(entrypoint=str(tmp_path / "nope.py")), tmp_path / "r.json")
    with pytest.raises(ValueError, match="entrypoint is empty"):
        run_entrypoint(SimpleNamespace(entrypoint=" "), tmp_path / "r.json")


def test_initialize_without_config_reads_the_recipe_from_env(tmp_path, monkeypatch):
    config = pytest.importorskip("zerolaunch.config")
    if not hasattr(config, "load_recipe"):
        pytest.skip("zerolaunch.config.load_recipe is not there yet")
    recipe = config.load_recipe(
        {"train": {"lr": 0.125}, "deepspeed": {"zero_optimization": {"stage": 2}}}, world_size=1
    )
    resolved = tmp_path / "recipe.resolved.json"
    resolved.write_text(json.dumps(recipe.to_json()))
    monkeypatch.setenv(RECIPE_ENV, str(resolved))
    engine = api.initialize(torch.nn.Linear(5, 3))
    assert engine.recipe is not None
    assert engine.options.zero.stage == 2 and engine.options.optimizer.lr == 0.125
