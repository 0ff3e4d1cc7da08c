"""What `zerolaunch train` shows before an entrypoint recipe starts: not the batch and schedule the built-in
loop would derive from defaults (a Trainer script never uses them), and one line saying where the script's
settings come from. Leaves out: the built-in loop's display (test_config_resolved.py)."""

from __future__ import annotations

import io
import json

from rich.console import Console

from zerolaunch.config import load_recipe
from zerolaunch.config.table import print_run_recipe


def _shown(tmp_path, recipe: dict) -> str:
    path = tmp_path / "r.json"
    path.write_text(json.dumps(recipe))
    buf = io.StringIO()
    print_run_recipe(load_recipe(path, world_size=2), Console(file=buf, width=200, force_terminal=False))
    return buf.getvalue()


def test_an_entrypoint_recipe_shows_no_derived_schedule_or_batch(tmp_path):
    script = tmp_path / "train.py"
    script.write_text("")
    out = _shown(tmp_path, {"entrypoint": str(script), "train": {"run_dir": str(tmp_path / "run")}})
    assert "entrypoint =" in out and "train.run_dir =" in out
    for key in ("engine.scheduler.", "train.global_batch_size", "engine.gradient_accumulation_steps"):
        assert key not in out, out
    assert "zerolaunch.initialize(model) without a config" in out


def test_the_built_in_loop_still_shows_them(tmp_path):
    out = _shown(tmp_path, {"train": {"run_dir": str(tmp_path / "run")}})
    assert "engine.scheduler.name" in out and "train.global_batch_size" in out
    assert "without a config" not in out
