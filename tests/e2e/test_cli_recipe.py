"""The command line shell: `zerolaunch recipe show`, user errors as one red paragraph + exit 2, fast --help.

Uses typer's CliRunner in-process (plus one real subprocess for --help start-up). Leaves out `train`,
`estimate-memory` and `convert-checkpoint` (their owners test them).
"""

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from zerolaunch.cli.app import app

pytestmark = pytest.mark.e2e
DS_CONFIGS = Path(__file__).resolve().parents[1] / "data" / "ds_configs"
runner = CliRunner()


def test_recipe_show_renders_the_table():
    result = runner.invoke(
        app,
        ["recipe", "show", str(DS_CONFIGS / "hf_zero3.json"), "--set", "train.lr=1e-4", "-n", "2"],
        env={"COLUMNS": "200"},
    )
    assert result.exit_code == 0, result.output
    assert "engine.zero.stage" in result.output and "--set" in result.output and "auto" in result.output


def test_recipe_show_json_and_write(tmp_path):
    result = runner.invoke(
        app,
        [
            "recipe",
            "show",
            str(DS_CONFIGS / "hf_zero2.json"),
            "--json",
            "--set",
            "zero_optimization.stage=1",
            "--write",
            str(tmp_path / "run"),
        ],
    )
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data["engine"]["zero"]["stage"] == 1 and data["origins"]["engine.zero.stage"] == "--set"
    assert json.loads((tmp_path / "run" / "recipe.resolved.json").read_text()) == data


@pytest.mark.parametrize(
    ("content", "extra", "needle"),
    [
        ("train:\n  stpes: 3\n", [], "Did you mean `steps`?"),
        ("train:\n  lr: [1\n", [], "not valid YAML"),
        (
            "deepspeed:\n  optimizer:\n    type: Lamb\n",
            [],
            "DeepSpeed's Lamb optimizer is not supported by zerolaunch",
        ),
        ("model:\n  builder: no_such_pkg_zl.m:build\n", [], "cannot be imported"),
        ("train:\n  global_batch_size: 10\n  micro_batch_size: 4\n", [], "not divisible"),
        ("train: {}\n", ["--set", "zero_optimization.stage=4"], "between 0 and 3"),
        ("train: {}\n", ["--set", "zero_optimization.offload_param.device=cpu"], "only ZeRO stage 3"),
    ],
)
def test_user_errors_are_one_paragraph_and_exit_2(tmp_path, content, extra, needle):
    path = tmp_path / "recipe.yaml"
    path.write_text(content)
    result = runner.invoke(app, ["recipe", "show", str(path), *extra])
    assert result.exit_code == 2
    assert needle in result.stderr.replace("\n", " ")
    assert "Traceback" not in result.output and "Traceback" not in result.stderr


def test_missing_recipe_file():
    result = runner.invoke(app, ["recipe", "show", "definitely/missing.yaml"])
    assert result.exit_code == 2 and "does not exist" in result.stderr


def test_help_is_fast_and_does_not_import_torch():
    code = (
        "import sys, time; t = time.perf_counter(); from zerolaunch.cli.app import app; "
        "sys.exit(3 if 'torch' in sys.modules else 0)"
    )
    assert subprocess.run([sys.executable, "-c", code], timeout=60).returncode == 0
    start = time.perf_counter()
    out = subprocess.run(
        [sys.executable, "-m", "zerolaunch", "--help"], capture_output=True, text=True, timeout=60
    )
    elapsed = time.perf_counter() - start
    assert out.returncode == 0 and "recipe" in out.stdout
    assert elapsed < 5.0  # generous on a shared 2-core box; ~0.3 s when idle
