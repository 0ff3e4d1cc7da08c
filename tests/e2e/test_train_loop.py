"""The training loop in-process (world size 1, gloo through a FileStore): no launcher, so it is fast.

Covers: same recipe + seed = the same losses, exactly; a run resumed from a mid-run checkpoint continues
with exactly the losses of the uninterrupted run (engine state, data position and RNG restored); stage 3
builds the built-in GPT on the meta device and trains; a model returning no loss is a clear error.
Leaves out: several ranks (the CLI tests run 2), the launcher.
"""

import pytest
import torch
from _helpers import tiny_gpt_recipe

from zerolaunch.config import load_recipe
from zerolaunch.train import batches
from zerolaunch.train.context import RunContext
from zerolaunch.train.loop import run_training

pytestmark = pytest.mark.e2e


def _recipe(
    run_dir, steps=6, every=0, stage=2, seed=1234, zero_extra=None, micro=2, accum=2, seq=16, prefetch="auto"
):
    recipe = tiny_gpt_recipe(
        seq_len=seq,
        train={
            "steps": steps,
            "micro_batch_size": micro,
            "gradient_accumulation_steps": accum,
            "lr": 1e-2,
            "lr_schedule": "constant",
            "seed": seed,
            "log_every": 100,
            "run_dir": str(run_dir),
        },
        checkpoint={"every": every},
        deepspeed={"zero_optimization": {"stage": stage, **(zero_extra or {})}},
    )
    recipe["data"]["prefetch"] = prefetch
    return load_recipe(recipe, world_size=1)


def _ctx(resume=None):
    return RunContext(rank=0, local_rank=0, world_size=1, device=torch.device("cpu"), resume=resume)


def test_same_seed_same_losses_and_another_seed_differs(group, tmp_path):
    a = run_training(_recipe(tmp_path / "a"), _ctx())
    b = run_training(_recipe(tmp_path / "b"), _ctx())
    c = run_training(_recipe(tmp_path / "c", seed=99), _ctx())
    assert a == b
    assert a != c
    assert len(a) == 6


def test_resume_from_a_mid_run_checkpoint_continues_exactly(group, tmp_path):
    full = run_training(_recipe(tmp_path / "full", every=3), _ctx())
    mid = tmp_path / "full" / "checkpoints" / "step_000003"
    assert mid.is_dir()
    resumed = run_training(_recipe(tmp_path / "resumed"), _ctx(resume=str(mid)))
    assert resumed == full[3:]


def test_batches_made_in_a_worker_process_train_and_resume_as_the_thread_does(group, tmp_path):
    # data.prefetch: process (the CUDA default) forks one DataLoader worker; the losses must be the thread's
    # exactly, and a resume must pick up the consumed position, not how far the worker had run ahead
    thread = run_training(_recipe(tmp_path / "thread", prefetch="thread"), _ctx())
    full = run_training(_recipe(tmp_path / "process", every=3, prefetch="process"), _ctx())
    assert full == thread
    mid = tmp_path / "process" / "checkpoints" / "step_000003"
    resumed = run_training(_recipe(tmp_path / "resumed", prefetch="process"), _ctx(resume=str(mid)))
    assert resumed == thread[3:]


def test_stage3_builds_the_gpt_on_meta_and_trains(group, tmp_path, monkeypatch):
    seen = {}
    real_build_model = batches.build_model

    def spy(recipe, **kw):
        model = real_build_model(recipe, **kw)
        seen["meta"] = all(p.is_meta for p in model.parameters())
        return model

    monkeypatch.setattr("zerolaunch.train.loop.build_model", spy)
    # threshold 0: every param sharded, so materialisation really goes unit by unit
    zero = {"stage3_param_persistence_threshold": 0}
    recipe = _recipe(tmp_path / "s3", steps=20, stage=3, zero_extra=zero, micro=8, accum=1, seq=32)
    losses = run_training(recipe, _ctx())
    assert seen["meta"]
    assert sum(losses[-5:]) / 5 < losses[0] - 0.5, losses


def test_a_model_without_a_loss_is_a_clear_error(group, tmp_path):
    (tmp_path / "nolossmodel.py").write_text(
        "import torch\n"
        "class M(torch.nn.Module):\n"
        "    def __init__(self):\n"
        "        super().__init__()\n"
        "        self.w = torch.nn.Embedding(64, 4)\n"
        "    def forward(self, input_ids, labels=None):\n"
        "        return {'logits': self.w(input_ids)}\n"
        "def build():\n"
        "    return M()\n"
    )
    recipe = _recipe(tmp_path / "run")
    from dataclasses import replace

    recipe = replace(
        recipe, model=replace(recipe.model, builder=str(tmp_path / "nolossmodel.py") + ":build", args={})
    )
    with pytest.raises(batches.TrainError, match="without a scalar loss"):
        run_training(recipe, _ctx())


def test_resume_auto_of_a_finished_run_trains_nothing_more(group, tmp_path, capsys):
    run_dir = tmp_path / "run"
    assert len(run_training(_recipe(run_dir, steps=3), _ctx())) == 3
    capsys.readouterr()
    assert run_training(_recipe(run_dir, steps=3), _ctx(resume="auto")) == []
    said = capsys.readouterr().out
    assert "nothing to do: the checkpoint is at step 3 and train.steps is 3" in said
    assert "Throughput" not in said and "Memory per rank" not in said  # no tables of 0 logged steps
    more = run_training(_recipe(run_dir, steps=5), _ctx(resume="auto"))  # a longer schedule continues
    assert len(more) == 2


def test_init_from_a_safetensors_file_starts_from_those_weights(group, tmp_path):
    from dataclasses import replace

    from safetensors.torch import save_file

    from zerolaunch.models import gpt

    torch.manual_seed(7)
    donor = gpt.build("tiny", vocab_size=64, seq_len=16)
    # each tensor once: the tied lm_head is stored under its embedding's name only
    save_file(
        {k: v.contiguous() for k, v in donor.state_dict().items() if k != "lm_head.weight"},
        str(tmp_path / "w.safetensors"),
    )
    recipe = _recipe(tmp_path / "run", steps=1, accum=1)
    from_file = replace(recipe, model=replace(recipe.model, init_from=str(tmp_path / "w.safetensors")))
    batch = next(iter(batches.build_data(recipe, 0, 1)))
    with torch.no_grad():
        expected = donor(**batch).loss.item()
    assert run_training(from_file, _ctx()) == [pytest.approx(expected, abs=1e-6)]
    assert run_training(recipe, _ctx()) != [pytest.approx(expected, abs=1e-6)]
    bad = replace(recipe, model=replace(recipe.model, init_from=str(tmp_path / "missing.safetensors")))
    with pytest.raises(batches.TrainError, match="does not exist"):
        run_training(bad, _ctx())
