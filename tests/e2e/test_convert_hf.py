"""A converted zerolaunch checkpoint of a Hugging Face model loads with `from_pretrained` (no unexpected or
missing keys: non-persistent buffers such as Llama's rotary cache are left out, config.json comes from
rank 0's extra) and gives the engine's logits exactly. One process, world size 1, stage 2.
"""

from __future__ import annotations

import json

import pytest
import torch

transformers = pytest.importorskip("transformers")

from _helpers import tiny_gpt2, tiny_llama, trained_hf_engine  # noqa: E402

import zerolaunch  # noqa: E402
from zerolaunch.checkpoint.convert import convert_checkpoint  # noqa: E402
from zerolaunch.models import hf  # noqa: E402

CONFIG = tiny_llama(intermediate_size=40, num_hidden_layers=1)


def test_converted_hf_checkpoint_loads_with_from_pretrained(tmp_path):
    engine, x = trained_hf_engine(CONFIG, steps=2)
    engine.save_checkpoint(tmp_path / "ck")
    out = convert_checkpoint(tmp_path / "ck", tmp_path / "out")
    assert sorted(p.name for p in out.iterdir()) == [
        "config.json",
        "generation_config.json",
        "model.safetensors",
    ]
    model, info = transformers.AutoModelForCausalLM.from_pretrained(out, output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"], info
    with torch.no_grad():
        assert torch.equal(model(input_ids=x).logits, engine.module(input_ids=x).logits)


# ---- the folder equals what save_pretrained writes for the same model ------------------------------------
GPT2 = tiny_gpt2()


def _trained_engine(config):
    return trained_hf_engine(config)[0]


def _reference(engine, config, out, dtype, shard):
    """save_pretrained of a freshly built model of the same config (its defaults: use_cache on) holding the
    engine's weights; written by transformers, not by the code under test."""
    ref = transformers.AutoModelForCausalLM.from_config(hf.make_config(config))
    ref.load_state_dict(engine.module.state_dict())
    ref.to(dtype).save_pretrained(out, max_shard_size=shard)
    return out


def _folder(path):
    import json

    from safetensors.torch import load_file

    files = sorted(p.name for p in path.iterdir())
    tensors = {}
    for f in files:
        if f.endswith(".safetensors"):
            tensors.update(load_file(path / f))
    side = {f: json.loads((path / f).read_text()) for f in files if f.endswith(".json")}
    return files, tensors, side


@pytest.mark.parametrize("config", [CONFIG, GPT2], ids=["llama", "gpt2"])
@pytest.mark.parametrize(("dtype", "shard"), [("fp32", None), ("bf16", 8_000)], ids=["fp32", "bf16-shards"])
@pytest.mark.parametrize("writer", ["convert", "save_hf_pretrained"])
def test_hf_folder_equals_save_pretrained(tmp_path, config, dtype, shard, writer):
    torch_dtype = {"fp32": torch.float32, "bf16": torch.bfloat16}[dtype]
    engine = _trained_engine(config)
    assert engine.module.config.use_cache is False  # the training-time flag the output must not keep
    if writer == "convert":
        engine.save_checkpoint(tmp_path / "ck")
        ours = convert_checkpoint(tmp_path / "ck", tmp_path / "out", dtype=dtype, max_shard_bytes=shard)
    else:
        ours = zerolaunch.api.save_hf_pretrained(
            engine, tmp_path / "out", dtype=torch_dtype, max_shard_bytes=shard or 10**12
        )
    ref = _reference(engine, config, tmp_path / "ref", torch_dtype, shard or "50GB")
    (files, tensors, side), (ref_files, ref_tensors, ref_side) = _folder(ours), _folder(ref)
    shard_count = sum(f.endswith(".safetensors") for f in ref_files)
    assert (shard_count > 1) == (shard is not None)
    # the same files: huggingface_hub's planner splits where save_pretrained's call of it does
    assert files == ref_files
    assert sorted(tensors) == sorted(ref_tensors)  # the tied lm_head stored once, as save_pretrained does
    for name, t in ref_tensors.items():
        assert tensors[name].dtype == t.dtype and torch.equal(tensors[name], t), name
    side["config.json"] = _without_rope_theta(side["config.json"], ref_side["config.json"])
    for f in ("config.json", "generation_config.json"):
        for key in sorted(set(ref_side[f]) | set(side[f])):
            assert side[f].get(key, "<absent>") == ref_side[f].get(key, "<absent>"), (f, key)
    if shard is not None:
        index = "model.safetensors.index.json"
        assert side[index]["metadata"] == ref_side[index]["metadata"]  # total_parameters and total_size
        assert side[index]["weight_map"] == ref_side[index]["weight_map"]
    assert not any(p.name.startswith(".tmp-") for p in tmp_path.iterdir())


# ---- one atomic writer serves both paths -----------------------------------------------------------------
def _write(writer, engine, tmp_path, out, **kwargs):
    if writer == "convert":
        engine.save_checkpoint(tmp_path / "ck")
        return convert_checkpoint(tmp_path / "ck", out, force=True, **kwargs)
    shard = kwargs.get("max_shard_bytes")
    return zerolaunch.api.save_hf_pretrained(engine, out, max_shard_bytes=shard or 10**12)


@pytest.mark.parametrize("writer", ["convert", "save_hf_pretrained"])
def test_both_paths_use_the_one_hf_writer_and_its_index_bytes_equal_save_pretrained(
    tmp_path, monkeypatch, writer
):
    from zerolaunch.checkpoint import hf_folder

    used = []

    class Recording(hf_folder.HFFolderWriter):
        def finish(self, *args, **kwargs):
            used.append(self.out)
            return super().finish(*args, **kwargs)

    monkeypatch.setattr(hf_folder, "HFFolderWriter", Recording)
    engine = _trained_engine(GPT2)
    ours = _write(writer, engine, tmp_path, tmp_path / "out", max_shard_bytes=8_000)
    assert used == [ours]
    ref = _reference(engine, GPT2, tmp_path / "ref", torch.float32, 8_000)
    name = "model.safetensors.index.json"
    # byte for byte: save_pretrained writes indent 2, sorted keys, a final newline (transformers 5.24)
    ours_index, ref_index = (ours / name).read_text(), (ref / name).read_text()
    assert json_shape(ours_index) == json_shape(ref_index)
    assert ours_index.endswith("}\n") and ref_index.endswith("}\n")
    for f in ("config.json", "generation_config.json"):
        ours_json, ref_json = (ours / f).read_text(), (ref / f).read_text()
        if f == "config.json":
            kept = _without_rope_theta(json.loads(ours_json), json.loads(ref_json))
            ours_json = json.dumps(kept, indent=2, sort_keys=True) + "\n"
        assert _without_version(ours_json) == _without_version(ref_json), f


def _without_rope_theta(ours: dict, ref: dict) -> dict:
    """Our config.json less the one key save_pretrained does not write: `rope_theta`, for transformers 4.x,
    which reads it there and not inside `rope_parameters` (it must equal the theta in there)."""
    ours = dict(ours)
    if "rope_parameters" in ref:
        assert ours.pop("rope_theta") == ref["rope_parameters"]["rope_theta"]
    assert "rope_theta" not in ours or "rope_theta" in ref
    return ours


def _without_version(text):
    """The JSON text without its transformers_version line (it may name another version)."""
    return "\n".join(ln for ln in text.splitlines() if not ln.startswith('  "transformers_version"'))


def json_shape(text):
    """The index text with the shard file names blanked (the split is compared on its own above)."""
    import re

    return re.sub(r"model-\d{5}-of-\d{5}\.safetensors", "SHARD", text)


@pytest.mark.parametrize("writer", ["convert", "save_hf_pretrained"])
def test_a_failure_mid_write_keeps_the_previous_folder_and_leaves_no_temp(tmp_path, monkeypatch, writer):
    from zerolaunch.checkpoint import hf_folder

    engine = _trained_engine(GPT2)
    out = _write(writer, engine, tmp_path, tmp_path / "out", max_shard_bytes=8_000)
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    calls = []

    def failing_put(self, name, tensor):
        calls.append(name)
        if len(calls) == 2:
            raise OSError("disk full (injected)")
        return original(self, name, tensor)

    original = hf_folder.HFFolderWriter.put
    monkeypatch.setattr(hf_folder.HFFolderWriter, "put", failing_put)
    with pytest.raises(OSError, match="injected"):
        _write(writer, engine, tmp_path, out, max_shard_bytes=8_000)
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before
    assert not [p for p in tmp_path.iterdir() if p.name.startswith((".tmp-", ".trash-"))]
