"""What `zerolaunch train` prints into a pipe (a log file, CI): only the recipe values that are not
defaults, each as one whole `key = value (origin; note)` line, and error paragraphs never cut at 80 columns.

Runs the real CLI as a subprocess with COLUMNS unset, so rich falls back to its 80-column default as in a
plain `zerolaunch train ... > log`. Leaves out the terminal layout (the table; tests/unit for the rows).
"""

import subprocess

import pytest

pytestmark = pytest.mark.e2e


def _run_piped(cli, *args, timeout=180):
    env = cli.env()
    env.pop("COLUMNS", None)
    env.pop("LINES", None)
    return subprocess.run(cli.cmd(*args), env=env, capture_output=True, text=True, timeout=timeout)


def test_piped_run_prints_only_non_defaults_whole(cli, tiny_recipe, tmp_path):
    proc = _run_piped(cli, tiny_recipe(steps=1), "--cpu", "1", "--run-dir", tmp_path / "run")
    out = proc.stdout
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
    lines = out.splitlines()
    # whole lines: the key, value, origin and note of a derived row are on one line, nothing folded
    assert (
        "  train.global_batch_size = 4  (derived; batch rule: global = micro * accum * world_size (1))"
        in lines
    )
    assert "  model.builder = zerolaunch.models.gpt:build  (file)" in lines
    assert "  engine.scheduler.name = none  (derived; from train.lr_schedule 'constant')" in lines
    # default-valued keys are left to `recipe show` and recipe.resolved.json
    for key in ("engine.zero.overlap_comm", "engine.optimizer.momentum", "train.weight_decay_1d"):
        assert key not in out
    assert "more keys at their defaults: `zerolaunch recipe show" in out
    assert "engine.zero.overlap_comm" in (tmp_path / "run" / "recipe.resolved.json").read_text()
    # the recipe part (before the launch line) is plain lines: no table borders in a pipe
    recipe_part = out.split("launching ")[0]
    assert "┃" not in recipe_part and "│" not in recipe_part


def test_piped_error_paragraph_is_not_hard_wrapped(cli, tiny_recipe, tmp_path):
    proc = _run_piped(
        cli,
        tiny_recipe(steps=1),
        "--cpu",
        "1",
        "--run-dir",
        tmp_path / "run",
        "--set",
        "train.gradient_clipingg=1",
    )
    assert proc.returncode == 2, proc.stderr[-3000:]
    errors = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(errors) == 1, proc.stderr  # one paragraph, one line however long
    assert errors[0].startswith("error: ") and len(errors[0]) > 80
    assert "Did you mean `gradient_clipping`?" in errors[0]  # the did-you-mean, whole
    assert "Traceback" not in proc.stderr
