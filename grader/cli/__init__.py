"""Command line: `grader check` and `grader list` (grader.cli.check), the TA's class commands,
one module each (grader.cli.fetch, .grade, .similarity, .leaderboard), a TA's review
(grader.cli.review) and the course's kit commands (grader.cli.kit), and `grader verify`
(grader.cli.verify): a stored speed figure re-timed.

Exit codes: 0 every check that ran passed; 1 some check failed; 2 usage or infrastructure
error, with a one-line message.
"""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from grader.cli import check, course, fetch, grade, kit, leaderboard, review, similarity, verify

app = typer.Typer(add_completion=False, no_args_is_help=True, help="Grade Triton kernel assignments.")


def versions() -> list[str]:
    """`grader X`, and torch's and Triton's versions where they are installed (read from their
    metadata: nothing is imported, so a broken install still answers)."""
    from importlib import metadata

    from grader import __version__

    lines = [f"grader {__version__}"]
    for dist in ("torch", "triton"):
        try:
            lines.append(f"{dist} {metadata.version(dist)}")
        except metadata.PackageNotFoundError:
            lines.append(f"{dist}: not installed")
    return lines


def _version(value: bool) -> None:
    if value:
        print("\n".join(versions()))
        raise typer.Exit(0)


def _course(value: Optional[Path]) -> None:
    if value is not None:
        from grader.settings import name_course

        if not (value / "assignments").is_dir():
            raise typer.BadParameter(f"{value} is no course folder (it has no assignments/)")
        name_course(value)


@app.callback()
def _main(version: bool = typer.Option(False, "--version", callback=_version, is_eager=True,
                                       help="Print the grader's version, and torch's and Triton's, then exit."),
          course: Optional[Path] = typer.Option(None, "--course", callback=_course, is_eager=True,
                                                help="The course folder every command uses (as $GRADER_COURSE): "
                                                "`grader --course PATH check ...`."),
          ) -> None:
    """Grade Triton kernel assignments."""

check.register(app)
fetch.register(app)
grade.register(app)
similarity.register(app)
leaderboard.register(app)
review.register(app)
kit.register(app)
course.register(app)
verify.register(app)


def main() -> None:
    """Every command; a broken assignment spec met by any of them is its file and rule, and a
    course's code that raised while grading its file, function, line and case: exit 2 (the
    course's error, not the student's)."""
    from grader.spec import CourseCodeError, SpecError

    try:
        app()
    except (SpecError, CourseCodeError) as exc:
        from grader.cli.common import err, say, shown_lines

        say(err, f"[red]error:[/red] {shown_lines(exc)}")
        raise SystemExit(2) from None
