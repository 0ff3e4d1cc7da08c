"""`zerolaunch recipe show` on a recipe that breaks each engine option rule: exit 2, one paragraph naming the
file, the line and the key as written, no traceback; and once `zerolaunch train`, refused before any worker.

The cases are tests/_option_cases.py's (tests/unit/test_option_rules.py checks each has the engine's
rejection behind it and that every rule has one). `recipe show` runs in-process with typer's CliRunner.
"""

import pytest
from _option_cases import CASES
from typer.testing import CliRunner

from zerolaunch.cli.app import app

pytestmark = pytest.mark.e2e
runner = CliRunner()


@pytest.mark.parametrize("case", CASES, ids=[c.rule for c in CASES])
def test_recipe_show_refuses_a_broken_rule_with_exit_2(tmp_path, case):
    path = tmp_path / "recipe.yaml"
    path.write_text(case.recipe)
    result = runner.invoke(app, ["recipe", "show", str(path)], env={"COLUMNS": "2000"})
    assert result.exit_code == 2, result.output
    text = " ".join(result.stderr.split())
    assert f"{path} line {case.line}: `{case.key}`" in text, text
    assert case.needle in text
    assert "Traceback" not in result.output and "Traceback" not in result.stderr


def test_train_refuses_a_broken_rule_before_any_worker(cli, tiny_recipe, tmp_path):
    # issue #18's key (the engine let a negative value through below stage 3; the recipe check did not):
    # refused by the launcher with the --set flag and the key, exit 2, before a worker starts.
    flag = "zero_optimization.stage3_max_live_parameters=-1"
    proc = cli.run(
        tiny_recipe(),
        "--cpu",
        "1",
        "--set",
        flag,
        "--run-dir",
        tmp_path / "run",
        timeout=60,
        CUDA_VISIBLE_DEVICES="",
    )
    assert proc.returncode == 2, proc.stdout + proc.stderr
    text = " ".join(proc.stderr.split())
    assert f"--set {flag}: `deepspeed.zero_optimization.stage3_max_live_parameters` must be >= 0" in text, (
        text
    )
    assert "Traceback" not in proc.stderr and not (tmp_path / "run" / "logs").exists()
