"""Tokenizer files in a Hugging Face output folder: the recipe's tokenizer (data.args.tokenizer, else a
model.args.path folder holding one) is written by convert-checkpoint (via rank 0's checkpoint extra) and by
api.save_hf_pretrained(tokenizer=...) through the tokenizer's own save_pretrained: file for file what
`AutoTokenizer.from_pretrained(folder).save_pretrained(...)` writes. The tokenizer
is built on the fly with the tokenizers library (no network). Leaves out: the CLI train loop itself."""

from __future__ import annotations

import json

import pytest

transformers = pytest.importorskip("transformers")
tokenizers = pytest.importorskip("tokenizers")

from _helpers import tiny_gpt2, trained_hf_engine  # noqa: E402

import zerolaunch  # noqa: E402
from zerolaunch.checkpoint.convert import convert_checkpoint  # noqa: E402
from zerolaunch.checkpoint.errors import CheckpointError  # noqa: E402
from zerolaunch.checkpoint.extra import HF_TOKENIZER_KEY  # noqa: E402
from zerolaunch.checkpoint.hf_folder import recipe_tokenizer_dir  # noqa: E402

GPT2 = tiny_gpt2()


def _tokenizer():
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    trainer = trainers.BpeTrainer(vocab_size=60, special_tokens=["<unk>", "<eos>"])
    tok.train_from_iterator(["the quick brown fox jumps over the lazy dog"] * 20, trainer)
    return transformers.PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", eos_token="<eos>")


@pytest.fixture
def tokdir(tmp_path):
    out = tmp_path / "tok"
    _tokenizer().save_pretrained(out)
    return out


def _resaved(tokdir, tmp_path):
    """The reference for a tokenizer folder: loaded and saved by transformers itself (a reload adds keys
    such as is_local to tokenizer_config.json, so it is not the folder's bytes)."""
    ref = tmp_path / "ref"
    transformers.AutoTokenizer.from_pretrained(tokdir, local_files_only=True).save_pretrained(ref)
    return ref


def _engine():
    return trained_hf_engine(GPT2, seq_len=8)[0]


def _tokenizer_files(folder):
    names = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "chat_template.jinja")
    return {n: (folder / n).read_bytes() for n in names if (folder / n).is_file()}


def _check(out, tokdir):
    ref = _tokenizer_files(tokdir)
    assert "tokenizer.json" in ref and "tokenizer_config.json" in ref
    assert _tokenizer_files(out) == ref
    loaded = transformers.AutoTokenizer.from_pretrained(out, local_files_only=True)
    assert loaded("the lazy fox").input_ids == _tokenizer()("the lazy fox").input_ids


def test_convert_copies_the_tokenizer_named_in_the_checkpoint(tmp_path, tokdir):
    engine = _engine()
    engine.save_checkpoint(tmp_path / "ck", extra={HF_TOKENIZER_KEY: str(tokdir)})
    _check(convert_checkpoint(tmp_path / "ck", tmp_path / "out"), _resaved(tokdir, tmp_path))


def test_convert_without_a_tokenizer_writes_none(tmp_path):
    engine = _engine()
    engine.save_checkpoint(tmp_path / "ck")
    assert _tokenizer_files(convert_checkpoint(tmp_path / "ck", tmp_path / "out")) == {}


def test_convert_names_a_tokenizer_folder_that_is_gone(tmp_path, tokdir):
    engine = _engine()
    engine.save_checkpoint(tmp_path / "ck", extra={HF_TOKENIZER_KEY: str(tmp_path / "gone")})
    with pytest.raises(CheckpointError, match="gone does not exist"):
        convert_checkpoint(tmp_path / "ck", tmp_path / "out")
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("given", ["folder", "object"])
def test_save_hf_pretrained_writes_the_tokenizer(tmp_path, tokdir, given):
    tokenizer, ref = tokdir, _resaved(tokdir, tmp_path)
    if given == "object":  # the reference: what this object's own save_pretrained writes
        tokenizer, ref = transformers.AutoTokenizer.from_pretrained(tokdir), tmp_path / "ref-object"
        tokenizer.save_pretrained(ref)
    _check(zerolaunch.api.save_hf_pretrained(_engine(), tmp_path / "out", tokenizer=tokenizer), ref)


def test_recipe_tokenizer_dir_prefers_data_tokenizer_then_a_model_folder_with_one(tmp_path, tokdir):
    model_dir = tmp_path / "model"
    model_dir.mkdir()
    assert recipe_tokenizer_dir({"path": str(model_dir)}, {}) is None  # a model folder without a tokenizer
    assert recipe_tokenizer_dir({"config": GPT2}, {"tokenizer": str(tokdir)}) == tokdir.resolve()
    (model_dir / "tokenizer.json").write_bytes((tokdir / "tokenizer.json").read_bytes())
    assert recipe_tokenizer_dir({"path": str(model_dir)}, {}) == model_dir.resolve()
    assert recipe_tokenizer_dir({"path": str(model_dir)}, {"tokenizer": str(tokdir)}) == tokdir.resolve()


def test_convert_gives_the_config_the_tokenizers_special_ids(tmp_path, tokdir):
    # a model built from an inline config carries its class's defaults (GPT-2: 50256), not the tokenizer's
    tokenizer = _tokenizer()
    assert GPT2.get("eos_token_id", 50256) != tokenizer.eos_token_id
    engine = _engine()
    engine.save_checkpoint(tmp_path / "ck", extra={HF_TOKENIZER_KEY: str(tokdir)})
    out = convert_checkpoint(tmp_path / "ck", tmp_path / "out")
    config = json.loads((out / "config.json").read_text())
    assert config["eos_token_id"] == tokenizer.eos_token_id
    generation = out / "generation_config.json"
    if generation.is_file():
        assert json.loads(generation.read_text()).get("eos_token_id") == tokenizer.eos_token_id


def test_recipe_tokenizer_dir_reads_a_prepared_folders_manifest(tmp_path, tokdir):
    data = tmp_path / "data"
    data.mkdir()
    (data / "manifest.json").write_text(json.dumps({"tokenizer": {"path": str(tokdir)}}))
    assert recipe_tokenizer_dir({"config": GPT2}, {"path": str(data)}) == tokdir.resolve()
    (data / "manifest.json").write_text(json.dumps({"tokenizer": {"path": str(tmp_path / "gone")}}))
    assert recipe_tokenizer_dir({"config": GPT2}, {"path": str(data)}) is None
