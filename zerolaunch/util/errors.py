"""`UserError`, the base of every error caused by the user's input (a recipe, a flag, a path, a checkpoint):
the CLI prints its message as one paragraph and exits 2, without a traceback. Here, below every layer, so
that config/, checkpoint/ and train/ derive their errors from it without importing each other."""

from __future__ import annotations


class UserError(Exception):
    """An error in what the user gave us; the message names the problem and the fix."""

    exit_code = 2

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message

    def __str__(self) -> str:
        return self.message
