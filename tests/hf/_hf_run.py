"""The scripts the tests/hf side-by-side tests run: `python tests/hf/_hf_run.py ENGINE OUT.pt FLOW`, on 2 CPU gloo
ranks spawned here, rank 0 saving what the test compares into OUT.pt.

FLOW:
- guide: the Hugging Face DeepSpeed guide's flow (TrainingArguments(deepspeed=ds_config), Trainer, train,
  save_model) at ZeRO stages 1-3, fp32, ENGINE deepspeed (stock transformers.Trainer + DeepSpeed 0.19.8) or
  zerolaunch (`from zerolaunch.hf import Trainer, TrainingArguments`, the same script otherwise).
- sft: TRL's SFTTrainer on prompt/completion data, ENGINE ddp (stock, data parallel) or zerolaunch (
  zero_trainer(SFTTrainer) + zero_args(SFTConfig), stage 3).
- sft_lora: SFTTrainer with a LoRA `peft_config` over a base model read from a folder, ENGINE ddp (stock) or
  zerolaunch (stages 2 and 3, and stage 0 with a PeftModel handed to the trainer instead of a peft_config;
  checkpoints every 3 steps; then at stage 3 a run stopped after checkpoint-3 and
  resumed from it); rank 0 reads back the adapter folders and loads them with AutoPeftModelForCausalLM.
- resume: zerolaunch at stage 2 and 3: an unbroken run of 6 steps, and a run stopped after a checkpoint at step
  3 and resumed from it (ENGINE is zerolaunch).
Imported by name from tests/dist: _spawn (starting the ranks, running the engines side by side) and _ds_ranks (a
group DeepSpeed accepts, its comm on gloo).
"""

from __future__ import annotations

import gc
import os
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "dist"))

import _ds_ranks  # noqa: E402
import _spawn  # noqa: E402
import torch  # noqa: E402

VOCAB, SEQ, EXAMPLES = 67, 12, 32


def guide_config(stage: int) -> dict:
    """The guide's ZeRO-2 / ZeRO-3 config files (docs: main_classes/deepspeed), "auto" everywhere the guide
    has it; train_batch_size given (transformers fills it with world size 1 when DeepSpeed runs on CPU) and
    torch_adam on (DeepSpeed would JIT-build its CPU Adam otherwise)."""
    zero = {"stage": stage, "overlap_comm": True, "contiguous_gradients": True}
    if stage < 3:
        zero.update(
            allgather_partitions=True,
            allgather_bucket_size=2e8,
            reduce_scatter=True,
            reduce_bucket_size="auto",
        )
    else:
        zero.update(
            sub_group_size=1e9,
            reduce_bucket_size="auto",
            stage3_prefetch_bucket_size="auto",
            stage3_param_persistence_threshold="auto",
            stage3_max_live_parameters=1e9,
            stage3_max_reuse_distance=1e9,
            stage3_gather_16bit_weights_on_model_save=True,
        )
    return {
        "fp16": {
            "enabled": "auto",
            "loss_scale": 0,
            "loss_scale_window": 1000,
            "initial_scale_power": 16,
            "hysteresis": 2,
            "min_loss_scale": 1,
        },
        "bf16": {"enabled": "auto"},
        "optimizer": {
            "type": "AdamW",
            "params": {
                "lr": "auto",
                "betas": "auto",
                "eps": "auto",
                "weight_decay": "auto",
                "torch_adam": True,  # DeepSpeed on CPU: torch's AdamW, not its JIT-built CPU Adam
            },
        },
        "scheduler": {
            "type": "WarmupLR",
            "params": {"warmup_min_lr": "auto", "warmup_max_lr": "auto", "warmup_num_steps": "auto"},
        },
        "zero_optimization": zero,
        "gradient_accumulation_steps": "auto",
        "gradient_clipping": "auto",
        "steps_per_print": 2000,
        "train_batch_size": 8,
        "train_micro_batch_size_per_gpu": "auto",
        "wall_clock_breakdown": False,
    }


