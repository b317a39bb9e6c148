"""What every command shares: the consoles, the outcome colours, the usage error, and how a
line that carries student text is printed (grader.sanitize: no control character, no rich
markup, no workflow command in GitHub Actions)."""

from __future__ import annotations

import os
from contextlib import contextmanager
from typing import NoReturn

import typer
from rich.console import Console
from rich.markup import escape

from grader.results import Outcome
from grader.sandbox.backend import isolation_help
from grader.sanitize import ActionsLog, for_terminal, one_line
from grader.settings import current

ISOLATION_HELP = isolation_help() + " See docs/security.md."

# no highlighting and no :emoji: codes: a student's text is shown as it is, never restyled. In GitHub
# Actions no line is wrapped either (a wrapped line may start with any word of a student's text,
# and the runner reads a workflow command at the start of any line): `shown` text stays in its line
console = Console(highlight=False, emoji=False, soft_wrap=current().in_actions)
PIPED_WIDTH = 1000  # columns a table may take where no terminal sets them: never cut, a log viewer wraps


def is_terminal(c: Console) -> bool:
    """`c` writes to a terminal for real. Rich takes FORCE_COLOR for a terminal, which a CI
    platform sets for its log (Classmoji's command grader does): colours are welcome there, but
    a live bar redrawn in a file fills the log, and a line wrapped at 80 columns cuts a reproducer."""
    try:
        return c.file.isatty()
    except (AttributeError, ValueError, OSError):
        return False


def _fit_stream(c: Console) -> None:
    """Piped (a file, `| tee`, a CI log) nothing is wrapped or cut at rich's default 80 columns: a
    reproducer (`--seed 835908367`) is pasted whole, and a table keeps its whole case names
    (`5x5-whole-image-1x4x...` was cut), unless COLUMNS says how wide the reader is."""
    c.soft_wrap = current().in_actions or not is_terminal(c)
    if not is_terminal(c) and not os.environ.get("COLUMNS"):
        c.width = PIPED_WIDTH
    elif c._width == PIPED_WIDTH:  # a terminal now (a warm judge's fork was handed one): its own width
        c._width = None


_fit_stream(console)
# a message is one line, even piped: a path is never cut
err = Console(stderr=True, highlight=False, soft_wrap=True, emoji=False)


def attach_terminal() -> None:
    """The consoles look again at the streams they write to: a warm judge's fork (grader.resident)
    imported this module before it was handed its caller's terminal."""
    for c in (console, err):
        c._color_system = c._detect_color_system()  # rich decides colours once, where it is made
    _fit_stream(console)

# rich's style of each outcome; keyed by Outcome, so a plain string read back from JSON finds its style too
STYLE: dict[Outcome, str] = {
    Outcome.PASSED: "green", Outcome.FAILED: "red", Outcome.ERROR: "red", Outcome.TIMEOUT: "magenta",
    Outcome.CRASHED: "magenta", Outcome.SKIPPED: "dim", Outcome.FLAGGED: "bold yellow",
    Outcome.INFRA_ERROR: "bold blue"}


class UsageError(Exception):
    pass


def shown(text: object, limit: int | None = None) -> str:
    """Student text inside a rich markup string: one line, control characters shown as escapes,
    `[` that rich would read as a tag escaped."""
    return escape(one_line(text, limit))


def shown_lines(text: object) -> str:
    """`shown` that keeps newlines (a traceback, a message of several lines)."""
    return escape(for_terminal(text))


def in_actions() -> bool:
    return current().in_actions


@contextmanager
def commands_stopped(on: Console, active: bool | None = None):
    """In GitHub Actions (or where `active` says so), what `on` prints inside runs no workflow
    command (grader.sanitize.ActionsLog.stopped): the runner reads commands from stdout and
    stderr alike, and a console wraps a line wherever a word of student text falls."""
    if not (in_actions() if active is None else active):
        yield
        return

    def write(line: str) -> None:
        on.file.write(line)
        on.file.flush()

    with ActionsLog.stopped(write):
        yield


def say(on: Console, markup: str, active: bool | None = None) -> None:
    """One message that carries student text (already through `shown`), stopped for Actions."""
    with commands_stopped(on, active):
        on.print(markup, soft_wrap=True)


def fail(exc: Exception) -> NoReturn:
    """A usage error or a malformed input file: one line, exit 2. Its message may quote a
    student's file (a roster, a grader.toml), so it is shown as text."""
    say(err, f"[red]error:[/red] {shown_lines(exc)}")
    raise typer.Exit(2)
