"""`zerolaunch train` with an HF model and `model.init_from` safetensors at ZeRO stage 3: the model is built on
the meta device and the engine reads each unit's tensors from the init_from files as it shards it, so no rank
builds the whole model, random or loaded (the loop's stage-3 path without init_from already does so).

Covers, on one gloo rank: every tensor is read from the file by the engine's unit-by-unit init, the first
step's loss is the donor model's on the same batch, with a bf16 file too (converted per tensor), and a file
of another shape is refused before anything is built. Leaves out: memory (tests/hf/test_pretrained_memory.py
measures the same unit-by-unit load under the Trainer), torch files and checkpoints as init_from (loaded into
a whole model, as before).
"""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("transformers")

from _helpers import tiny_llama  # noqa: E402

from zerolaunch.config import load_recipe  # noqa: E402
from zerolaunch.models import hf  # noqa: E402
from zerolaunch.train import batches  # noqa: E402
from zerolaunch.train.context import RunContext  # noqa: E402
from zerolaunch.train.loop import Trainer  # noqa: E402

VOCAB, SEQ = 64, 16


def _recipe(run_dir, init_from: str, **config):
    return load_recipe(
        {
            "model": {
                "builder": "zerolaunch.models.hf:build",
                "args": {"config": tiny_llama(**config)},
                "init_from": init_from,
            },
            "data": {
                "builder": "zerolaunch.data.synthetic:build",
                "args": {"vocab_size": VOCAB, "seq_len": SEQ},
            },
            "train": {
                "steps": 1,
                "micro_batch_size": 2,
                "gradient_accumulation_steps": 1,
                "lr": 1e-3,
                "lr_schedule": "constant",
                "log_every": 100,
                "run_dir": str(run_dir),
            },
            "checkpoint": {"every": 0},
            "deepspeed": {"zero_optimization": {"stage": 3, "stage3_param_persistence_threshold": 0}},
        },
        world_size=1,
    )


def _ctx():
    return RunContext(rank=0, local_rank=0, world_size=1, device=torch.device("cpu"))


@pytest.mark.parametrize("file_dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_init_from_safetensors_is_read_unit_by_unit(group, tmp_path, file_dtype):
    torch.manual_seed(5)
    donor = hf.build(config=tiny_llama()).to(file_dtype)
    donor.save_pretrained(tmp_path / "donor")
    recipe = _recipe(tmp_path / "run", str(tmp_path / "donor"))
    trainer = Trainer(recipe, _ctx())
    try:
        init = trainer.model.zerolaunch_init_fn
        # every tensor came through the engine's unit-by-unit init (the tied head under its embedding's name)
        assert sorted(init.loaded_names) == sorted(donor.state_dict())
        batch = next(iter(batches.build_data(recipe, 0, 1)))
        with torch.no_grad():
            expected = donor.float()(**batch).loss.item()
        trainer.train_step(1)
        trainer.finish()  # reads the step's loss back (deferred)
        assert trainer.losses == [pytest.approx(expected, abs=1e-6)]
    finally:
        trainer.close()


def test_init_from_of_another_shape_is_refused(group, tmp_path):
    hf.build(config=tiny_llama(intermediate_size=40)).save_pretrained(tmp_path / "other")
    with pytest.raises(batches.TrainError, match="intermediate|mlp"):
        Trainer(_recipe(tmp_path / "run", str(tmp_path / "other")), _ctx())