class TokenData(torch.utils.data.Dataset):
    """Causal-LM examples with some labels masked (-100), so each rank's token count differs."""

    def __init__(self, n: int = EXAMPLES, seed: int = 1):
        g = torch.Generator().manual_seed(seed)
        self.ids = torch.randint(0, VOCAB, (n, SEQ), generator=g)
        self.labels = self.ids.clone()
        cut = torch.randint(1, SEQ - 2, (n,), generator=g)
        for i, c in enumerate(cut.tolist()):
            self.labels[i, :c] = -100

    def __len__(self):
        return len(self.ids)

    def __getitem__(self, i):
        return {"input_ids": self.ids[i], "labels": self.labels[i]}


def tiny_llama():
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=24,
        intermediate_size=40,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        max_position_embeddings=64,
        tie_word_embeddings=False,
    )
    return LlamaForCausalLM(config)


def read_weights(folder: str) -> dict:
    from safetensors.torch import load_file

    return {k: v.float().clone() for k, v in load_file(os.path.join(folder, "model.safetensors")).items()}


def history(trainer) -> dict:
    steps = [h for h in trainer.state.log_history if "loss" in h and "train_loss" not in h]
    return {
        "loss": [h["loss"] for h in steps],
        "grad_norm": [float(h["grad_norm"]) for h in steps],
        "learning_rate": [h["learning_rate"] for h in steps],
    }


def common_args(out_dir: str, **extra) -> dict:
    base = dict(
        output_dir=out_dir,
        per_device_train_batch_size=2,
        gradient_accumulation_steps=2,
        max_steps=5,
        learning_rate=3e-3,
        weight_decay=0.01,
        max_grad_norm=0.5,
        warmup_steps=2,
        logging_steps=1,
        save_strategy="no",
        report_to=[],
        use_cpu=True,
        seed=0,
        disable_tqdm=True,
        dataloader_num_workers=0,
    )
    base.update(extra)
    return base


def _unset_ds():
    from transformers.integrations.deepspeed import unset_hf_deepspeed_config

    unset_hf_deepspeed_config()


# ---- flows --------------------------------------------------------------------------------------------------
def guide(rank: int, engine: str, tmp: str) -> dict:
    if engine == "deepspeed":
        _ds_ranks.init_deepspeed()
        from transformers import Trainer, TrainingArguments
    else:
        from zerolaunch.hf import Trainer, TrainingArguments
    results = {}
    for stage in (1, 2, 3):
        _unset_ds()
        model = tiny_llama()  # built before the arguments: the same init under both engines
        out = os.path.join(tmp, f"stage{stage}")
        args = TrainingArguments(**common_args(out, deepspeed=guide_config(stage)))
        trainer = Trainer(model=model, args=args, train_dataset=TokenData())
        trainer.train()
        trainer.save_model(out)
        torch.distributed.barrier()
        result = {**history(trainer), "weights": read_weights(out) if rank == 0 else None}
        result["eval_loss"] = trainer.evaluate(TokenData(8, seed=2))["eval_loss"]
        result["predict_shape"] = tuple(trainer.predict(TokenData(4, seed=3)).predictions.shape)
        if engine == "zerolaunch" and stage == 3:
            result["generate"] = generate_check(rank, trainer.model)
        results[f"stage{stage}"] = result
        del trainer, model
        gc.collect()
    return results


def greedy(model, prompt, new_tokens: int):
    """`prompt` and exactly `new_tokens` greedy tokens after it (what the test recomputes on the whole model)."""
    with torch.no_grad():
        return model.generate(
            input_ids=prompt,
            attention_mask=torch.ones_like(prompt),
            max_new_tokens=new_tokens,
            min_new_tokens=new_tokens,
            do_sample=False,
            pad_token_id=0,
        )


def generate_check(rank: int, model) -> list:
    """Greedy generation on each rank with a different number of new tokens (the ranks stop at different
    lengths): [(prompt, max_new_tokens, tokens)] of every rank, gathered to all."""
    prompt = TokenData(2, seed=4 + rank).ids[:, :5]
    new_tokens = 3 + 4 * rank
    tokens = greedy(model, prompt, new_tokens)
    gathered = [None, None]
    torch.distributed.all_gather_object(gathered, (prompt, new_tokens, tokens))
    return gathered


