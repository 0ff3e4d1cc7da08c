"""convert-checkpoint on zerolaunch checkpoints: consolidated safetensors / shards / torch, dtype casts,
--to-world-size resharding (2->3, 3->2), refusals, and the streaming memory bound (measured in a fresh
subprocess as the peak-RSS rise during the conversion of a 64 MiB-master, 16-tensor checkpoint).
Checkpoints come from FakeEngine ranks (real zero.layout fragments); the real Engine's own save/resume is
tests/dist/test_checkpoint_resume.py.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from _fake_engine import FakeEngine, FakeTensorSpec, fake_ranks, save_fake
from safetensors.torch import load_file
from typer.testing import CliRunner

from zerolaunch.checkpoint.convert import convert_checkpoint, parse_size, plan_shards
from zerolaunch.checkpoint.errors import CheckpointError
from zerolaunch.checkpoint.reader import CheckpointReader
from zerolaunch.cli.app import app

SPECS = [
    FakeTensorSpec("embed.weight", (17, 31), torch.float32, True, ("head.weight",)),
    FakeTensorSpec("block.bias", (31,), torch.float32, True),
    FakeTensorSpec("frozen.scale", (5,), torch.bfloat16, False),
    FakeTensorSpec("block.weight", (31, 13), torch.float32, True),
]
BUFFERS = {"rope": (4, 3)}


def make_checkpoint(root: Path, world_size: int, specs=SPECS, bucket_numel: int = 150, step: int = 3):
    engines = fake_ranks(specs, world_size, bucket_numel=bucket_numel, buffers=BUFFERS)
    extras = {r: {"data": {"position": 10 * r}} for r in range(world_size)}
    return save_fake(engines, root, step, extras=extras), engines[0]


def test_safetensors_output_equals_the_engine_state(tmp_path):
    ckpt, engine = make_checkpoint(tmp_path / "ck", 2)
    out = convert_checkpoint(tmp_path / "ck", tmp_path / "out")
    got = load_file(out / "model.safetensors")
    assert set(got) == {"embed.weight", "head.weight", "block.bias", "block.weight", "frozen.scale", "rope"}
    for s in SPECS:
        want = (
            engine.state["master"][s.name].view(s.shape) if s.trainable else engine.replicated[s.name].float()
        )
        assert torch.equal(got[s.name], want), s.name
    assert torch.equal(got["head.weight"], got["embed.weight"])
    assert got["frozen.scale"].dtype == torch.float32  # --dtype fp32 applies to every floating tensor


def test_hf_config_in_rank0_extra_becomes_config_json(tmp_path):
    engines = fake_ranks(SPECS, 2, bucket_numel=150, buffers=BUFFERS)
    config = {"model_type": "gpt2", "n_embd": 31, "architectures": ["GPT2LMHeadModel"]}
    final = save_fake(engines, tmp_path / "ck", 1, extras={0: {"hf_config": config}})
    out = convert_checkpoint(final, tmp_path / "o")
    written = json.loads((out / "config.json").read_text())
    # written through GPT2Config as save_pretrained writes it: the saved fields kept, dtype of the weights set
    assert {k: written[k] for k in config} == config and written["dtype"] == "float32"


def test_torch_format_and_fp16_and_single_file(tmp_path):
    make_checkpoint(tmp_path / "ck", 3)
    out = convert_checkpoint(tmp_path / "ck", tmp_path / "o", fmt="torch", dtype="fp16")
    sd = torch.load(out / "pytorch_model.bin", weights_only=True)
    assert sd["embed.weight"].dtype == torch.float16
    assert sd["head.weight"].data_ptr() == sd["embed.weight"].data_ptr()  # tied stays tied
    single = convert_checkpoint(tmp_path / "ck", tmp_path / "model.safetensors")
    assert single.is_file() and "block.weight" in load_file(single)


def test_hf_shards_and_index(tmp_path):
    make_checkpoint(tmp_path / "ck", 2)
    out = convert_checkpoint(tmp_path / "ck", tmp_path / "o", max_shard_bytes=parse_size("2KB"))
    index = json.loads((out / "model.safetensors.index.json").read_text())
    files = sorted(set(index["weight_map"].values()))
    assert files == sorted(p.name for p in out.glob("model-*-of-*.safetensors")) and len(files) >= 2
    merged = {}
    for f in files:
        part = load_file(out / f)
        assert all(index["weight_map"][k] == f for k in part)
        merged.update(part)
    assert set(merged) == set(index["weight_map"])
    assert index["metadata"]["total_size"] == sum(t.numel() * t.element_size() for t in merged.values())
    with pytest.raises(CheckpointError, match="give a folder as OUT"):
        convert_checkpoint(tmp_path / "ck", tmp_path / "m.safetensors", max_shard_bytes=2000)


def test_parse_size_and_plan_shards():
    assert parse_size("5GB") == 5 * 10**9 and parse_size("200MB") == 200 * 10**6
    assert parse_size("512MiB") == 512 * 2**20 and parse_size("10") == 10
    with pytest.raises(CheckpointError, match="cannot read .five gigs. as a size"):
        parse_size("five gigs")
    assert plan_shards([4, 4, 9, 1], 8) == [[0, 1], [2], [3]]
    assert plan_shards([4, 4], None) == [[0, 1]]


@pytest.mark.parametrize("src_ws,dst_ws", [(2, 3), (3, 2)])
def test_to_world_size_reshards_every_kind(tmp_path, src_ws, dst_ws):
    ckpt, engine = make_checkpoint(tmp_path / "ck", src_ws)
    out = convert_checkpoint(ckpt, tmp_path / "re", to_world_size=dst_ws)
    with CheckpointReader(out) as new, CheckpointReader(ckpt) as old:
        assert new.manifest.world_size == dst_ws and len(list(out.glob("rank_*.safetensors"))) == dst_ws
        assert new.manifest.state_meta == old.manifest.state_meta and new.manifest.step == 3
        for p in (p for p in SPECS if p.trainable):
            for kind in FakeEngine.KINDS:
                assert torch.equal(new.full_param(p.name, kind), old.full_param(p.name, kind))
        assert torch.equal(new.read("step", "block.weight", 0, 5), torch.tensor([7.0]))
        assert [new.extra(r)["data"]["position"] for r in range(dst_ws)] == [
            10 * r if r < src_ws else 0 for r in range(dst_ws)
        ]
    # a fresh engine at the new world size loads the resharded checkpoint with its own fragments
    for r in range(dst_ws):
        fresh = FakeEngine(SPECS, rank=r, world_size=dst_ws, bucket_numel=150, seed=None, buffers=BUFFERS)
        with CheckpointReader(out) as reader:
            fresh.load_fragment_state(reader.read)
        for f in fresh.owned_fragments():
            assert torch.equal(
                fresh.state["exp_avg"][f.name][f.start : f.stop],
                engine.state["exp_avg"][f.name][f.start : f.stop],
            )


def test_refusals(tmp_path):
    ckpt, _ = make_checkpoint(tmp_path / "ck", 2)
    (tmp_path / "o").mkdir()
    with pytest.raises(CheckpointError, match="already exists; pass --force"):
        convert_checkpoint(ckpt, tmp_path / "o")
    with pytest.raises(CheckpointError, match="must not be, hold or lie inside the source"):
        convert_checkpoint(ckpt, ckpt / "inside", force=True)
    with pytest.raises(CheckpointError, match="unknown dtype 'int8'"):
        convert_checkpoint(ckpt, tmp_path / "p", dtype="int8")
    runner = CliRunner()
    r = runner.invoke(
        app, ["convert-checkpoint", str(ckpt), str(tmp_path / "q"), "--to-world-size", "2", "--dtype", "bf16"]
    )
    assert r.exit_code == 2 and "takes none of" in r.output


_MEASURE = """
import json, sys
import torch
from zerolaunch.checkpoint.convert import convert_checkpoint
import zerolaunch.checkpoint.deepspeed  # noqa: F401 -- modules imported lazily are not the conversion's memory
import huggingface_hub
# the shard planner imports torch's symbolic-shapes machinery (sympy, ~40 MiB) on its first call: import cost
huggingface_hub.split_torch_state_dict_into_shards({"w": torch.empty(1, device="meta")})

