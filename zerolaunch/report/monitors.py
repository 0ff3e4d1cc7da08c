"""DeepSpeed-style monitors written by rank 0 beside metrics.jsonl: csv_monitor, tensorboard, wandb.

`Monitors(train.monitors)` opens the enabled ones (config/monitors.py resolved the blocks and checked the
packages); `write_step(step, info, loss, recipe)` records one optimizer step from the engine's StepInfo
(`write(step, samples, loss=..., lr=..., grad_norm=..., loss_scale=...)` underneath)
as DeepSpeed's events: the name `Train/Samples/<metric>` and the x value `samples` (the samples seen so far,
DeepSpeed's `global_samples`), with train_loss as DeepSpeed's pipeline engine names it. A metric given as
None (loss_scale outside fp16) is not written.

csv_monitor keeps DeepSpeed's layout (deepspeed/monitor/csv_monitor.py): one file per event in the folder,
named after the event with "/" and " " made "_", a header row `step,<last part of the name>`, then
`samples,value` rows. Unlike DeepSpeed, a resumed run appends without a second header.
"""

from __future__ import annotations

import csv
from pathlib import Path

EVENTS = {
    "loss": "Train/Samples/train_loss",
    "lr": "Train/Samples/lr",
    "grad_norm": "Train/Samples/grad_norm",
    "loss_scale": "Train/Samples/loss_scale",
    "eval_loss": "Train/Samples/eval_loss",
    "eval_perplexity": "Train/Samples/eval_perplexity",
}


class CsvMonitor:
    def __init__(self, folder: str):
        self.folder = Path(folder)
        self.folder.mkdir(parents=True, exist_ok=True)

    def write_events(self, events: list[tuple[str, float, int]]) -> None:
        for name, value, x in events:
            path = self.folder / (name.replace("/", "_").replace(" ", "_") + ".csv")
            new = not path.exists() or path.stat().st_size == 0
            with path.open("a", newline="", encoding="utf-8") as f:
                writer = csv.writer(f)
                if new:
                    writer.writerow(["step", name.split("/")[-1]])
                writer.writerow([x, value])

    def close(self) -> None:
        pass


class TensorBoardMonitor:
    def __init__(self, folder: str):
        from torch.utils.tensorboard import SummaryWriter  # needs the `tensorboard` package (checked at load)

        Path(folder).mkdir(parents=True, exist_ok=True)
        self._writer = SummaryWriter(log_dir=folder)

    def write_events(self, events: list[tuple[str, float, int]]) -> None:
        for name, value, x in events:
            self._writer.add_scalar(name, value, x)
        self._writer.flush()

    def close(self) -> None:
        self._writer.close()


class WandbMonitor:
    def __init__(self, project: str, group: str | None, team: str | None):
        import wandb  # checked at load: not installed is a recipe error naming the extra

        self._wandb = wandb
        self._run = wandb.init(project=project, group=group, entity=team)

    def write_events(self, events: list[tuple[str, float, int]]) -> None:
        for name, value, x in events:
            self._wandb.log({name: value}, step=x)

    def close(self) -> None:
        self._run.finish()


class Monitors:
    def __init__(self, config: dict[str, dict]):
        self._open = []
        if "csv_monitor" in config:
            self._open.append(CsvMonitor(config["csv_monitor"]["dir"]))
        if "tensorboard" in config:
            self._open.append(TensorBoardMonitor(config["tensorboard"]["dir"]))
        if "wandb" in config:
            w = config["wandb"]
            self._open.append(WandbMonitor(w.get("project", "deepspeed"), w.get("group"), w.get("team")))

    def __bool__(self) -> bool:
        return bool(self._open)

    def write(self, step: int, samples: int, **metrics: float | None) -> None:
        """One optimizer step (`step` is kept for callers' clarity; the x value is `samples`)."""
        events = [
            (EVENTS[name], float(value), samples) for name, value in metrics.items() if value is not None
        ]
        for monitor in self._open:
            monitor.write_events(events)

    def write_step(self, step: int, info, loss: float | None, recipe) -> None:
        """One optimizer step as both writers of monitors record it (the built-in loop and a script's
        engine.step()): `info` is the engine's StepInfo, x = step * the recipe's global batch size (samples
        seen), the loss scale only in an fp16 run (bf16/fp32 have none worth plotting)."""
        fp16 = recipe.engine.precision.dtype == "fp16"
        self.write(
            step,
            step * recipe.train.global_batch_size,
            loss=loss,
            lr=info.lr,
            grad_norm=info.grad_norm,
            loss_scale=info.loss_scale if fp16 else None,
        )

    def close(self) -> None:
        for monitor in self._open:
            monitor.close()
