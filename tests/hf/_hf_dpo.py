"""The script tests/hf/test_hf_dpo.py runs: `python tests/hf/_hf_dpo.py ENGINE OUT.pt`, TRL's trainers with a
frozen reference model on 2 CPU gloo ranks spawned here, rank 0 saving what the test compares into OUT.pt.

ENGINE ddp: stock TRL trainers and configs (data parallel through accelerate, the reference model whole on
every rank); zerolaunch: zero_trainer(cls) + zero_args(config cls), the same script otherwise. Cases, one after
the other in the same ranks:
- explicit: DPO with a separate reference model (another init than the policy), ZeRO stage 3;
- explicit_stage2: the same at stage 2 (the reference whole on every rank, in the compute dtype);
- peft: DPO with ref_model=None and a LoRA peft_config (the reference is the policy with its adapter
  disabled), stage 3;
- kto: KTO with a separate reference model, stage 3;
- grpo: GRPO with beta > 0 (TRL loads the reference from the policy's folder), stage 3.
Each records the logged losses (DPO: and an evaluate() after training) and, under zerolaunch, the bytes the
reference model's engine holds on each rank against the model's whole bytes.
"""

from __future__ import annotations

import gc
import os
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "dist"))

import _ds_ranks  # noqa: E402
import _hf_run  # noqa: E402
import _spawn  # noqa: E402
import torch  # noqa: E402

CASES = {
    "explicit": ("dpo", 3, False),
    "explicit_stage2": ("dpo", 2, False),
    "peft": ("dpo", 3, True),
    "kto": ("kto", 3, False),
    "grpo": ("grpo", 3, False),
}
"""name: (trainer, ZeRO stage, PEFT reference)."""


def preference_data():
    from datasets import Dataset

    prompts = ["The capital of France is", "2 + 2 =", "Water boils at", "The sky is", "Cats say", "Red and"]
    chosen = [" Paris.", " 4.", " 100 degrees.", " blue.", " meow.", " blue."]
    rejected = [" Rome.", " 5!", " 10 C", " green", " woof woof.", " sad"]
    return Dataset.from_dict({"prompt": prompts * 2, "chosen": chosen * 2, "rejected": rejected * 2})


def reference_llama():
    """The tiny Llama with another init than the policy's (the DPO loss then moves from its first step)."""
    from transformers import LlamaForCausalLM

    config = _hf_run.tiny_llama().config
    torch.manual_seed(1)
    return LlamaForCausalLM(config)


def whole_bytes(model) -> int:
    return sum(p.numel() * p.element_size() for p in model.parameters())


def storage_bytes(model) -> int:
    """Bytes of the storage this rank's params hold now (each storage once): a whole model's bytes when
    every param is whole here; a stage-3 param is a view of its unit's buffer, freed between uses."""
    storages = {}
    for p in model.parameters():
        s = p.untyped_storage()
        storages[s.data_ptr()] = s.nbytes()
    return sum(storages.values())


def engine_classes(engine: str, trainer_cls, config_cls, stage: int):
    """(trainer class, config class, extra config arguments) of ENGINE."""
    if engine != "zerolaunch":
        return trainer_cls, config_cls, {}
    from zerolaunch.hf import zero_args, zero_trainer

    ds = {
        "zero_optimization": {
            "stage": stage,
            "reduce_bucket_size": "auto",
            "stage3_param_persistence_threshold": 0,  # every param sharded, none kept whole
        }
    }
    return zero_trainer(trainer_cls), zero_args(config_cls), {"deepspeed": ds}


def reference_record(trainer, whole: int) -> dict:
    """Under zerolaunch: what the trainer keeps as its reference model, and what each rank holds of it."""
    ref = trainer.ref_model
    mine = {"engine": sum(ref.engine.memory_bytes().values()), "storage": storage_bytes(ref.module)}
    held = [None, None]
    torch.distributed.all_gather_object(held, mine)
    return {
        "ref_type": type(ref).__name__,
        "ref_requires_grad": any(p.requires_grad for p in ref.parameters()),
        "ref_dtypes": sorted({str(p.dtype) for p in ref.parameters()}),
        "held": held,
        "whole_bytes": whole,
    }


