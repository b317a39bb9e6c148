"""Command line: `grader check` and `grader list` (grader.cli.check), the TA's class
commands (grader.cli.classroom) and the course's kit commands (grader.cli.kit).

Exit codes: 0 every check that ran passed; 1 some check failed; 2 usage or infrastructure
error, with a one-line message.
"""

from __future__ import annotations

import typer

from grader.cli import check, classroom, kit

app = typer.Typer(add_completion=False, no_args_is_help=True, help="Grade Triton kernel assignments.")

check.register(app)
classroom.register(app)
kit.register(app)


def main() -> None:
    app()
