"""Checkpoint checksums: every rank file's header and tensors have a crc32 in manifest.json, taken while
writing, and the manifest has one of its own content (step, layout, every rank's JSON extra); convert-checkpoint, --to-world-size and resume (load_checkpoint) verify while reading and refuse a
damaged file naming it (CheckpointError, exit 2); --no-verify / verify=False read it unchecked; checkpoints
written before checksums existed (no "checksums" in the manifest) still load, unverified.

Checkpoints come from FakeEngine ranks (real zero.layout fragments, checkpoint/save.py's writer). The
reference crcs are zlib.crc32 of the bytes safetensors' own loader returns, not of anything the writer kept.
"""

from __future__ import annotations

import json
import zlib
from pathlib import Path

import pytest
import torch
from _fake_engine import FakeEngine, FakeTensorSpec, fake_ranks, save_fake
from safetensors.torch import load_file
from typer.testing import CliRunner

from zerolaunch.checkpoint.errors import CheckpointError
from zerolaunch.checkpoint.load import load_checkpoint
from zerolaunch.checkpoint.reader import CheckpointReader
from zerolaunch.cli.app import app

SPECS = [
    FakeTensorSpec("a.weight", (64, 48), torch.float32, True),
    FakeTensorSpec("a.bias", (48,), torch.float32, True),
    FakeTensorSpec("b.weight", (48, 64), torch.float32, True),
    FakeTensorSpec("frozen", (7,), torch.bfloat16, False),
]


def make_checkpoint(root: Path, world_size: int = 2) -> tuple[Path, list[FakeEngine]]:
    engines = fake_ranks(SPECS, world_size, bucket_numel=2000)
    extras = {r: {"data": {"position": r}} for r in range(world_size)}
    return save_fake(engines, root, 5, extras=extras), engines


def flip_middle(path: Path, nbytes: int = 4000) -> None:
    """Invert `nbytes` bytes in the middle of the file (same size, so the size check cannot see it)."""
    data = bytearray(path.read_bytes())
    assert len(data) > 3 * nbytes, len(data)
    mid = len(data) // 2
    data[mid : mid + nbytes] = bytes(b ^ 0xFF for b in data[mid : mid + nbytes])
    path.write_bytes(bytes(data))


def test_manifest_has_crc32_of_every_rank_file(tmp_path):
    ckpt, _ = make_checkpoint(tmp_path / "ck")
    manifest = json.loads((ckpt / "manifest.json").read_text())
    assert len(manifest["ranks"]) == 2
    for entry in manifest["ranks"]:
        path = ckpt / entry["file"]
        sums = entry["checksums"]
        assert sums["algorithm"] == "crc32"
        raw = path.read_bytes()
        header_len = int.from_bytes(raw[:8], "little")
        assert sums["header"] == zlib.crc32(raw[: 8 + header_len])
        tensors = load_file(path)
        assert set(sums["tensors"]) == set(tensors) and tensors
        for name, t in tensors.items():
            assert sums["tensors"][name] == zlib.crc32(t.contiguous().view(torch.uint8).numpy().tobytes()), (
                name
            )


def test_convert_refuses_a_damaged_file_and_no_verify_proceeds(tmp_path):
    ckpt, _ = make_checkpoint(tmp_path / "ck")
    size = (ckpt / "rank_0.safetensors").stat().st_size
    flip_middle(ckpt / "rank_0.safetensors")
    assert (ckpt / "rank_0.safetensors").stat().st_size == size
    runner = CliRunner()
    r = runner.invoke(app, ["convert-checkpoint", str(ckpt), str(tmp_path / "out"), "--no-progress"])
    assert r.exit_code == 2, r.output
    assert "rank_0.safetensors is damaged" in " ".join(r.output.split()), r.output
    assert "Traceback" not in r.output
    assert not (tmp_path / "out").exists()
    r = runner.invoke(
        app, ["convert-checkpoint", str(ckpt), str(tmp_path / "out"), "--no-progress", "--no-verify"]
    )
    assert r.exit_code == 0, r.output
    assert (tmp_path / "out" / "model.safetensors").is_file()


def test_reshard_and_resume_refuse_a_damaged_file(tmp_path):
    ckpt, _ = make_checkpoint(tmp_path / "ck")
    flip_middle(ckpt / "rank_1.safetensors")
    runner = CliRunner()
    r = runner.invoke(
        app, ["convert-checkpoint", str(ckpt), str(tmp_path / "re"), "--to-world-size", "3", "--no-progress"]
    )
    assert r.exit_code == 2 and "rank_1.safetensors is damaged" in " ".join(r.output.split()), r.output
    # rank 1 reads its own optimizer state, where the flipped bytes are (every rank reads all the masters)
    fresh = FakeEngine(SPECS, rank=1, world_size=2, bucket_numel=2000, seed=None)
    with pytest.raises(CheckpointError, match=r"rank_1\.safetensors is damaged"):
        load_checkpoint(fresh, ckpt)
    load_checkpoint(fresh, ckpt, verify=False)  # unchecked: reads the damaged bytes


