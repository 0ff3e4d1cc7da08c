"""User-facing errors of zerolaunch and the did-you-mean helper.

`UserError` (util/errors.py, below every layer) is the base of every error caused by the user's input (a
recipe, a flag, a path): the CLI prints its message as one paragraph and exits 2, without a traceback.
`RecipeError` is the recipe flavour. This module owns the wording helpers shared by the recipe loader; it
knows nothing of the schema itself.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable

from zerolaunch.util.errors import UserError


class RecipeError(UserError):
    """A recipe (YAML/JSON file, DeepSpeed config or --set override) that cannot be used as given."""


def closest(word: str, choices: Iterable[str]) -> str | None:
    """The closest valid spelling of `word` (difflib), or None when nothing is close."""
    choices = list(choices)
    matches = difflib.get_close_matches(word, choices, n=1, cutoff=0.6)
    if not matches:
        # A case-only or prefix slip (`Stage`, `reduce_bucket`) is close enough even under the cutoff.
        lowered = {c.lower(): c for c in choices}
        if word.lower() in lowered:
            return lowered[word.lower()]
        prefixed = [c for c in choices if c.startswith(word) or word.startswith(c)]
        return prefixed[0] if len(prefixed) == 1 else None
    return matches[0]


def did_you_mean(word: str, choices: Iterable[str]) -> str:
    """' Did you mean `x`?' or a list of the valid keys when nothing is close."""
    choices = sorted(choices)
    guess = closest(word, choices)
    if guess is not None:
        return f" Did you mean `{guess}`?"
    shown = ", ".join(choices[:12]) + (", ..." if len(choices) > 12 else "")
    return f" Valid keys here: {shown}."


def dotted(path: Iterable[str]) -> str:
    return ".".join(str(p) for p in path)
