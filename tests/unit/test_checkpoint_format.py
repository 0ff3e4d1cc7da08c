"""The checkpoint format in one process: save from fake ranks, reload into fresh ones, reshard, bad input.

Uses `tests/_fake_engine.FakeEngine` (real zero.layout fragments, state held as full tensors)
and the save phases directly (prepare / write_rank_files / finalize), so no process group is needed. The
collective wrapper `save_checkpoint` and the real Engine are covered in tests/dist/test_checkpoint_*.py.
"""

from __future__ import annotations

import json

import pytest
import safetensors.torch
import torch
from _fake_engine import FakeEngine, FakeTensorSpec, save_fake
from _fake_engine import fake_ranks as _fake_ranks

from zerolaunch.checkpoint.errors import CheckpointError
from zerolaunch.checkpoint.load import load_checkpoint
from zerolaunch.checkpoint.reader import CheckpointReader
from zerolaunch.checkpoint.save import (
    latest_checkpoint,
    save_checkpoint,
)
from zerolaunch.checkpoint.tensorfile import SafetensorsReader, SafetensorsWriter, write_safetensors

SPECS = [
    FakeTensorSpec("embed.weight", (17, 31), torch.float32, True, ("head.weight",)),
    FakeTensorSpec("block.0.bias", (31,), torch.float32, True),
    FakeTensorSpec("block.0.weight", (31, 13), torch.float32, True),
    FakeTensorSpec("frozen.scale", (5,), torch.float32, False),
    FakeTensorSpec("block.1.weight", (7, 3), torch.float32, True),
]
BUFFERS = {"rope.cache": (4, 3)}


def fake_ranks(world_size: int, bucket_numel: int = 200, seed: int | None = 0) -> list[FakeEngine]:
    return _fake_ranks(SPECS, world_size, bucket_numel=bucket_numel, seed=seed, buffers=BUFFERS)


def load_fake(engines: list[FakeEngine], path) -> list[dict]:
    out = []
    for r, e in enumerate(engines):
        with CheckpointReader(path) as reader:
            e.load_fragment_state(reader.read)
            e.load_replicated_state(reader.replicated_state())
            e.load_state_meta(reader.manifest.state_meta)
            out.append(reader.extra(r))
    return out


def test_safetensors_writer_output_loads_with_safetensors(tmp_path):
    tensors = {
        "a": torch.randn(3, 5),
        "b": torch.arange(7),
        "c": torch.randn(4).bfloat16(),
        "d": torch.tensor(2.5),
        "e": torch.zeros(0, 3),
    }
    write_safetensors(tmp_path / "x.safetensors", tensors.items(), metadata={"format": "pt"})
    loaded = safetensors.torch.load_file(tmp_path / "x.safetensors")
    assert set(loaded) == set(tensors)
    for k, v in tensors.items():
        assert loaded[k].dtype == v.dtype and torch.equal(loaded[k], v)
    with SafetensorsReader(tmp_path / "x.safetensors") as r:
        assert torch.equal(r.read_flat("a", 4, 9), tensors["a"].reshape(-1)[4:9])


def test_safetensors_writer_refuses_wrong_order_and_shape(tmp_path):
    w = SafetensorsWriter(
        tmp_path / "y.safetensors", [("a", (2,), torch.float32), ("b", (3,), torch.float32)]
    )
    with pytest.raises(CheckpointError, match="expected tensor 'a'"):
        w.write("b", torch.zeros(3))
    with pytest.raises(CheckpointError, match="declared"):
        w.write("a", torch.zeros(3))
    w.write("a", torch.zeros(2))
    with pytest.raises(CheckpointError, match="never written"):
        w.close()


@pytest.mark.parametrize("world_size", [1, 2, 3])
def test_same_world_size_round_trip_is_exact(tmp_path, world_size):
    src = fake_ranks(world_size)
    extras = {
        r: {
            "rng": {"torch": torch.random.get_rng_state(), "python": (3, (1, 2, 3), None)},
            "data": {"position": 40 + r},
        }
        for r in range(world_size)
    }
    path = save_fake(src, tmp_path, 7, extras)
    dst = fake_ranks(world_size, seed=None)
    got = load_fake(dst, path)
    for s, d in zip(src, dst, strict=True):
        for f in s.owned_fragments():
            for kind in FakeEngine.KINDS:
                assert torch.equal(
                    d.state[kind][f.name][f.start : f.stop], s.state[kind][f.name][f.start : f.stop]
                )
        assert d.step_count == s.step_count or all(
            torch.equal(d.step_count[k], s.step_count[k]) for k in s.step_count
        )
    assert all(torch.equal(dst[0].replicated[k], src[0].replicated[k]) for k in src[0].replicated)
    assert dst[0].meta == src[0].meta
    for r in range(world_size):
        assert got[r]["data"]["position"] == 40 + r
        assert got[r]["rng"]["python"] == (3, (1, 2, 3), None)  # tuples survive JSON
        assert torch.equal(got[r]["rng"]["torch"], extras[r]["rng"]["torch"])


@pytest.mark.parametrize(
    "src_ws,dst_ws,src_bucket,dst_bucket",
    [(2, 3, 200, 200), (3, 2, 200, 64), (4, 1, 50, 10_000), (1, 4, 10_000, 50)],
)
def test_reshard_loads_every_element(tmp_path, src_ws, dst_ws, src_bucket, dst_bucket):
    src = fake_ranks(src_ws, src_bucket)
    path = save_fake(src, tmp_path, 3)
    dst = fake_ranks(dst_ws, dst_bucket, seed=None)
    load_fake(dst, path)
    full = src[0].state  # every fake rank holds the same full tensors; each saved only its own fragments
    for d in dst:
        assert d.owned_fragments(), "every destination rank owns something in this layout"
        for f in d.owned_fragments():
            for kind in FakeEngine.KINDS:
                assert torch.equal(
                    d.state[kind][f.name][f.start : f.stop], full[kind][f.name][f.start : f.stop]
                )


