"""train/reporting.StepReporter's plain fallback (the display package cannot be imported) writes
metrics.jsonl as MetricsFile does: after a resume each step once, a torn line dropped, strict JSON.

The display is made unimportable by hiding `rich.console`; `zerolaunch.report` is re-imported for the test
(monkeypatch restores both). Leaves out the rich path (tests/unit/test_report_reporter.py).
"""

import json
import math
import sys

from zerolaunch.train.reporting import StepReporter


def _strict(line: str) -> dict:
    def refuse(token):
        raise ValueError(f"not strict JSON: {token}")

    return json.loads(line, parse_constant=refuse)


def test_fallback_dedupes_steps_after_a_resume_and_writes_strict_json(tmp_path, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "rich.console", None)  # `import rich.console` raises ImportError
    for name in [n for n in sys.modules if n == "zerolaunch.report" or n.startswith("zerolaunch.report.")]:
        monkeypatch.delitem(sys.modules, name)
    # a crashed attempt logged steps 1-5 and was cut mid-line; the checkpoint it resumes from is step 3
    lines = [json.dumps({"step": s, "loss": 1.0 / s}) for s in range(1, 6)]
    (tmp_path / "metrics.jsonl").write_text("\n".join(lines) + '\n{"step": 6, "lo')
    reporter = StepReporter(
        tmp_path,
        total_steps=5,
        world_size=2,
        tokens_per_step=64,
        flops_per_token=None,
        device_name="cpu",
        log_every=1,
        dtype="fp32",
        start_step=3,
    )
    assert reporter._reporter is None  # the fallback really ran
    reporter.log(step=4, loss=0.5, grad_norm=1.0, lr=1e-3)
    reporter.log(step=5, loss=math.nan, grad_norm=math.inf, lr=1e-3)
    reporter.close()
    records = [_strict(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == [1, 2, 3, 4, 5]
    assert records[3]["loss"] == 0.5 and records[3]["tokens_seen"] == 4 * 64
    assert records[4]["loss"] is None and set(records[4]["nonfinite"]) == {"loss", "grad_norm"}
    assert "step 5/5 loss nan" in capsys.readouterr().out
