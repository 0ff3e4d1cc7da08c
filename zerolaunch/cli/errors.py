"""Turning user errors into one red paragraph on stderr and exit code 2 -- never a traceback.

Every command body runs inside `user_errors()` (or under `@handles_user_errors`). `UserError` (and its
`RecipeError` flavour) is the user's to fix, so the message is the whole answer. Anything else is a bug in
zerolaunch and keeps its traceback.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar

import typer

from zerolaunch.config.errors import UserError

F = TypeVar("F", bound=Callable[..., Any])


def print_user_error(exc: UserError) -> None:
    from rich.console import Console
    from rich.text import Text

    # soft_wrap: the terminal wraps the paragraph; rich must not cut it into fixed-width lines.
    console = Console(stderr=True, highlight=False, soft_wrap=True)
    console.print(Text(f"error: {exc.message}", style="bold red"))


@contextmanager
def user_errors() -> Iterator[None]:
    try:
        yield
    except UserError as exc:
        print_user_error(exc)
        raise typer.Exit(exc.exit_code) from None


def handles_user_errors(fn: F) -> F:
    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        with user_errors():
            return fn(*args, **kwargs)

    return wrapper  # type: ignore[return-value]