def dpo_case(rank: int, engine: str, tmp: str, name: str) -> dict:
    from trl import DPOConfig, DPOTrainer

    _, stage, use_peft = CASES[name]
    DPOTrainer, DPOConfig, extra = engine_classes(engine, DPOTrainer, DPOConfig, stage)  # noqa: N806
    out = os.path.join(tmp, name)
    # bf16 off: DPOConfig turns it on by default; the comparison is in fp32
    args = DPOConfig(
        **_hf_run.common_args(
            out,
            max_steps=4,
            warmup_steps=1,
            per_device_eval_batch_size=2,
            max_length=32,
            beta=0.5,
            bf16=False,
            **extra,
        )
    )
    kwargs = {}
    if use_peft:
        from peft import LoraConfig

        # a random B (not PEFT's zeros), so the policy differs from its reference from the first step
        kwargs["peft_config"] = LoraConfig(
            r=4, lora_alpha=8, lora_dropout=0.0, target_modules=["q_proj", "v_proj"], init_lora_weights=False
        )
    else:
        kwargs["ref_model"] = reference_llama()
    ref_whole = whole_bytes(kwargs["ref_model"]) if not use_peft else None
    model = _hf_run.tiny_llama()
    trainer = DPOTrainer(
        model=model,
        args=args,
        train_dataset=preference_data(),
        processing_class=_hf_run.char_tokenizer(),
        **kwargs,
    )
    trainer.train()
    result = _hf_run.history(trainer)
    # no_grad forwards: at stage 3 the PEFT reference then runs the policy with nothing gathered
    result["eval_loss"] = trainer.evaluate(preference_data())["eval_loss"]
    result["rewards_chosen"] = [
        h["rewards/chosen"] for h in trainer.state.log_history if "rewards/chosen" in h
    ]
    if engine == "zerolaunch" and use_peft:
        # the reference is the training model's frozen base: the param bytes its engine holds here (the LoRA
        # params' shards included, a small part), against the whole model's
        held = [None, None]
        torch.distributed.all_gather_object(held, {"params": trainer.zero_engine.memory_bytes()["params"]})
        result.update(
            ref_type=type(trainer.ref_model).__name__, held=held, whole_bytes=whole_bytes(trainer.model)
        )
    elif engine == "zerolaunch":
        result.update(reference_record(trainer, ref_whole))
    del trainer, model, kwargs
    gc.collect()
    return result


def kto_data():
    """The preference pairs as KTO's unpaired examples: each completion with its desirability."""
    from datasets import Dataset

    pairs = preference_data()
    prompts = list(pairs["prompt"])
    return Dataset.from_dict(
        {
            "prompt": prompts * 2,
            "completion": list(pairs["chosen"]) + list(pairs["rejected"]),
            "label": [True] * len(prompts) + [False] * len(prompts),
        }
    )


def kto_case(rank: int, engine: str, tmp: str, name: str) -> dict:
    from trl.experimental.kto import KTOConfig, KTOTrainer

    KTOTrainer, KTOConfig, extra = engine_classes(engine, KTOTrainer, KTOConfig, CASES[name][1])  # noqa: N806
    args = KTOConfig(
        **_hf_run.common_args(
            os.path.join(tmp, name), max_steps=3, warmup_steps=1, max_length=32, bf16=False, **extra
        )
    )
    ref = reference_llama()
    ref_whole = whole_bytes(ref)
    trainer = KTOTrainer(
        model=_hf_run.tiny_llama(),
        ref_model=ref,
        args=args,
        train_dataset=kto_data(),
        processing_class=_hf_run.char_tokenizer(),
    )
    trainer.train()
    result = _hf_run.history(trainer)
    if engine == "zerolaunch":
        result.update(reference_record(trainer, ref_whole))
    del trainer, ref
    gc.collect()
    return result


def length_reward(completions, **kwargs) -> list[float]:
    return [len(c) / 10 for c in completions]


def grpo_case(rank: int, engine: str, tmp: str, name: str) -> dict:
    """GRPO with beta > 0: TRL loads its reference model from the policy's folder (written here by rank 0)."""
    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer

    GRPOTrainer, GRPOConfig, extra = engine_classes(engine, GRPOTrainer, GRPOConfig, CASES[name][1])  # noqa: N806
    folder = os.path.join(tmp, f"{name}_init")
    if rank == 0:
        _hf_run.tiny_llama().save_pretrained(folder)
    torch.distributed.barrier()
    args = GRPOConfig(
        **_hf_run.common_args(
            os.path.join(tmp, name),
            max_steps=2,
            warmup_steps=0,
            gradient_accumulation_steps=1,
            per_device_train_batch_size=4,
            num_generations=4,
            max_completion_length=6,
            beta=0.1,
            bf16=False,
            **extra,
        )
    )
    trainer = GRPOTrainer(
        model=folder,
        reward_funcs=length_reward,
        args=args,
        train_dataset=Dataset.from_dict({"prompt": list(preference_data()["prompt"])}),
        processing_class=_hf_run.char_tokenizer(),
    )
    trainer.train()
    result = _hf_run.history(trainer)
    result["kl"] = [h["kl"] for h in trainer.state.log_history if "kl" in h]
    if engine == "zerolaunch":
        result.update(reference_record(trainer, whole_bytes(trainer.ref_model.module)))
    del trainer
    gc.collect()
    return result


RUNS = {"dpo": dpo_case, "kto": kto_case, "grpo": grpo_case}


def worker(rank: int, world_size: int, store: str, engine: str, out_path: str) -> None:
    _ds_ranks.init_rank(rank, world_size, store)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT="29500")  # read by nobody: the group exists
    with tempfile.TemporaryDirectory() as tmp:
        tmp = _ds_ranks.shared_tmp(rank, tmp)
        results = {name: RUNS[CASES[name][0]](rank, engine, tmp, name) for name in CASES}
    _ds_ranks.finish(rank, results, out_path)


def run(out_dir, timeout: float = 900) -> dict:
    """{engine: what rank 0 saved} after this script ran under both engines at once (subprocesses on the CPU,
    one thread each); a failed run fails the caller with the end of its output."""
    return _spawn.run_engines(os.path.abspath(__file__), ("ddp", "zerolaunch"), out_dir, timeout=timeout)


if __name__ == "__main__":
    engine, out = sys.argv[1:3]
    _spawn.start_ranks(worker, 2, engine, out)
