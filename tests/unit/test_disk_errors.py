"""A write the disk refuses (full, read-only, no permission) is one paragraph naming the path, the error and
the bytes: the shared helper (zerolaunch/util/disk_errors.py), a checkpoint save (no `.tmp-step_*` left, the
previous checkpoint and `latest` intact), convert-checkpoint (no temp folder left), metrics.jsonl, and the
launcher's side (worker error records kept off the run dir, the dying traceback kept out of the echo, the
full disk named when torch's agent cannot read a record).

A real 1 MiB tmpfs is used where this process may mount one (root); elsewhere the write is made to fail
with the same errno. Root ignores permissions, so EACCES is always simulated. Leaves out: a whole run on
a full disk (tests/e2e/test_disk_full.py).
"""

from __future__ import annotations

import errno
import io
import os
import subprocess

import pytest
import torch
from _fake_engine import FakeEngine, FakeTensorSpec
from _helpers import tmpfs

from zerolaunch.checkpoint.save import latest_checkpoint, save_checkpoint
from zerolaunch.util.disk_errors import DiskError, disk_error, disk_errors

SPECS = [
    FakeTensorSpec("w", (64, 1024), torch.float32, True),
    FakeTensorSpec("b", (31,), torch.float32, True),
]
"""About 260 KiB of fp32 master per checkpoint."""


@pytest.fixture
def small_disk(tmp_path):
    """A 1 MiB tmpfs, or None where mounting is not allowed."""
    disk = tmp_path / "disk"
    disk.mkdir()
    with tmpfs(disk, "1m") as real:
        yield disk, real


def _fill(disk, leave_bytes: int) -> None:
    stat = os.statvfs(disk)
    free = stat.f_bavail * stat.f_frsize
    with open(disk / "filler", "wb") as f:
        f.write(b"\0" * max(0, free - leave_bytes))


def _no_space(*args, **kwargs):
    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


def test_the_paragraph_names_path_error_and_bytes(tmp_path):
    full = disk_error(
        OSError(errno.ENOSPC, "No space left on device", str(tmp_path / "x.bin")), needed_bytes=3 << 20
    )
    assert full.exit_code == 2
    assert full.message.startswith(f"cannot write {tmp_path / 'x.bin'}: no space left on the device (")
    assert "it needs about 3.00 MiB" in full.message and "is free there" in full.message
    ro = disk_error(
        OSError(errno.EROFS, "Read-only file system"), path=tmp_path / "out", what="the output", fix="X"
    )
    assert (
        ro.message
        == f"cannot write the output {tmp_path / 'out'}: the filesystem is read-only. Write to a writable folder, or X."
    )
    denied = disk_error(
        OSError(errno.EACCES, "Permission denied", "/src/rank_0.safetensors"), path=tmp_path / "o"
    )
    assert denied.message.startswith(
        "cannot use /src/rank_0.safetensors: permission denied (Permission denied)"
    )
    with pytest.raises(OSError), disk_errors(tmp_path):
        raise OSError(errno.ENOENT, "No such file")  # not the disk's refusal: left alone


def test_a_checkpoint_save_on_a_full_disk_removes_its_temp_folder_and_keeps_latest(small_disk, monkeypatch):
    root, real = small_disk
    engine = FakeEngine(SPECS, rank=0, world_size=1, bucket_numel=4096, seed=1)
    save_checkpoint(engine, root, step=1)
    if real:
        _fill(root, leave_bytes=64 << 10)
    else:
        monkeypatch.setattr("zerolaunch.checkpoint.save.write_safetensors", _no_space)
    with pytest.raises(DiskError) as err:
        save_checkpoint(engine, root, step=2)
    message = err.value.message
    assert message.startswith(f"cannot write the checkpoint of step 2 (rank 0) to {root / 'step_000002'}: ")
    assert "no space left on the device (it needs about 768.37 KiB; " in message
    assert "step_000001 is intact" in message and "--set checkpoint.dir=DIR" in message
    assert "Errno" not in message and "Traceback" not in message
    assert sorted(p.name for p in root.iterdir() if p.name != "filler") == ["latest", "step_000001"]
    assert latest_checkpoint(root).name == "step_000001"


