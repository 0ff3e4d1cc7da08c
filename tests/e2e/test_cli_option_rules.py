"""`zerolaunch recipe show` on a recipe that breaks each engine option rule: exit 2, one paragraph naming the
file, the line and the key as written, no traceback (issue #18: no such recipe may reach the workers).

The cases are tests/_option_cases.py's (tests/unit/test_option_rules.py checks each has the engine's
rejection behind it and that every rule has one). In-process with typer's CliRunner; leaves out `train`, which
loads recipes through the same load_recipe.
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
