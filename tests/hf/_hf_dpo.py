"""The script tests/hf/test_hf_dpo.py runs: `python tests/hf/_hf_dpo.py ENGINE OUT.pt`, TRL's DPOTrainer on 2 CPU
gloo ranks spawned here, rank 0 saving what the test compares into OUT.pt.

ENGINE ddp: stock DPOTrainer / DPOConfig (data parallel through accelerate, the reference model whole on every
rank); zerolaunch: zero_trainer(DPOTrainer) + zero_args(DPOConfig), the same script otherwise. Cases, one after
the other in the same ranks:
- explicit: a separate reference model (another init than the policy), ZeRO stage 3;
- explicit_stage2: the same at stage 2 (the reference whole on every rank, in the compute dtype);
- peft: ref_model=None with a LoRA peft_config (the reference is the policy with its adapter disabled), stage 3.
Each records the logged losses, an evaluate() after training and, under zerolaunch, the bytes the reference
model's engine holds on each rank against the model's whole bytes.
"""

from __future__ import annotations

import gc
import os
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "dist"))

import _ds_ranks  # noqa: E402
import _hf_run  # noqa: E402
import torch  # noqa: E402

CASES = {"explicit": (3, False), "explicit_stage2": (2, False), "peft": (3, True)}
"""name: (ZeRO stage, PEFT reference)."""


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


def dpo_case(rank: int, engine: str, tmp: str, name: str) -> dict:
    from trl import DPOConfig, DPOTrainer

    stage, use_peft = CASES[name]
    extra = {}
    if engine == "zerolaunch":
        from zerolaunch.hf import zero_args, zero_trainer

        DPOTrainer, DPOConfig = zero_trainer(DPOTrainer), zero_args(DPOConfig)  # noqa: N806
        extra["deepspeed"] = {
            "zero_optimization": {
                "stage": stage,
                "reduce_bucket_size": "auto",
                "stage3_param_persistence_threshold": 0,  # every param sharded, none kept whole
            }
        }
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
    if engine == "zerolaunch":
        result["ref_type"] = type(trainer.ref_model).__name__
        if use_peft:
            # the reference is the training model's frozen base: the param bytes its engine holds here
            # (the LoRA params' shards included, a small part), against the whole model's
            mine = {"params": trainer.zero_engine.memory_bytes()["params"]}
            whole = whole_bytes(trainer.model)
        else:
            ref = trainer.ref_model
            mine = {"engine": sum(ref.engine.memory_bytes().values()), "storage": storage_bytes(ref.module)}
            whole = ref_whole
            result["ref_requires_grad"] = any(p.requires_grad for p in ref.parameters())
            result["ref_dtypes"] = sorted({str(p.dtype) for p in ref.parameters()})
        held = [None, None]
        torch.distributed.all_gather_object(held, mine)
        result["held"], result["whole_bytes"] = held, whole
    del trainer, model, kwargs
    gc.collect()
    return result


def worker(rank: int, world_size: int, store: str, engine: str, out_path: str) -> None:
    _ds_ranks.init_rank(rank, world_size, store)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT="29500")  # read by nobody: the group exists
    with tempfile.TemporaryDirectory() as tmp:
        tmp = _hf_run._shared_tmp(rank, tmp)
        results = {name: dpo_case(rank, engine, tmp, name) for name in CASES}
    _ds_ranks.finish(rank, results, out_path)


def run(out_dir, timeout: float = 900) -> dict:
    """{engine: what rank 0 saved} after this script ran under both engines at once (subprocesses on the CPU,
    one thread each); a failed run fails the caller with the end of its output."""
    import subprocess

    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env = {**os.environ, "PYTHONPATH": root, "OMP_NUM_THREADS": "1", "DS_ACCELERATOR": "cpu"}
    outs = {e: os.path.join(str(out_dir), f"dpo_{e}.pt") for e in ("ddp", "zerolaunch")}
    procs = {
        e: subprocess.Popen(
            [sys.executable, os.path.abspath(__file__), e, out],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for e, out in outs.items()
    }
    for engine, proc in procs.items():
        output, _ = proc.communicate(timeout=timeout)
        assert proc.returncode == 0, f"dpo under {engine} failed:\n{output[-4000:]}"
    return {e: torch.load(out, weights_only=False) for e, out in outs.items()}


if __name__ == "__main__":
    engine, out = sys.argv[1:3]
    _ds_ranks.spawn(worker, 2, engine, out)