def sft_data():
    from datasets import Dataset

    prompts = [
        "The capital of France is",
        "2 + 2 =",
        "Water boils at",
        "The sky is",
        "Cats say",
        "One, two,",
        "Red and",
        "A B C",
    ]
    completions = [" Paris.", " 4.", " 100 degrees.", " blue.", " meow.", " three.", " blue.", " D E"]
    return Dataset.from_dict({"prompt": prompts * 2, "completion": completions * 2})


def char_tokenizer():
    """A tiny byte-level tokenizer built offline (no hub download)."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {chr(i): i - 32 for i in range(32, 32 + VOCAB - 3)}
    vocab.update({"<pad>": VOCAB - 3, "<s>": VOCAB - 2, "</s>": VOCAB - 1})
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<pad>"))
    tok.pre_tokenizer = pre_tokenizers.Split("", "isolated")
    return PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", bos_token="<s>", eos_token="</s>")


def sft(rank: int, engine: str, tmp: str) -> dict:
    from trl import SFTConfig, SFTTrainer

    if engine == "zerolaunch":
        from zerolaunch.hf import zero_args, zero_trainer

        SFTTrainer, SFTConfig = zero_trainer(SFTTrainer), zero_args(SFTConfig)  # noqa: N806
        extra = {
            "deepspeed": {
                "zero_optimization": {
                    "stage": 3,
                    "reduce_bucket_size": "auto",
                    "stage3_param_persistence_threshold": "auto",
                }
            }
        }
    else:
        extra = {}
    model = tiny_llama()
    out = os.path.join(tmp, "sft")
    # bf16 off: SFTConfig turns it on by default; the comparison is in fp32
    args = SFTConfig(**common_args(out, max_length=32, completion_only_loss=True, bf16=False, **extra))
    trainer = SFTTrainer(model=model, args=args, train_dataset=sft_data(), processing_class=char_tokenizer())
    trainer.train()
    trainer.save_model(out)
    torch.distributed.barrier()
    return {**history(trainer), "weights": read_weights(out) if rank == 0 else None}


def base_folder(rank: int, tmp: str) -> str:
    """tiny_llama saved as a pretrained folder (the base an adapter config names)."""
    base = os.path.join(tmp, "base")
    if rank == 0:
        tiny_llama().save_pretrained(base)
    torch.distributed.barrier()
    return base


def lora_config():
    from peft import LoraConfig

    return LoraConfig(r=4, lora_alpha=8, lora_dropout=0.0, target_modules="all-linear", task_type="CAUSAL_LM")


def adapter_folder(folder: str) -> dict:
    """What a PEFT adapter folder holds: its files, adapter weights and config, and the weights
    AutoPeftModelForCausalLM loads from it (adapter keys as saved)."""
    import json

    from peft import AutoPeftModelForCausalLM, get_peft_model_state_dict
    from safetensors.torch import load_file

    files = sorted(os.listdir(folder))
    out = {"files": files}
    if "adapter_model.safetensors" not in files:
        return out
    out["weights"] = {
        k: v.clone() for k, v in load_file(os.path.join(folder, "adapter_model.safetensors")).items()
    }
    with open(os.path.join(folder, "adapter_config.json")) as f:
        out["config"] = json.load(f)
    loaded = AutoPeftModelForCausalLM.from_pretrained(folder)
    out["loaded"] = {k: v.detach().clone() for k, v in get_peft_model_state_dict(loaded).items()}
    out["loaded_base"] = {
        k: v.detach().clone() for k, v in loaded.get_base_model().state_dict().items() if "lora_" not in k
    }
    return out


def sft_lora(rank: int, engine: str, tmp: str) -> dict:
    from transformers import AutoModelForCausalLM
    from trl import SFTConfig, SFTTrainer

    if engine == "zerolaunch":
        from zerolaunch.hf import zero_args, zero_trainer

        SFTTrainer, SFTConfig = zero_trainer(SFTTrainer), zero_args(SFTConfig)  # noqa: N806
        stages = (2, 3)
    else:
        stages = (None,)
    base = base_folder(rank, tmp)

    def trainer_for(out: str, stage, handed: bool = False, **extra):
        """handed: a PeftModel made here is handed to the trainer (no peft_config); the same RNG draws as
        SFTTrainer's own get_peft_model, so the same adapter init."""
        kw = common_args(out, max_length=32, completion_only_loss=True, bf16=False, **extra)
        if stage is not None:
            kw["deepspeed"] = {"zero_optimization": {"stage": stage}}
        torch.manual_seed(0)  # every rank and run draws the LoRA init from the same state
        model = AutoModelForCausalLM.from_pretrained(base)
        if handed:
            from peft import get_peft_model

            model = get_peft_model(model, lora_config())
        return SFTTrainer(
            model=model,
            args=SFTConfig(**kw),
            train_dataset=sft_data(),
            processing_class=char_tokenizer(),
            peft_config=None if handed else lora_config(),
        )

    results = {}
    runs = [(stage, False) for stage in stages]
    if engine == "zerolaunch":
        runs.append((0, True))  # a PeftModel handed to the trainer, at stage 0
    for stage, handed in runs:
        out = os.path.join(tmp, f"lora{stage}")
        trainer = trainer_for(out, stage, handed, save_strategy="steps", save_steps=3)
        trainer.train()
        trainer.save_model(out)
        torch.distributed.barrier()
        result = history(trainer)
        if rank == 0:
            result["final"] = adapter_folder(out)
            result["checkpoint"] = adapter_folder(os.path.join(out, "checkpoint-3"))
            result["checkpoint_files"] = sorted(os.listdir(os.path.join(out, "checkpoint-3")))
        results[f"stage{stage}" if stage is not None else "ddp"] = result
        del trainer
        gc.collect()
    if engine == "zerolaunch":  # stage 3 stopped after checkpoint-3, a new trainer resumes from it
        out = os.path.join(tmp, "lora_resumed")
        first = trainer_for(out, 3, save_strategy="steps", save_steps=3)
        first.add_callback(StopAt(3))
        first.train()
        del first
        gc.collect()
        trainer = trainer_for(out, 3, save_strategy="steps", save_steps=3)
        trainer.train(resume_from_checkpoint=os.path.join(out, "checkpoint-3"))
        trainer.save_model(out)
        torch.distributed.barrier()
        results["resumed"] = {**history(trainer), "final": adapter_folder(out) if rank == 0 else None}
        del trainer
        gc.collect()
    return results


