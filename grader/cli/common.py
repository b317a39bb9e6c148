"""What every command shares: the consoles, the outcome colours, the usage error."""

from __future__ import annotations

import typer
from rich.console import Console
from rich.markup import escape

from grader.results import Outcome
from grader.sandbox.backend import isolation_help

ISOLATION_HELP = isolation_help() + " See docs/security.md."

console = Console(highlight=False)
err = Console(stderr=True, highlight=False, soft_wrap=True)  # a message is one line, even piped: a path is never cut

# rich's style of each outcome; keyed by Outcome, so a plain string read back from JSON finds its style too
STYLE: dict[Outcome, str] = {
    Outcome.PASSED: "green", Outcome.FAILED: "red", Outcome.ERROR: "red", Outcome.TIMEOUT: "magenta",
    Outcome.CRASHED: "magenta", Outcome.SKIPPED: "dim", Outcome.FLAGGED: "bold yellow", Outcome.INFRA_ERROR: "bold blue"}


class UsageError(Exception):
    pass


def fail(exc: Exception) -> None:
    """A usage error or a malformed input file: one line, exit 2."""
    err.print(f"[red]error:[/red] {escape(str(exc))}", soft_wrap=True)
    raise typer.Exit(2)