def rss(field):
    for line in open("/proc/self/status"):
        if line.startswith(field):
            return int(line.split()[1]) * 1024
with open("/proc/self/clear_refs", "w") as f:
    f.write("5")  # resets VmHWM (peak RSS) to the current RSS
base = rss("VmRSS:")
convert_checkpoint(sys.argv[1], sys.argv[2])
print(json.dumps({"peak_delta_bytes": rss("VmHWM:") - base}))
"""


def test_conversion_streams_tensor_by_tensor(tmp_path):
    numel = 1 << 20  # 16 tensors x 4 MiB fp32 = 64 MiB of master weights, 32 MiB per rank
    specs = [
        FakeTensorSpec(f"layer.{i}.weight", (1024, numel // 1024), torch.float32, True) for i in range(16)
    ]
    ckpt, _ = make_checkpoint(tmp_path / "ck", 2, specs=specs, bucket_numel=3 * numel)
    out = tmp_path / "out"
    # glibc would otherwise raise its mmap threshold after the first 4 MiB free and keep freed tensors in
    # the heap, so the peak RSS would count dead memory; a fixed threshold returns every tensor on free.
    env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": "65536"}
    proc = subprocess.run(
        [sys.executable, "-c", _MEASURE, str(ckpt), str(out)],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )
    assert proc.returncode == 0, proc.stderr
    peak = json.loads(proc.stdout.strip().splitlines()[-1])["peak_delta_bytes"]
    largest, model = 4 * numel, 16 * 4 * numel
    print(f"conversion peak RSS rise: {peak / 2**20:.1f} MiB (largest tensor 4 MiB, model 64 MiB)")
    # A state-dict converter holds the whole model (64 MiB); streaming holds about one tensor (+ slack).
    assert peak < 3 * largest, peak
    assert (out / "model.safetensors").stat().st_size > model
