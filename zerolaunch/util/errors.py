"""`UserError`, the base of every error caused by the user's input (a recipe, a flag, a path, a checkpoint):
the CLI prints its message as one paragraph and exits 2, without a traceback, and `TrainError`, its flavour for
what a training run cannot train with. Here, below every layer, so that config/, checkpoint/, models/, train/
and api.py derive and catch their errors without importing each other."""

from __future__ import annotations


class UserError(Exception):
    """An error in what the user gave us; the message names the problem and the fix."""

    exit_code = 2

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message

    def __str__(self) -> str:
        return self.message


class TrainError(UserError):
    """A recipe's builders, data or model that the training loop cannot train with (raised by train/ and by
    models/compiling.py); the message names the fix."""
