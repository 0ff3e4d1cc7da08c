"""Offload keys that do nothing are noted as such, never shown as in use.

offload_param.buffer_count sizes no buffer here (offload_param on nvme reads each unit's shard into a buffer of
its own), so DeepSpeed's key is accepted and noted "no effect", and the engine row says so too. Keys that only
one device reads (nvme_path, offload_optimizer.buffer_count: nvme; pin_memory: any offload) are noted when the
user wrote them for another device. Checked in the recipe's notes and in `recipe show`'s rows; the keys the
device does read carry no such note.
"""

from __future__ import annotations

import json

from typer.testing import CliRunner

from zerolaunch.cli.app import app
from zerolaunch.config import load_recipe

Z = "deepspeed.zero_optimization"
E = "engine.zero"


def _ds(tmp_path, zero: dict):
    file = tmp_path / "ds_config.json"
    file.write_text(json.dumps({"train_micro_batch_size_per_gpu": 1, "zero_optimization": zero}))
    return file


def _rows(file) -> dict[str, str]:
    shown = CliRunner().invoke(app, ["recipe", "show", str(file)], env={"COLUMNS": "400"})
    assert shown.exit_code == 0, shown.output
    return {line.split()[1]: line for line in shown.output.splitlines() if line.startswith("│")}


def test_offload_param_buffer_count_is_noted_without_effect(tmp_path):
    file = _ds(
        tmp_path,
        {
            "stage": 3,
            "offload_param": {"device": "nvme", "nvme_path": str(tmp_path), "buffer_count": 8},
            "offload_optimizer": {"device": "nvme", "nvme_path": str(tmp_path), "buffer_count": 3},
        },
    )
    recipe = load_recipe(file)
    assert "no effect" in recipe.notes[f"{Z}.offload_param.buffer_count"]
    assert "no effect" in recipe.notes[f"{E}.offload_param.buffer_count"]
    rows = _rows(file)
    assert "no effect" in rows[f"{Z}.offload_param.buffer_count"]
    assert "no effect" in rows[f"{E}.offload_param.buffer_count"]
    # on nvme the optimizer's staging buffers are real: used, no note
    assert recipe.engine.zero.offload_optimizer.buffer_count == 3
    used = [f"{E}.offload_optimizer.{k}" for k in ("buffer_count", "nvme_path", "pin_memory")]
    used += [f"{E}.offload_param.{k}" for k in ("nvme_path", "pin_memory")]
    assert not [k for k in used if k in recipe.notes]
    assert all(rows[k].split("│")[4].strip() == "" for k in used)


def test_keys_the_device_does_not_read_are_noted(tmp_path):
    file = _ds(
        tmp_path,
        {
            "stage": 3,
            "offload_optimizer": {"device": "cpu", "nvme_path": str(tmp_path), "buffer_count": 3},
            "offload_param": {"device": "none", "pin_memory": True, "nvme_path": str(tmp_path)},
        },
    )
    recipe = load_recipe(file)
    for key in ("offload_optimizer.nvme_path", "offload_optimizer.buffer_count", "offload_param.nvme_path"):
        assert "no effect" in recipe.notes[f"{E}.{key}"], key
    assert "nothing is offloaded" in recipe.notes[f"{E}.offload_param.pin_memory"]
    assert f"{E}.offload_optimizer.pin_memory" not in recipe.notes  # cpu pins its buffers
    assert "no effect" in _rows(file)[f"{E}.offload_optimizer.buffer_count"]
