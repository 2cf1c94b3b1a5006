"""How the command line speaks: rich consoles sized for pipes, and a user's error as one message with exit 2."""

from __future__ import annotations

import functools
import os
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, NoReturn, TypeVar

import typer

from ddpboot.errors import DdpbootError

if TYPE_CHECKING:
    from rich.console import Console

F = TypeVar("F", bound=Callable[..., Any])


def escape(text: str) -> str:
    """Text shown through rich markup: square brackets in messages (paths, tracebacks) are not tags."""
    from rich.markup import escape as rich_escape  # rich only when something is shown: tools start faster

    return rich_escape(text)


def console(stderr: bool = False, pipe_width: int = 200) -> Console:
    """A console as wide as the terminal (or COLUMNS). Piped output (logs, CI) gets whole tables rather than rich's
    80-column guess; help text, read through a pager, is given `pipe_width=80`."""
    from rich.console import Console

    stream = sys.stderr if stderr else sys.stdout
    width = None if stream.isatty() or os.environ.get("COLUMNS") else pipe_width
    return Console(stderr=stderr, highlight=False, soft_wrap=False, width=width)


def fail_now(message: str, code: int = 2) -> NoReturn:
    """Print a user's error as one `ddpboot: error:` paragraph and exit with `code`."""
    console(stderr=True).print(f"[bold red]ddpboot: error:[/] {escape(message)}", markup=True, soft_wrap=True)
    sys.exit(code)


def fail(message: str, code: int = 2) -> NoReturn:
    console(stderr=True).print(f"[bold red]ddpboot: error:[/] {escape(message)}", markup=True, soft_wrap=True)
    raise typer.Exit(code)


def handle_errors(fn: F) -> F:
    """Turn a DdpbootError into its message and exit 2, without a traceback."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except DdpbootError as exc:
            fail(str(exc), exc.exit_code)

    return wrapper  # type: ignore[return-value]
