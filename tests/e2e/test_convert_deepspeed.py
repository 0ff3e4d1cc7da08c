"""convert-checkpoint on checkpoints written by real DeepSpeed 0.19.8 (tests/fixtures/deepspeed, made by
make_fixtures.py on 2 CPU gloo ranks): ZeRO 1/2/3, fp32 and bf16, a tied weight, a frozen param, float
and integer buffers, sizes not divisible by the world size. The output must equal DeepSpeed's own
zero_to_fp32 result (reference.safetensors) exactly, without DeepSpeed installed. Also: the `latest`-less
and tag-folder forms, and bad input (missing rank file, truncated file, pickled code).
"""

from __future__ import annotations

import io
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from typer.testing import CliRunner

from zerolaunch.checkpoint.convert import convert_checkpoint
from zerolaunch.checkpoint.deepspeed import load_ds_file
from zerolaunch.checkpoint.errors import CheckpointError
from zerolaunch.checkpoint.load import load_checkpoint
from zerolaunch.cli.app import app

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "deepspeed"
CASES = sorted(p.name for p in FIXTURES.iterdir() if (p / "reference.safetensors").is_file())
STAGE1_FROZEN = {"frozen_scale"}
"""zero_to_fp32 drops frozen params of stage-1 checkpoints (no frozen_param_shapes); we keep them."""


def test_all_fixture_cases_are_present():
    assert {"zero1_fp32", "zero2_fp32", "zero3_fp32"} <= set(CASES), CASES
    assert any("bf16" in c for c in CASES), CASES


@pytest.mark.parametrize("case", CASES)
def test_matches_zero_to_fp32_exactly(tmp_path, case):
    ref = load_file(FIXTURES / case / "reference.safetensors")
    out = convert_checkpoint(FIXTURES / case, tmp_path / "out")
    got = load_file(out / "model.safetensors")
    extra = set(got) - set(ref)
    assert extra == (STAGE1_FROZEN if case.startswith("zero1") else set())
    assert set(ref) <= set(got)
    for name, want in ref.items():
        # DeepSpeed leaves a bf16 run's frozen params in bf16; the conversion writes fp32 (exact upcast).
        want = want.float() if want.is_floating_point() else want
        assert got[name].dtype == want.dtype, name
        assert torch.equal(got[name], want), name
    assert torch.equal(got["head.weight"], got["embed.weight"])  # the tied alias is written too
    assert got["positions"].dtype == torch.int64


def test_stage1_frozen_param_comes_from_the_model_states(tmp_path):
    got = load_file(convert_checkpoint(FIXTURES / "zero1_fp32", tmp_path / "o") / "model.safetensors")
    assert torch.equal(got["frozen_scale"], torch.linspace(0.5, 1.5, 6))  # frozen: never trained


def test_tag_folder_and_no_latest_forms(tmp_path):
    ref = load_file(FIXTURES / "zero3_fp32" / "reference.safetensors")
    tag = convert_checkpoint(FIXTURES / "zero3_fp32" / "global_step2", tmp_path / "a")
    copy = tmp_path / "nolatest"
    shutil.copytree(FIXTURES / "zero3_fp32", copy)
    (copy / "latest").unlink()
    bare = convert_checkpoint(copy, tmp_path / "b")
    for out in (tag, bare):
        got = load_file(out / "model.safetensors")
        assert all(torch.equal(got[k], ref[k]) for k in ref)


def test_several_tags_without_latest_ask_which(tmp_path):
    root = tmp_path / "ds"
    for tag in ("global_step1", "global_step2"):
        shutil.copytree(FIXTURES / "zero1_fp32" / "global_step2", root / tag)
    with pytest.raises(CheckpointError, match=r"several DeepSpeed checkpoints and no 'latest'.*global_step1"):
        convert_checkpoint(root, tmp_path / "o")


def test_resuming_from_a_deepspeed_checkpoint_points_to_init_from(tmp_path):
    from _fake_engine import FakeEngine

    engine = FakeEngine([], rank=0, world_size=1, bucket_numel=10)
    with pytest.raises(CheckpointError, match="is a DeepSpeed checkpoint.*model.init_from: .*no conversion"):
        load_checkpoint(engine, FIXTURES / "zero2_fp32")