def test_convert_to_a_full_or_forbidden_folder_is_one_paragraph_and_leaves_no_temp(
    small_disk, tmp_path, monkeypatch
):
    src = tmp_path / "ckpt"
    save_checkpoint(FakeEngine(SPECS, rank=0, world_size=1, bucket_numel=4096, seed=1), src, step=1)
    from zerolaunch.checkpoint.convert import convert_checkpoint

    disk, real = small_disk
    if real:
        _fill(disk, leave_bytes=64 << 10)
    else:
        monkeypatch.setattr("zerolaunch.checkpoint.hf_folder.HFFolderWriter.open_shards", _no_space)
        monkeypatch.setattr("zerolaunch.checkpoint.hf_folder.HFFolderWriter.write_part", _no_space)
    with pytest.raises(DiskError) as err:
        convert_checkpoint(src, disk / "out")
    assert err.value.message.startswith(
        f"cannot write the converted checkpoint {disk / 'out'}: no space left"
    )
    assert "it needs about 256." in err.value.message and "give another OUT folder" in err.value.message
    assert sorted(p.name for p in disk.iterdir() if p.name != "filler") == []
    monkeypatch.undo()

    def denied(*args, **kwargs):
        raise PermissionError(errno.EACCES, "Permission denied", str(tmp_path / "forbidden" / "out"))

    # safetensors output goes through open_shards + put, torch's format through write_part
    monkeypatch.setattr("zerolaunch.checkpoint.hf_folder.HFFolderWriter.open_shards", denied)
    monkeypatch.setattr("zerolaunch.checkpoint.hf_folder.HFFolderWriter.write_part", denied)
    with pytest.raises(
        DiskError, match=r"cannot write the converted checkpoint .*forbidden/out: permission denied"
    ):
        convert_checkpoint(src, tmp_path / "forbidden" / "out")
    assert not [p for p in (tmp_path / "forbidden").iterdir()]


def test_a_metrics_line_the_disk_refuses_names_metrics_jsonl(tmp_path):
    from zerolaunch.report.metrics import MetricsFile

    metrics = MetricsFile(tmp_path)
    metrics._file = io.TextIOWrapper(io.BufferedWriter(io.FileIO(os.open("/dev/full", os.O_WRONLY), "w")))
    with pytest.raises(DiskError, match=rf"cannot write {tmp_path / 'metrics.jsonl'}: no space left"):
        metrics.write({"step": 1})


def test_the_launcher_names_a_full_run_dir_when_a_worker_record_is_unreadable(small_disk):
    from zerolaunch.launch.failures import disk_problem

    disk, real = small_disk
    if not real:
        pytest.skip("needs a real full filesystem: the probe writes to it")
    assert disk_problem([disk]) is None
    _fill(disk, leave_bytes=8 << 10)
    problem = disk_problem([disk])
    assert isinstance(problem, DiskError) and f"cannot write into {disk}: no space left" in problem.message


def test_worker_error_records_live_off_the_run_dir_and_are_copied_back(tmp_path):
    from zerolaunch.launch.logs import RunLogsSpecs

    logs = RunLogsSpecs(tmp_path / "logs", all_ranks=False)
    envs = {0: {"RANK": "1", "LOCAL_RANK": "0"}, 1: {"RANK": "2", "LOCAL_RANK": "1"}}
    dest = logs.reify(envs)
    try:
        for local_rank, path in dest.error_files.items():
            assert tmp_path not in [*map(type(tmp_path), [path])][0].parents
            assert envs[local_rank]["TORCHELASTIC_ERROR_FILE"] == path
        with open(dest.error_files[1], "w") as f:
            f.write('{"message": "x"}')
    finally:
        logs.close()
        logs.remove_error_files()
    copied = list((tmp_path / "logs").rglob("error.json"))
    assert [p.parent.name for p in copied] == ["1"] and copied[0].read_text() == '{"message": "x"}'
    assert not os.path.exists(dest.error_files[1])


def test_the_echo_of_rank_0_leaves_out_a_dying_traceback():
    from zerolaunch.launch.logs import WithoutDyingTraceback

    out = io.StringIO()
    echo = WithoutDyingTraceback(out)
    echo.write("a warning\n[rank0]: Traceback (most recent call last):\n[rank0]:   File")
    echo.write(' "x.py", line 1\n[rank0]: ValueError: boom\nlast line\n')
    assert out.getvalue() == "a warning\nlast line\n"


def test_error_record_folders_of_dead_launchers_are_removed(tmp_path, monkeypatch):
    import tempfile

    from zerolaunch.launch import logs as logs_mod

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    dead = subprocess.Popen(["true"])
    dead.wait()
    stale = tmp_path / f"zerolaunch-errors-{dead.pid}-abc"
    live = tmp_path / f"zerolaunch-errors-{os.getpid()}-def"
    stale.mkdir()
    live.mkdir()
    logs = logs_mod.RunLogsSpecs(tmp_path / "logs", all_ranks=False)
    logs.reify({0: {"RANK": "0", "LOCAL_RANK": "0"}})
    try:
        assert not stale.exists() and live.exists()
    finally:
        logs.close()
        logs.remove_error_files()