def test_a_partial_read_is_verified_too(tmp_path):
    """At another world size a rank reads part of a saved fragment: the whole tensor is checked first."""
    ckpt, engines = make_checkpoint(tmp_path / "ck", world_size=1)
    with CheckpointReader(ckpt) as reader:
        assert torch.equal(
            reader.read("master", "a.weight", 10, 20), engines[0].state["master"]["a.weight"][10:20]
        )
    flip_middle(ckpt / "rank_0.safetensors")
    with CheckpointReader(ckpt) as reader, pytest.raises(CheckpointError, match="is damaged"):
        for name in ("a.weight", "a.bias", "b.weight"):
            reader.read("exp_avg", name, 1, 3)


def test_resharded_checkpoint_has_checksums_and_loads_verified(tmp_path):
    ckpt, engines = make_checkpoint(tmp_path / "ck")
    runner = CliRunner()
    r = runner.invoke(
        app, ["convert-checkpoint", str(ckpt), str(tmp_path / "re"), "--to-world-size", "3", "--no-progress"]
    )
    assert r.exit_code == 0, r.output
    manifest = json.loads((tmp_path / "re" / "manifest.json").read_text())
    assert all(e["checksums"]["tensors"] for e in manifest["ranks"])
    for rank in range(3):
        fresh = FakeEngine(SPECS, rank=rank, world_size=3, bucket_numel=2000, seed=None)
        load_checkpoint(fresh, tmp_path / "re")
        assert fresh.owned_fragments()
        for f in fresh.owned_fragments():
            for kind in FakeEngine.KINDS:
                want = engines[0].state[kind][f.name][f.start : f.stop]
                assert torch.equal(fresh.state[kind][f.name][f.start : f.stop], want), (rank, kind, f)


def test_old_checkpoint_without_checksums_loads_unverified(tmp_path):
    ckpt, engines = make_checkpoint(tmp_path / "ck")
    path = ckpt / "manifest.json"
    manifest = json.loads(path.read_text())
    for entry in manifest["ranks"]:
        del entry["checksums"]
    del manifest["checksum"]  # a checkpoint from before checksums has neither the ranks' nor its own
    path.write_text(json.dumps(manifest))
    fresh = FakeEngine(SPECS, rank=1, world_size=2, bucket_numel=2000, seed=None)
    load_checkpoint(fresh, ckpt)
    for f in fresh.owned_fragments():
        assert torch.equal(
            fresh.state["master"][f.name][f.start : f.stop],
            engines[1].state["master"][f.name][f.start : f.stop],
        )
    r = CliRunner().invoke(app, ["convert-checkpoint", str(ckpt), str(tmp_path / "out"), "--no-progress"])
    assert r.exit_code == 0, r.output


def test_manifest_crc_is_of_its_canonical_json(tmp_path):
    ckpt, _ = make_checkpoint(tmp_path / "ck")
    manifest = json.loads((ckpt / "manifest.json").read_text())
    recorded = manifest.pop("checksum")
    canonical = json.dumps(manifest, sort_keys=True, separators=(",", ":")).encode()
    assert recorded == {"algorithm": "crc32", "body": zlib.crc32(canonical)}


@pytest.mark.parametrize("edit", ["extra", "step", "drop_checksum"])
def test_an_edited_manifest_is_refused_naming_it_and_no_verify_reads_it(tmp_path, edit):
    ckpt, _ = make_checkpoint(tmp_path / "ck")
    path = ckpt / "manifest.json"
    manifest = json.loads(path.read_text())
    if edit == "extra":
        manifest["ranks"][0]["extra"]["data"]["position"] = 7  # the data position a resume continues from
    elif edit == "step":
        manifest["step"] = 6
    else:
        del manifest["checksum"]
    path.write_text(json.dumps(manifest))
    needle = "has no `checksum`" if edit == "drop_checksum" else "is damaged or was edited"
    fresh = FakeEngine(SPECS, rank=1, world_size=2, bucket_numel=2000, seed=None)
    with pytest.raises(CheckpointError, match=needle) as info:
        load_checkpoint(fresh, ckpt)
    assert str(path) in str(info.value) and "--no-verify" in str(info.value)
    r = CliRunner().invoke(app, ["convert-checkpoint", str(ckpt), str(tmp_path / "out"), "--no-progress"])
    assert r.exit_code == 2 and "manifest.json" in r.output and "Traceback" not in r.output, r.output
    assert not (tmp_path / "out").exists()
    extra = load_checkpoint(fresh, ckpt, verify=False)
    assert extra["data"]["position"] == (7 if edit == "extra" else 0)  # no group: rank 0's extra