def resume(rank: int, engine: str, tmp: str) -> dict:
    from zerolaunch.hf import Trainer, TrainingArguments

    results = {}
    for stage in (2, 3):
        ds = {"zero_optimization": {"stage": stage}}
        runs = {}
        for name in ("unbroken", "resumed"):
            out = os.path.join(tmp, f"resume{stage}_{name}")
            kw = common_args(
                out, deepspeed=ds, max_steps=6, save_strategy="steps", save_steps=3, save_total_limit=1
            )
            if name == "resumed":  # stopped after the checkpoint at step 3: a new trainer continues from it
                first = Trainer(
                    model=tiny_llama(),
                    args=TrainingArguments(**{**kw, "max_steps": 6}),
                    train_dataset=TokenData(),
                )
                first.add_callback(StopAt(3))
                first.train()
                del first
                gc.collect()
                trainer = Trainer(model=tiny_llama(), args=TrainingArguments(**kw), train_dataset=TokenData())
                trainer.train(resume_from_checkpoint=os.path.join(out, "checkpoint-3"))
            else:
                trainer = Trainer(model=tiny_llama(), args=TrainingArguments(**kw), train_dataset=TokenData())
                trainer.train()
            trainer.save_model(os.path.join(out, "final"))
            torch.distributed.barrier()
            kept = sorted(d for d in os.listdir(out) if d.startswith("checkpoint-"))
            runs[name] = {
                **history(trainer),
                "checkpoints": kept,
                "weights": read_weights(os.path.join(out, "final")) if rank == 0 else None,
            }
            del trainer
            gc.collect()
        results[f"stage{stage}"] = runs
    results["best"] = best_model(rank, tmp)
    results["only_model"] = only_model(rank, tmp)
    return results


