"""DeepSpeed's monitor blocks in a real (in-process, world size 1) training run.

Covers: csv_monitor writes DeepSpeed's layout (<run_dir>/csv_monitor/<job_name>/Train_Samples_<metric>.csv,
header `step,<metric>`, one row per optimizer step with x = samples seen) with the loss and lr that
metrics.jsonl has; output_path puts the folder at output_path/job_name; enabled: false writes nothing;
tensorboard writes event files when the package is installed, and is a recipe error naming the extra when it
is not; wandb likewise. Leaves out: several ranks (rank 0 alone writes; the loop's rank check is one line).
"""

import csv
import importlib.util
import json

import pytest
import torch
from _helpers import tiny_gpt_recipe

from zerolaunch.config import load_recipe
from zerolaunch.config.errors import RecipeError
from zerolaunch.train.context import RunContext
from zerolaunch.train.loop import run_training

pytestmark = pytest.mark.e2e
HAS_TB = importlib.util.find_spec("tensorboard") is not None
HAS_WANDB = importlib.util.find_spec("wandb") is not None


def _recipe(run_dir, monitors: dict, steps=4):
    return load_recipe(
        tiny_gpt_recipe(
            seq_len=16,
            train={
                "steps": steps,
                "micro_batch_size": 2,
                "gradient_accumulation_steps": 2,
                "lr": 1e-2,
                "log_every": 100,
                "run_dir": str(run_dir),
            },
            deepspeed={"zero_optimization": {"stage": 1}, **monitors},
        ),
        world_size=1,
    )


def _ctx():
    return RunContext(rank=0, local_rank=0, world_size=1, device=torch.device("cpu"))


def _csv(path):
    with open(path, newline="") as f:
        return list(csv.reader(f))


def test_csv_monitor_writes_deepspeeds_layout(tmp_path, group):
    run_dir = tmp_path / "run"
    run_training(_recipe(run_dir, {"csv_monitor": {"enabled": True, "job_name": "job1"}}), _ctx())
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in records if "loss" in r and "step" in r]
    assert len(steps) == 4
    folder = run_dir / "csv_monitor" / "job1"
    names = sorted(p.name for p in folder.iterdir())
    assert names == ["Train_Samples_grad_norm.csv", "Train_Samples_lr.csv", "Train_Samples_train_loss.csv"]
    loss = _csv(folder / "Train_Samples_train_loss.csv")
    assert loss[0] == ["step", "train_loss"]
    assert [int(row[0]) for row in loss[1:]] == [4 * r["step"] for r in steps]  # global batch 4 per step
    for row, r in zip(loss[1:], steps, strict=True):
        assert float(row[1]) == pytest.approx(r["loss"], rel=1e-6)
    lr = _csv(folder / "Train_Samples_lr.csv")
    assert lr[0] == ["step", "lr"] and len(lr) == 5
    for row, r in zip(lr[1:], steps, strict=True):
        assert float(row[1]) == pytest.approx(r["lr"], rel=1e-6)


def test_csv_monitor_output_path_and_disabled(tmp_path, group):
    out = tmp_path / "elsewhere"
    monitors = {"csv_monitor": {"enabled": True, "output_path": str(out)}, "tensorboard": {"enabled": False}}
    recipe = _recipe(tmp_path / "run", monitors, steps=2)
    assert "tensorboard" not in recipe.train.monitors
    run_training(recipe, _ctx())
    assert len(_csv(out / "DeepSpeedJobName" / "Train_Samples_train_loss.csv")) == 3
    assert not (tmp_path / "run" / "csv_monitor").exists() and not (tmp_path / "run" / "tensorboard").exists()


def test_disabled_monitors_write_nothing(tmp_path, group):
    out = str(tmp_path / "m")
    off = {
        "csv_monitor": {"enabled": False, "output_path": out},
        "tensorboard": {"enabled": False, "output_path": out},
        "wandb": {"enabled": False, "project": "p"},
    }
    recipe = _recipe(tmp_path / "run", off, steps=1)
    assert recipe.train.monitors == {}
    run_training(recipe, _ctx())
    assert not (tmp_path / "m").exists()
    assert not [p for p in (tmp_path / "run").iterdir() if p.name in ("csv_monitor", "tensorboard")]


@pytest.mark.skipif(HAS_TB, reason="tensorboard is installed here")
def test_tensorboard_missing_is_a_clear_error(tmp_path):
    with pytest.raises(
        RecipeError, match=r"tensorboard.*not installed.*pip install zerolaunch\[tensorboard\]"
    ):
        _recipe(tmp_path, {"tensorboard": {"enabled": True}})


@pytest.mark.skipif(HAS_WANDB, reason="wandb is installed here")
def test_wandb_missing_is_a_clear_error(tmp_path):
    with pytest.raises(RecipeError, match=r"wandb.*not installed.*pip install zerolaunch\[wandb\]"):
        _recipe(tmp_path, {"wandb": {"enabled": True, "project": "p"}})


@pytest.mark.skipif(not HAS_TB, reason="the tensorboard package is not installed")
def test_tensorboard_writes_events(tmp_path, group):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    run_dir = tmp_path / "run"
    run_training(_recipe(run_dir, {"tensorboard": {"enabled": True, "job_name": "tb"}}, steps=3), _ctx())
    acc = EventAccumulator(str(run_dir / "tensorboard" / "tb"))
    acc.Reload()
    assert [e.step for e in acc.Scalars("Train/Samples/train_loss")] == [4, 8, 12]


def test_initialize_writes_the_csv_monitor(tmp_path, group):
    # A DeepSpeed-style script: zerolaunch.initialize with a ds_config holding csv_monitor.
    import zerolaunch

    torch.manual_seed(0)
    model = torch.nn.Linear(7, 3)
    config = {
        "train_micro_batch_size_per_gpu": 2,
        "gradient_accumulation_steps": 2,
        "optimizer": {"type": "AdamW", "params": {"lr": 1e-2}},
        "csv_monitor": {"enabled": True, "output_path": str(tmp_path), "job_name": "script"},
    }
    engine = zerolaunch.initialize(model, config)
    losses = []
    for step in range(3):
        micro = []
        for m in range(2):
            g = torch.Generator().manual_seed(10 * step + m)
            x, y = torch.randn(2, 7, generator=g), torch.randn(2, 3, generator=g)
            loss = torch.nn.functional.mse_loss(engine(x), y)
            micro.append(loss.item())
            engine.backward(loss)
            engine.step()
        losses.append(sum(micro) / 2)
    rows = _csv(tmp_path / "script" / "Train_Samples_train_loss.csv")
    assert rows[0] == ["step", "train_loss"]
    assert [int(r[0]) for r in rows[1:]] == [4, 8, 12]
    assert [float(r[1]) for r in rows[1:]] == pytest.approx(losses, rel=1e-6)
