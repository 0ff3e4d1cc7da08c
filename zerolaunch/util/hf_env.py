"""The Hugging Face environment zerolaunch runs under, set before transformers is imported (models/, data/,
memory/ and launch/ all call it, so it lives below them)."""

from __future__ import annotations

import os


def hf_offline() -> None:
    """HF_HUB_OFFLINE=1 unless the user set it: zerolaunch never downloads. huggingface_hub reads it when it
    is first imported, so call this before importing transformers."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
