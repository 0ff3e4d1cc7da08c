"""Recipes: YAML/JSON files (and DeepSpeed configs) -> --set overrides -> "auto" resolved -> frozen `Recipe`.

Import cost is kept low (no torch, no rich at import): the CLI imports this to answer quickly. Start at
`load_recipe` (`deepspeed_engine_options` for a DeepSpeed config alone); the pipeline is load.py (files,
--set) -> deepspeed.py (vocabulary) -> auto.py (batch rule, two spellings, "auto") -> engine_options.py
(EngineOptions) -> schema.py (the frozen result).
"""

from __future__ import annotations

import importlib
from typing import Any

# Exports are resolved on first use (PEP 562), so `zerolaunch.config.errors` alone does not pull in yaml.
_EXPORTS = {
    "import_builder": "builders",
    "RecipeError": "errors",
    "UserError": "errors",
    "deepspeed_engine_options": "load",
    "load_recipe": "load",
    "load_resolved": "load",
    "save_resolved": "load",
    "CheckpointSection": "schema",
    "DataSection": "schema",
    "ModelSection": "schema",
    "Recipe": "schema",
    "TrainSection": "schema",
    "render_recipe_table": "table",
}


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module 'zerolaunch.config' has no attribute {name!r}")
    return getattr(importlib.import_module(f".{_EXPORTS[name]}", __name__), name)


__all__ = [
    "CheckpointSection",
    "DataSection",
    "ModelSection",
    "Recipe",
    "RecipeError",
    "TrainSection",
    "UserError",
    "deepspeed_engine_options",
    "import_builder",
    "load_recipe",
    "load_resolved",
    "render_recipe_table",
    "save_resolved",
]
