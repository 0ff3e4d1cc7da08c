"""A user's Trainer script with the one import changed: what test_hf_launch.py starts with torchrun,
accelerate launch and `zerolaunch train` (entrypoint:). Writes hf_{rank}.json into the working directory."""

import json
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from _hf_run import TokenData, tiny_llama  # noqa: E402

from zerolaunch.hf import Trainer, TrainingArguments  # noqa: E402

args = TrainingArguments(
    output_dir="out",
    per_device_train_batch_size=2,
    gradient_accumulation_steps=2,
    max_steps=3,
    learning_rate=3e-3,
    logging_steps=1,
    save_strategy="no",
    report_to=[],
    use_cpu=True,
    disable_tqdm=True,
    # --ds-from-accelerate: the config comes from an accelerate config's deepspeed_config_file instead
    deepspeed=None
    if "--ds-from-accelerate" in sys.argv
    else {"zero_optimization": {"stage": 2, "reduce_bucket_size": "auto"}, "train_batch_size": "auto"},
)
trainer = Trainer(model=tiny_llama(), args=args, train_dataset=TokenData())
trainer.train()
# a launcher that started one process leaves no group (world size 1 trains without one)
grouped = torch.distributed.is_initialized()
rank, world = (torch.distributed.get_rank(), torch.distributed.get_world_size()) if grouped else (0, 1)
losses = [h["loss"] for h in trainer.state.log_history if "loss" in h]
with open(f"hf_{rank}.json", "w") as f:
    json.dump({"world": world, "losses": losses, "argv": sys.argv[1:]}, f)
