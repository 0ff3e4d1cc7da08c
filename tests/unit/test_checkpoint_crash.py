"""kill -9 during a save leaves the previous checkpoint loadable, and the next save succeeds.

A subprocess saves step 1, then starts saving step 2 and is SIGKILLed at one of three points: in the
middle of writing its rank file, after the rank file and before the manifest, and after the folder was
renamed into place but before `latest` moved. The three run concurrently (each pays a torch import).
Uses FakeEngine (one rank); the folder protocol is the same for every rank count.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from _fake_engine import FakeEngine, FakeTensorSpec

from zerolaunch.checkpoint.load import load_checkpoint
from zerolaunch.checkpoint.save import latest_checkpoint, save_checkpoint

SPECS = [
    FakeTensorSpec("w", (17, 31), torch.float32, True),
    FakeTensorSpec("b", (31,), torch.float32, True),
    FakeTensorSpec("frozen", (3,), torch.float32, False),
]

_SCRIPT = """
import sys, time
from pathlib import Path
import torch
from zerolaunch.checkpoint import save as save_mod
from zerolaunch.checkpoint import tensorfile
sys.path.insert(0, sys.argv[3])  # tests/, where the fake engine lives
from _fake_engine import FakeEngine, FakeTensorSpec

root, point = Path(sys.argv[1]), sys.argv[2]
specs = [FakeTensorSpec("w", (17, 31), torch.float32, True), FakeTensorSpec("b", (31,), torch.float32, True),
         FakeTensorSpec("frozen", (3,), torch.float32, False)]
save_mod.save_checkpoint(FakeEngine(specs, rank=0, world_size=1, bucket_numel=100, seed=1), root, step=1)

def hang():
    (root.parent / f"reached-{point}").write_text("1")
    time.sleep(120)

if point == "rank_file":
    write = tensorfile.SafetensorsWriter.write
    def half_then_hang(self, name, tensor):
        write(self, name, tensor)
        self._file.flush()  # bytes on disk: a partial rank file, as a real crash leaves
        hang()
    tensorfile.SafetensorsWriter.write = half_then_hang
elif point == "manifest":
    write_json = save_mod.write_json
    def hang_before_manifest(path, obj):
        if path.name == "manifest.json":
            hang()
        write_json(path, obj)
    save_mod.write_json = hang_before_manifest
else:
    save_mod.write_text_atomic = lambda path, text: hang()
save_mod.save_checkpoint(FakeEngine(specs, rank=0, world_size=1, bucket_numel=100, seed=2), root, step=2)
"""

POINTS = ("rank_file", "manifest", "latest")


@pytest.fixture(scope="module")
def killed_roots(tmp_path_factory):
    base = tmp_path_factory.mktemp("crash")
    procs = {}
    for point in POINTS:
        (base / point).mkdir()
        procs[point] = subprocess.Popen(
            [sys.executable, "-c", _SCRIPT, str(base / point / "ck"), point, str(Path(__file__).parents[1])],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
    try:
        deadline = time.monotonic() + 240
        for point, proc in procs.items():
            marker = base / point / f"reached-{point}"
            while not marker.exists():
                if proc.poll() is not None:
                    pytest.fail(f"{point}: the saver exited early: {proc.communicate()[1][-2000:]}")
                if time.monotonic() > deadline:
                    pytest.fail(f"{point}: the saver never reached the kill point")
                time.sleep(0.05)
            os.kill(proc.pid, signal.SIGKILL)
            assert proc.wait(timeout=30) == -signal.SIGKILL
    finally:
        for proc in procs.values():
            if proc.poll() is None:
                proc.kill()
                proc.wait(timeout=30)
    return {point: base / point / "ck" for point in POINTS}


@pytest.mark.parametrize("point", POINTS)
def test_previous_checkpoint_survives_kill(killed_roots, point):
    root = killed_roots[point]
    assert latest_checkpoint(root).name == "step_000001"
    fresh = FakeEngine(SPECS, rank=0, world_size=1, bucket_numel=100, seed=None)
    load_checkpoint(fresh, root)
    want = FakeEngine(SPECS, rank=0, world_size=1, bucket_numel=100, seed=1)
    for kind in FakeEngine.KINDS:
        for name in ("w", "b"):
            assert torch.equal(fresh.state[kind][name], want.state[kind][name])
    if point != "latest":
        assert (root / ".tmp-step_000002").is_dir() and not (root / "step_000002").exists()


@pytest.mark.parametrize("point", POINTS)
def test_next_save_cleans_up_and_succeeds(killed_roots, point):
    root = killed_roots[point]
    engine = FakeEngine(SPECS, rank=0, world_size=1, bucket_numel=100, seed=3)
    save_checkpoint(engine, root, step=2)
    assert latest_checkpoint(root).name == "step_000002"
    assert sorted(p.name for p in root.iterdir()) == ["latest", "step_000001", "step_000002"]
    fresh = FakeEngine(SPECS, rank=0, world_size=1, bucket_numel=100, seed=None)
    load_checkpoint(fresh, root)
    assert torch.equal(fresh.state["master"]["w"], engine.state["master"]["w"])
