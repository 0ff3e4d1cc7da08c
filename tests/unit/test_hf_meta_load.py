"""hf/meta_load.py on one process: `from_pretrained` after stage-3 zerolaunch TrainingArguments builds the
model on the meta device, and the stage-3 engine fills it from the folder's files with the values
transformers' own load gives (a bf16 folder loaded as fp32 included).

Covers: the meta build and its dtype ("auto": the folder's; an explicit dtype), eval mode, the generation
config; equal logits through the engine; transformers' own load at stages 0-2, once the arguments are gone,
under plain_from_pretrained(), inside a Trainer's constructor, and for keywords the meta build cannot honour.
Leaves out: several ranks and memory (tests/hf/test_pretrained_memory.py).
"""

import gc

import pytest
import torch

pytest.importorskip("transformers", minversion="5.17")

import transformers  # noqa: E402
from _helpers import tiny_llama  # noqa: E402
from transformers import AutoModelForCausalLM, LlamaForCausalLM  # noqa: E402

from zerolaunch.hf import TrainingArguments, meta_load, plain_from_pretrained, zero_trainer  # noqa: E402
from zerolaunch.models import hf  # noqa: E402
from zerolaunch.models.hf import meta_init_fn  # noqa: E402
from zerolaunch.zero import Engine, EngineOptions  # noqa: E402
from zerolaunch.zero.options import ZeroOptions  # noqa: E402

STAGE3 = EngineOptions(zero=ZeroOptions(stage=3, stage3_param_persistence_threshold=0))


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    """A tiny Llama saved in bf16 (untied, so every tensor is read under its own name)."""
    torch.manual_seed(0)
    model = hf.build(config=tiny_llama(tie_word_embeddings=False)).to(torch.bfloat16)
    out = tmp_path_factory.mktemp("meta_load") / "model"
    model.save_pretrained(out)
    return out


@pytest.fixture(autouse=True)
def _switched_off_after():
    """A test's arguments may outlive it in a reference cycle; the tests run after it load as transformers does."""
    yield
    meta_load.deactivate()


def _args(tmp_path, stage: int):
    return TrainingArguments(
        output_dir=str(tmp_path),
        use_cpu=True,
        report_to=[],
        deepspeed={"zero_optimization": {"stage": stage}},
    )


def _on_meta(model) -> bool:
    return all(p.is_meta for p in model.parameters())


def test_stage3_arguments_make_from_pretrained_build_on_meta_and_the_engine_loads_it(folder, tmp_path):
    args = _args(tmp_path, 3)
    auto = AutoModelForCausalLM.from_pretrained(folder)
    assert _on_meta(auto) and {p.dtype for p in auto.parameters()} == {torch.bfloat16}
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    assert _on_meta(model) and {p.dtype for p in model.parameters()} == {torch.float32}
    assert type(model) is LlamaForCausalLM and not model.training
    assert model.generation_config.bos_token_id == model.config.bos_token_id
    with plain_from_pretrained():
        plain = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    assert not any(p.is_meta for p in plain.parameters())
    engine = Engine(model, STAGE3, init_fn=meta_init_fn(model, STAGE3))
    ids = torch.randint(0, 64, (2, 8), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        assert torch.equal(engine(input_ids=ids).logits, plain(input_ids=ids).logits)
    del args


def test_transformers_loads_whole_otherwise(folder, tmp_path):
    args = _args(tmp_path, 2)
    assert not _on_meta(AutoModelForCausalLM.from_pretrained(folder))
    args = _args(tmp_path, 3)
    # keywords the meta build cannot reproduce go to transformers
    assert not _on_meta(AutoModelForCausalLM.from_pretrained(folder, device_map="cpu"))
    assert not _on_meta(LlamaForCausalLM.from_pretrained(folder, num_hidden_layers=2))  # a config override
    del args
    gc.collect()  # the arguments are gone: as with DeepSpeed's HfDeepSpeedConfig, the rule goes with them
    assert not _on_meta(AutoModelForCausalLM.from_pretrained(folder))


def test_a_trainer_constructor_loads_whole(folder, tmp_path):
    """TRL loads a model named by a string inside its constructor, then PEFT puts adapters on their base layer's
    device: that load must be a whole one."""
    loaded = []

    class Loading(transformers.Trainer):  # as TRL's SFTTrainer, under zero_trainer
        def __init__(self, *a, **k):
            loaded.append(AutoModelForCausalLM.from_pretrained(folder))
            super().__init__(*a, **k)

    args = _args(tmp_path, 3)
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    assert _on_meta(model)
    zero_trainer(Loading)(model=model, args=args)
    assert not _on_meta(loaded[0])
    # the Trainer took the arguments: a later load (an evaluation, an adapter folder read back) is whole
    assert not _on_meta(AutoModelForCausalLM.from_pretrained(folder))


def test_frozen_params_of_a_meta_load_are_filled_from_the_files(folder, tmp_path):
    """Frozen params are sharded in their units at stage 3: they too are read from the files as each unit is
    built (the LoRA-style case: all but the last layer and the head frozen)."""
    args = _args(tmp_path, 3)
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    for name, p in model.named_parameters():
        p.requires_grad_(name.startswith(("model.layers.3.", "lm_head.")))
    with plain_from_pretrained():
        plain = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    engine = Engine(model, STAGE3, init_fn=meta_init_fn(model, STAGE3))
    assert engine.sharding.frozen_params == []  # every frozen param sits in a unit, none resident
    assert sorted(model.zerolaunch_init_fn.loaded_names) == sorted(plain.state_dict())
    ids = torch.randint(0, 64, (2, 8), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        assert torch.equal(engine(input_ids=ids).logits, plain(input_ids=ids).logits)
    del args


def test_peft_on_a_meta_load(folder, tmp_path):
    """PEFT puts adapters on their base layer's device: on a meta-built model they have no values. A Trainer
    given a peft_config gets the model loaded whole; adapters added by hand are refused at the engine build,
    with the way out."""
    peft = pytest.importorskip("peft")
    seen = []

    class TakesPeft(transformers.Trainer):  # as TRL's trainers: peft_config applied in the constructor
        def __init__(self, model=None, args=None, peft_config=None, **k):
            seen.append(model)
            super().__init__(model=model, args=args, **k)

    args = _args(tmp_path, 3)
    config = peft.LoraConfig(r=2, target_modules=["q_proj"])
    adapted = peft.get_peft_model(AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32), config)
    with pytest.raises(ValueError, match="plain_from_pretrained"):
        Engine(adapted, STAGE3, init_fn=meta_init_fn(adapted.base_model.model, STAGE3))
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    zero_trainer(TakesPeft)(model=model, args=args, peft_config=config)
    assert not _on_meta(seen[0]) and seen[0] is not model
    del args
