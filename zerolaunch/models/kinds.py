"""What kind of model a built module is, told by duck typing and without importing torch or transformers:
models/peft.py (which the launcher's pre-flight imports, torch-free) and models/hf.py both ask it here."""

from __future__ import annotations


def is_hf_model(model) -> bool:
    """True for a transformers PreTrainedModel (it has a config that save_pretrained can write)."""
    config = getattr(model, "config", None)
    return config is not None and hasattr(config, "save_pretrained") and hasattr(model, "_no_split_modules")