def test_bf16_output_and_shards(tmp_path):
    ref = load_file(FIXTURES / "zero2_fp32" / "reference.safetensors")
    out = convert_checkpoint(FIXTURES / "zero2_fp32", tmp_path / "o", dtype="bf16", max_shard_bytes=100)
    index = (out / "model.safetensors.index.json").read_text()
    shards = sorted(p.name for p in out.glob("model-*.safetensors"))
    assert len(shards) > 2 and f"-of-{len(shards):05d}" in shards[0] and '"weight_map"' in index
    got = {}
    for s in shards:
        got.update(load_file(out / s))
    assert set(got) == set(ref)
    assert got["proj.weight"].dtype == torch.bfloat16
    assert torch.equal(got["proj.weight"], ref["proj.weight"].bfloat16())
    assert got["positions"].dtype == torch.int64  # integers are never cast


def _broken_copy(tmp_path, case="zero2_fp32") -> Path:
    dst = tmp_path / "broken"
    shutil.copytree(FIXTURES / case, dst)
    return dst / "global_step2"


def test_missing_rank_file_is_named(tmp_path):
    tag = _broken_copy(tmp_path)
    (tag / "zero_pp_rank_1_mp_rank_00_optim_states.pt").unlink()
    with pytest.raises(CheckpointError, match="saved by 2 ranks but holds 1 optimizer files"):
        convert_checkpoint(tag.parent, tmp_path / "o")
    tag = _broken_copy(tmp_path / "z3", "zero3_fp32")
    (tag / "zero_pp_rank_0_mp_rank_00_optim_states.pt").unlink()
    with pytest.raises(CheckpointError, match=r"missing optimizer files of rank\(s\) \[0\]"):
        convert_checkpoint(tag, tmp_path / "o")


def test_truncated_file_is_named_and_nothing_is_written(tmp_path):
    tag = _broken_copy(tmp_path)
    f = tag / "zero_pp_rank_0_mp_rank_00_optim_states.pt"
    f.write_bytes(f.read_bytes()[:1000])
    with pytest.raises(CheckpointError, match=r"zero_pp_rank_0_mp_rank_00_optim_states\.pt is truncated"):
        convert_checkpoint(tag, tmp_path / "o")
    assert not (tmp_path / "o").exists()
    assert not any(p.name.startswith(".tmp-") for p in tmp_path.iterdir())


@pytest.mark.parametrize("case", ["zero2_fp32", "zero3_fp32"])
def test_shapes_that_do_not_match_the_flat_state_are_refused(tmp_path, case):
    tag = _broken_copy(tmp_path, case)
    files = sorted(tag.glob("*model_states.pt"))
    for f in files:
        states = load_ds_file(f)
        states["param_shapes"][0]["proj.weight"] = torch.Size([9, 6])  # was (7, 6)
        # a new file, then a rename: `states` still maps the old file (load_ds_file uses mmap)
        torch.save(states, f.with_name(f.name + ".new"))
        f.with_name(f.name + ".new").replace(f)
    with pytest.raises(CheckpointError, match="the files do not belong together"):
        convert_checkpoint(tag, tmp_path / "o")


class _Evil:
    def __reduce__(self):
        return (print, ("pwned",))


def test_pickled_code_is_refused(tmp_path):
    tag = _broken_copy(tmp_path)
    f = tag / "mp_rank_00_model_states.pt"
    buf = io.BytesIO()
    torch.save({"module": {}, "evil": _Evil()}, buf)
    f.write_bytes(buf.getvalue())
    with pytest.raises(CheckpointError, match=r"mp_rank_00_model_states\.pt holds pickled objects"):
        convert_checkpoint(tag, tmp_path / "o")


def test_cli_converts_and_refuses_overwrite(tmp_path):
    runner = CliRunner()
    args = ["convert-checkpoint", str(FIXTURES / "zero3_bf16"), str(tmp_path / "o"), "--no-progress"]
    first = runner.invoke(app, args)
    assert first.exit_code == 0, first.output
    assert (tmp_path / "o" / "model.safetensors").is_file()
    again = runner.invoke(app, args)
    assert again.exit_code == 2 and "already exists; pass --force" in again.output
    assert runner.invoke(app, [*args, "--force"]).exit_code == 0


def test_cli_bad_source_exits_2_without_traceback(tmp_path):
    (tmp_path / "junk").mkdir()
    (tmp_path / "junk" / "notes.txt").write_text("hi")
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "zerolaunch",
            "convert-checkpoint",
            str(tmp_path / "junk"),
            str(tmp_path / "o"),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2, proc.stderr
    assert "holds no zerolaunch checkpoint" in proc.stderr and "Traceback" not in proc.stderr