def best_model(rank: int, tmp: str) -> dict:
    """Stage 3, evaluated and saved every 2 steps, load_best_model_at_end with the highest eval_loss counted
    best (an earlier checkpoint than the last, while training lowers the loss): the trainer's model afterwards,
    each checkpoint's eval loss and saved weights."""
    from zerolaunch.hf import Trainer, TrainingArguments

    out = os.path.join(tmp, "best")
    kw = common_args(
        out,
        deepspeed={"zero_optimization": {"stage": 3}},
        max_steps=6,
        learning_rate=2e-2,
        eval_strategy="steps",
        eval_steps=2,
        save_strategy="steps",
        save_steps=2,
        load_best_model_at_end=True,
        metric_for_best_model="eval_loss",
        greater_is_better=False,
    )
    trainer = Trainer(
        model=tiny_llama(),
        args=TrainingArguments(**kw),
        train_dataset=TokenData(),
        eval_dataset=TokenData(8, seed=2),
    )
    trainer.train()
    final = os.path.join(out, "after_best")
    trainer.save_model(final)
    torch.distributed.barrier()
    evals = {h["step"]: h["eval_loss"] for h in trainer.state.log_history if "eval_loss" in h}
    result = {"best": trainer.state.best_model_checkpoint, "evals": evals}
    if rank == 0:
        result["weights"] = read_weights(final)
        result["checkpoints"] = {
            d: read_weights(os.path.join(out, d)) for d in os.listdir(out) if d.startswith("checkpoint-")
        }
    del trainer
    gc.collect()
    return result


def only_model(rank: int, tmp: str) -> dict:
    """Stage 3 with save_only_model: the checkpoint folder's files, and its weights against save_model's."""
    from zerolaunch.hf import Trainer, TrainingArguments

    out = os.path.join(tmp, "only_model")
    kw = common_args(
        out,
        deepspeed={"zero_optimization": {"stage": 3}},
        max_steps=3,
        save_strategy="steps",
        save_steps=3,
        save_only_model=True,
    )
    trainer = Trainer(model=tiny_llama(), args=TrainingArguments(**kw), train_dataset=TokenData())
    trainer.train()
    trainer.save_model(os.path.join(out, "final"))
    torch.distributed.barrier()
    result = {}
    if rank == 0:
        result["files"] = sorted(os.listdir(os.path.join(out, "checkpoint-3")))
        result["checkpoint"] = read_weights(os.path.join(out, "checkpoint-3"))
        result["final"] = read_weights(os.path.join(out, "final"))
    del trainer
    gc.collect()
    return result


class StopAt:
    """A callback that stops training after `step` optimizer steps (a run killed after its checkpoint)."""

    def __new__(cls, step: int):
        from transformers import TrainerCallback

        class _Stop(TrainerCallback):
            def on_step_end(self, args, state, control, **kwargs):
                if state.global_step >= step:
                    control.should_training_stop = True
                return control

        return _Stop()


FLOWS = {"guide": guide, "sft": sft, "sft_lora": sft_lora, "resume": resume}


def worker(rank: int, world_size: int, store: str, flow: str, engine: str, out_path: str) -> None:
    _ds_ranks.init_rank(rank, world_size, store)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT="29500")  # read by nobody: the group exists
    with tempfile.TemporaryDirectory() as tmp:
        tmp = _ds_ranks.shared_tmp(rank, tmp)
        results = FLOWS[flow](rank, engine, tmp)
    _ds_ranks.finish(rank, results, out_path)


def run(flow: str, engines: tuple[str, ...], out_dir, timeout: float = 900) -> dict:
    """{engine: what rank 0 saved} after this script ran FLOW under each engine at once (subprocesses on the
    CPU, one thread each); a failed run fails the caller with the end of its output."""
    return _spawn.run_engines(os.path.abspath(__file__), engines, out_dir, flow, timeout=timeout)


if __name__ == "__main__":
    engine, out, flow = sys.argv[1:4]
    _spawn.start_ranks(worker, 2, flow, engine, out)
