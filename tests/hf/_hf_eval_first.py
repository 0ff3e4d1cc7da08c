"""A zerolaunch.hf Trainer script whose DeepSpeed config has an "auto" WarmupDecayLR, calling evaluate()
before train() (`eval-first`) or not (`train-only`): what test_hf_eval_first.py runs in a subprocess (one
process, world size 1). Prints one JSON line: the eval loss before training and the lr the Trainer logged at
each training step."""

import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from _hf_run import TokenData, tiny_llama  # noqa: E402

from zerolaunch.hf import Trainer, TrainingArguments  # noqa: E402

config = {
    "zero_optimization": {"stage": 2},
    "optimizer": {"type": "AdamW", "params": {"lr": "auto", "weight_decay": "auto"}},
    "scheduler": {
        "type": "WarmupDecayLR",
        "params": {
            "warmup_min_lr": "auto",
            "warmup_max_lr": "auto",
            "warmup_num_steps": "auto",
            "total_num_steps": "auto",
        },
    },
    "train_micro_batch_size_per_gpu": "auto",
    "gradient_accumulation_steps": "auto",
}
args = TrainingArguments(
    output_dir="out",
    per_device_train_batch_size=4,
    per_device_eval_batch_size=4,
    max_steps=4,
    warmup_steps=2,
    learning_rate=1e-2,
    logging_steps=1,
    save_strategy="no",
    report_to=[],
    use_cpu=True,
    disable_tqdm=True,
    deepspeed=config,
)
trainer = Trainer(
    model=tiny_llama(), args=args, train_dataset=TokenData(16), eval_dataset=TokenData(8, seed=2)
)
before = trainer.evaluate()["eval_loss"] if sys.argv[1] == "eval-first" else None
trainer.train()
lrs = [h["learning_rate"] for h in trainer.state.log_history if "loss" in h]
print(json.dumps({"eval_loss_before": before, "lrs": lrs}))
