"""A run whose run dir fills up: exit 2 with one paragraph on stderr naming the checkpoint, the error and
the bytes, no traceback (torch's agent used to die on the worker's empty error record with a
JSONDecodeError), and no `.tmp-step_*` left beside the checkpoints.

Needs a real 2 MiB tmpfs (root may mount one); elsewhere it is skipped, and the same paths are covered with a
simulated ENOSPC in tests/unit/test_disk_errors.py.
"""

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from _helpers import tiny_gpt_recipe, tmpfs

pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parents[2]
RECIPE = yaml.safe_dump(
    tiny_gpt_recipe(
        train={"steps": 4, "micro_batch_size": 4, "lr": 1.0e-2, "seed": 1234, "log_every": 1},
        checkpoint={"every": 2},
    ),
    sort_keys=False,
)


@pytest.fixture
def disk(tmp_path):
    folder = tmp_path / "disk"
    folder.mkdir()
    with tmpfs(folder, "2m") as mounted:
        if not mounted:
            pytest.skip("cannot mount a tmpfs here (not root): tests/unit/test_disk_errors.py simulates it")
        yield folder


def test_a_full_run_dir_is_one_paragraph_and_leaves_no_temp_checkpoint(disk, tmp_path):
    (tmp_path / "recipe.yaml").write_text(RECIPE)
    stat = os.statvfs(disk)
    # room for the logs, metrics and the step-2 checkpoint (about 330 KiB), not for step 4's as well
    (disk / "filler").write_bytes(b"\0" * (stat.f_bavail * stat.f_frsize - (600 << 10)))
    env = dict(os.environ, OMP_NUM_THREADS="1", COLUMNS="80")
    env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
    proc = subprocess.run(
        [sys.executable, "-m", "zerolaunch", "train", "recipe.yaml", "--cpu", "2", "--run-dir", disk / "R"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=150,
    )
    assert proc.returncode == 2, proc.stdout[-3000:] + proc.stderr[-3000:]
    err = " ".join(proc.stderr.split())
    assert err.startswith("error: cannot write the checkpoint of step 4 (rank ") or err.startswith(
        "error: cannot write the checkpoint of step 2 (rank "
    ), err
    assert "no space left on the device (it needs about " in err and "is free there)" in err
    assert "Traceback" not in proc.stderr + proc.stdout and "Errno" not in proc.stderr
    assert "JSONDecodeError" not in proc.stderr and "[rank" not in proc.stderr
    assert "error:" not in proc.stdout
    left = sorted(p.name for p in (disk / "R" / "checkpoints").iterdir())
    assert not [name for name in left if name.startswith(".tmp-")], left