def test_manifest_describes_the_checkpoint(tmp_path):
    path = save_fake(fake_ranks(2), tmp_path, 12)
    m = json.loads((path / "manifest.json").read_text())
    assert m["step"] == 12 and m["world_size"] == 2
    assert [p["name"] for p in m["params"]] == [s.name for s in SPECS]
    assert m["params"][0]["aliases"] == ["head.weight"]
    assert set(m["kinds"]) == {"master", "exp_avg", "exp_avg_sq", "step"}
    assert sorted(p.name for p in path.iterdir()) == [
        "manifest.json",
        "rank_0.safetensors",
        "rank_1.safetensors",
    ]
    assert latest_checkpoint(tmp_path) == path
    assert (tmp_path / "latest").read_text().strip() == "step_000012"


def test_keep_prunes_oldest_and_latest_moves(tmp_path):
    engines = fake_ranks(2)
    for step in (1, 2, 3, 4):
        save_fake(engines, tmp_path, step, keep=2)
    names = sorted(p.name for p in tmp_path.iterdir())
    assert names == ["latest", "step_000003", "step_000004"]
    assert latest_checkpoint(tmp_path).name == "step_000004"


def test_a_latest_naming_no_complete_checkpoint_is_refused_naming_the_newest_good_one(tmp_path):
    engines = fake_ranks(1)
    save_fake(engines, tmp_path, 1)
    save_fake(engines, tmp_path, 2)
    newest = f"The newest complete checkpoint is step_000002: resume from it with --resume {tmp_path / 'step_000002'}"
    (tmp_path / "latest").write_text("step_000099\n")
    with pytest.raises(CheckpointError, match="names step_000099, which does not exist") as err:
        latest_checkpoint(tmp_path)
    assert newest in err.value.message
    (tmp_path / "latest").write_bytes(b"\x00\xffgarbage")
    with pytest.raises(CheckpointError, match="latest is damaged") as err:
        latest_checkpoint(tmp_path)
    assert newest in err.value.message
    (tmp_path / "step_000003").mkdir()  # a folder without its manifest
    (tmp_path / "latest").write_text("step_000003\n")
    with pytest.raises(CheckpointError, match="names step_000003, which has no manifest.json"):
        latest_checkpoint(tmp_path)
    (tmp_path / "latest").unlink()  # no pointer at all: the newest complete one
    assert latest_checkpoint(tmp_path).name == "step_000002"
    assert latest_checkpoint(tmp_path / "nothing") is None


def test_single_process_save_checkpoint_api(tmp_path):
    (engine,) = fake_ranks(1)
    path = save_checkpoint(engine, tmp_path / "ck", step=5, extra={"data": {"position": 9}}, keep=1)
    fresh = fake_ranks(1, seed=None)[0]
    extra = load_checkpoint(fresh, tmp_path / "ck")
    assert path.name == "step_000005" and extra == {"data": {"position": 9}}
    assert torch.equal(fresh.state["exp_avg"]["block.0.weight"], engine.state["exp_avg"]["block.0.weight"])


def test_missing_truncated_and_corrupt_rank_files_are_named(tmp_path):
    path = save_fake(fake_ranks(2), tmp_path, 1)
    rank1 = path / "rank_1.safetensors"
    data = rank1.read_bytes()
    rank1.write_bytes(data[: len(data) // 2])
    with pytest.raises(CheckpointError, match=r"rank_1\.safetensors is truncated"):
        CheckpointReader(path)
    rank1.write_bytes(b"\xff" * len(data))
    with pytest.raises(CheckpointError, match=r"rank_1\.safetensors"):
        CheckpointReader(path)
    rank1.unlink()
    with pytest.raises(CheckpointError, match=r"missing rank file .*rank_1\.safetensors"):
        CheckpointReader(path)
    (path / "manifest.json").write_text("{not json")
    with pytest.raises(CheckpointError, match="manifest.json is corrupt"):
        CheckpointReader(path)
    with pytest.raises(CheckpointError, match="not a zerolaunch checkpoint"):
        CheckpointReader(tmp_path / "latest").manifest  # noqa: B018


def test_model_mismatch_is_refused_with_the_param_name(tmp_path):
    path = save_fake(fake_ranks(1), tmp_path, 1)
    other = [
        FakeTensorSpec(
            s.name,
            (s.shape[0] + 1, *s.shape[1:]) if s.name == "block.0.bias" else s.shape,
            s.dtype,
            s.trainable,
            s.aliases,
        )
        for s in SPECS
    ]
    engine = FakeEngine(other, rank=0, world_size=1, bucket_numel=200, seed=None, buffers=BUFFERS)
    with pytest.raises(CheckpointError, match=r"'block.0.bias' has shape \[31\] in the checkpoint, \[32\]"):
        load_checkpoint(engine, path)


def test_unsupported_extra_value_is_refused(tmp_path):
    (engine,) = fake_ranks(1)
    with pytest.raises(CheckpointError, match=r"extra\['rng.numpy'\] is a object"):
        save_checkpoint(engine, tmp_path, step=1, extra={"rng": {"numpy": object()}})
    assert latest_checkpoint(tmp_path) is None
