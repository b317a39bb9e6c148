"""Command line: `grader check` and `grader list` (grader.cli.check), the TA's class commands,
one module each (grader.cli.fetch, .grade, .similarity, .leaderboard), a TA's review
(grader.cli.review) and the course's kit commands (grader.cli.kit), and `grader verify`
(grader.cli.verify): a stored speed figure re-timed; `grader publish canvas` (grader.cli.publish): the
grades into an LMS.

Exit codes: 0 every check that ran passed; 1 some check failed; 2 usage or infrastructure
error, with a one-line message.
"""

from __future__ import annotations

import errno
import os
from pathlib import Path
from typing import Optional

import typer

from grader.cli import check, course, fetch, grade, kit, leaderboard, publish, review, similarity, verify

# --help as plain text at the terminal's width (click measures it when it writes; 80 where it is not
# known), not rich's table of boxes, whose option column left the help about 25 columns
HELP_MAX_WIDTH = 200
app = typer.Typer(add_completion=False, no_args_is_help=True, help="Grade Triton kernel assignments.",
                  rich_markup_mode=None, context_settings={"max_content_width": HELP_MAX_WIDTH})


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
publish.register(app)


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
    except OSError as exc:
        line = out_of_room(exc)
        if line is None:
            raise
        from grader.cli.common import err, say, shown

        say(err, f"[red]error:[/red] {shown(line)}")
        raise SystemExit(2) from None


ROOM = {errno.ENOSPC: "the disk is full", errno.EDQUOT: "the disk quota is used up",
        errno.EROFS: "the folder is on a read-only file system", errno.EFBIG: "the file is larger than allowed"}


def out_of_room(exc: OSError) -> str | None:
    """One line for a write the machine refused (a full disk, a quota, a read-only folder):
    what was being written, in which folder, and what to do; None for any other error. What
    was written before stays (every file is replaced whole, grader.results.write_json_atomic)."""
    why = ROOM.get(exc.errno or 0)
    if why is None:
        return None
    where = f"writing {os.path.basename(exc.filename)} in {os.path.dirname(os.path.abspath(exc.filename))}" \
        if isinstance(exc.filename, str) else "writing"
    return (f"{why} ({exc.strerror}) {where}: nothing written before is lost; make room (or choose a writable "
            f"folder) and run the command "
            f"again (grader grade --resume keeps every job already graded)")
