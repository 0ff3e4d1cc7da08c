"""DeepSpeed's monitor blocks (`tensorboard`, `csv_monitor`, `wandb`) resolved into `train.monitors`.

Each enabled block becomes one entry of `train.monitors`: {"tensorboard": {"dir": ...}, "csv_monitor":
{"dir": ...}, "wandb": {"project": ..., "group": ..., "team": ...}}; report/monitors.py writes them from
rank 0. The folder is DeepSpeed's `output_path/job_name` when output_path is given (relative to the working
directory, as DeepSpeed), else `<run_dir>/<block>/<job_name>`, next to metrics.jsonl. A monitor whose
package is not installed is an error here, before any worker starts, naming the extra to install. This
module imports no monitor package (it only asks whether one can be found).
"""

from __future__ import annotations

import importlib.util
import os

from .errors import RecipeError
from .values import DS, Resolver

JOB_NAME = "DeepSpeedJobName"
"""DeepSpeed's default job_name (monitor/config.py)."""
PACKAGES = {"tensorboard": ("tensorboard", "tensorboard"), "wandb": ("wandb", "wandb")}
"""block -> (module that must be importable, zerolaunch extra that installs it)."""


def _installed(module: str) -> bool:
    return importlib.util.find_spec(module) is not None


def resolve_monitors(r: Resolver, run_dir: str) -> dict[str, dict]:
    if r.tree.has(("train", "monitors")):
        path = ("train", "monitors")
        raise r.fail(
            path,
            "is set by the DeepSpeed monitor blocks, not directly",
            "Write `tensorboard`, `csv_monitor` or `wandb` blocks ({enabled: true, ...}) in the deepspeed "
            "block instead",
        )
    monitors: dict[str, dict] = {}
    for block in ("tensorboard", "csv_monitor", "wandb"):
        path = DS + (block,)
        if not isinstance(r.raw(path), dict):
            continue  # absent (check_names refuses a block that is not a mapping)
        key = f"train.monitors.{block}"
        enabled = r.value(key + ".enabled", path + ("enabled",), "bool", False)
        r.origins.pop(key + ".enabled", None)  # a row of its own would repeat the entry's presence
        if not enabled:
            r.notes[f"deepspeed.{block}"] = "enabled: false, nothing written"
            continue
        module_extra = PACKAGES.get(block)
        if module_extra and not _installed(module_extra[0]):
            raise RecipeError(
                f"{r.where(path + ('enabled',))}: `{r.tree.key(path)}` is enabled, but the `{module_extra[0]}` "
                f"package is not installed. Install it with `pip install zerolaunch[{module_extra[1]}]`, or set "
                f"{block}.enabled: false."
            )
        origin = r.tree.origin(path + ("enabled",))
        if block == "wandb":
            entry = {}
            for name, default in (("project", "deepspeed"), ("group", None), ("team", None)):
                raw = r.raw(path + (name,))
                if r.tree.has(path + (name,)) and raw is not None:
                    if not isinstance(raw, str):
                        raise r.fail(path + (name,), f"must be a string, got {raw!r}", "Give a name")
                    entry[name] = raw
                    r.record(f"{key}.{name}", r.tree.origin(path + (name,)))
                else:
                    entry[name] = default
                    r.record(f"{key}.{name}", "default")
        else:
            job = r.value(f"{key}.job_name", path + ("job_name",), "str", JOB_NAME)
            output = r.raw(path + ("output_path",))
            if r.tree.has(path + ("output_path",)) and output not in ("", None):
                if not isinstance(output, str):
                    raise r.fail(path + ("output_path",), f"must be a folder, got {output!r}", "Give a path")
                folder = os.path.join(output, job)
                note = "output_path/job_name (DeepSpeed's layout)"
            else:
                folder = os.path.join(run_dir, block, job)
                note = f"<run_dir>/{block}/<job_name>, next to metrics.jsonl"
            entry = {"dir": folder}
            r.record(f"{key}.dir", origin, note)
            r.origins.pop(f"{key}.job_name", None)
        monitors[block] = entry
    if not monitors:
        r.record(
            "train.monitors",
            "default",
            "none: enable tensorboard / csv_monitor / wandb in the deepspeed block",
        )
    return monitors
