"""convert-checkpoint's OUT: never the source, never holding it, never inside it (either way round is exit 2
naming both paths, and nothing is deleted); `--force` replaces only a previous conversion's output; a
`latest` file that is not text is one paragraph.

Leaves out: what a conversion writes (tests/e2e/test_convert_*.py).
"""

from __future__ import annotations

import hashlib
import re
from pathlib import Path

import pytest
import torch
from _fake_engine import FakeEngine, FakeTensorSpec
from typer.testing import CliRunner

from zerolaunch.checkpoint.save import save_checkpoint
from zerolaunch.cli.app import app

SPECS = [FakeTensorSpec("w", (17, 31), torch.float32, True), FakeTensorSpec("b", (5,), torch.float32, True)]


def _convert(*args) -> tuple[int, str]:
    result = CliRunner().invoke(app, ["convert-checkpoint", *map(str, args), "--no-progress"])
    return result.exit_code, result.output + (result.stderr if result.stderr_bytes is not None else "")


def _tree(folder: Path) -> dict[str, str]:
    return {
        str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(folder.rglob("*"))
        if p.is_file()
    }


def _one_paragraph(code: int, output: str) -> None:
    assert code == 2, output
    assert "Traceback" not in output and not re.search(r"\b[A-Z]\w*(Error|Exception)\b", output), output


@pytest.fixture
def run_dir(tmp_path) -> Path:
    engine = FakeEngine(SPECS, rank=0, world_size=1, bucket_numel=4096, seed=1)
    for step in (10, 20):
        save_checkpoint(engine, tmp_path / "RUN" / "checkpoints", step=step)
    return tmp_path / "RUN"


@pytest.mark.parametrize(
    "src, out",
    [
        ("checkpoints/step_000020", "checkpoints"),  # OUT holds the source: every checkpoint would go
        ("checkpoints/step_000020", "."),
        ("checkpoints", "checkpoints/step_000010"),  # OUT lies inside the source
        ("checkpoints", "checkpoints"),
        ("checkpoints/step_000020", "checkpoints/step_000020/model.safetensors"),
    ],
)
def test_out_that_is_holds_or_lies_inside_the_source_is_refused_and_deletes_nothing(run_dir, src, out):
    before = _tree(run_dir)
    code, output = _convert(run_dir / src, run_dir / out, "--force")
    _one_paragraph(code, output)
    flat = " ".join(output.split())
    assert f"OUT {run_dir / out} " in flat and f"the source {run_dir / src}" in flat, output
    assert _tree(run_dir) == before


def test_force_replaces_only_a_previous_conversion_output(run_dir, tmp_path):
    src = run_dir / "checkpoints"
    out = tmp_path / "out"
    out.mkdir()
    (out / "notes.md").write_text("mine")
    before = _tree(out)
    for force in ([], ["--force"]):
        code, output = _convert(src, out, *force)
        _one_paragraph(code, output)
        assert "notes.md" in output, output
    assert _tree(out) == before
    (out / "notes.md").unlink()
    (out / "step_000001").mkdir()  # a folder of checkpoints is no conversion output
    code, output = _convert(src, out, "--force")
    _one_paragraph(code, output)
    assert "step_000001/" in output
    (out / "step_000001").rmdir()
    assert _convert(src, out, "--force")[0] == 0  # an empty folder
    assert (out / "model.safetensors").is_file()
    assert _convert(src, out, "--force")[0] == 0  # a previous conversion
    code, output = _convert(src, out)
    _one_paragraph(code, output)
    assert "--force" in output
    # reshard output (a checkpoint folder) is replaced by the same command
    assert _convert(src, tmp_path / "resharded", "--to-world-size", "2")[0] == 0
    assert _convert(src, tmp_path / "resharded", "--to-world-size", "2", "--force")[0] == 0
    # a file where a folder goes, a folder where a file goes
    (tmp_path / "file").write_text("important")
    code, output = _convert(src, tmp_path / "file", "--force")
    _one_paragraph(code, output)
    assert "is a file" in output and (tmp_path / "file").read_text() == "important"
    (tmp_path / "w.safetensors").mkdir()
    code, output = _convert(src, tmp_path / "w.safetensors", "--force")
    _one_paragraph(code, output)
    assert "is a folder" in output and (tmp_path / "w.safetensors").is_dir()
    assert _convert(src, tmp_path / "one.safetensors")[0] == 0
    assert _convert(src, tmp_path / "one.safetensors", "--force")[0] == 0


def test_a_latest_that_is_not_text_is_one_paragraph(run_dir, tmp_path):
    # a folder with no zerolaunch checkpoint in it: taken for a DeepSpeed save dir
    ds = tmp_path / "ds"
    (ds / "global_step5").mkdir(parents=True)
    (ds / "latest").write_bytes(b"global_step\xff\xfe5")
    code, output = _convert(ds, tmp_path / "o1")
    _one_paragraph(code, output)
    assert str(ds / "latest") in output and "not text" in output, output
    # a zerolaunch checkpoint root
    (run_dir / "checkpoints" / "latest").write_bytes(b"step_\xff\xfe")
    code, output = _convert(run_dir / "checkpoints", tmp_path / "o2")
    _one_paragraph(code, output)
    assert "latest" in output and "step_000020" in output, output
