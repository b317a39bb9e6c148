"""What every command shares: the consoles, the outcome colours, the usage error."""

from __future__ import annotations

import typer
from rich.console import Console
from rich.markup import escape

console = Console(highlight=False)
err = Console(stderr=True, highlight=False, soft_wrap=True)  # a message is one line, even piped: a path is never cut

STYLE = {"passed": "green", "failed": "red", "error": "red", "timeout": "magenta", "crashed": "magenta",
         "skipped": "dim", "flagged": "bold yellow", "infra_error": "bold blue"}


class UsageError(Exception):
    pass


def fail(exc: Exception) -> None:
    """A usage error or a malformed input file: one line, exit 2."""
    err.print(f"[red]error:[/red] {escape(str(exc))}", soft_wrap=True)
    raise typer.Exit(2)
