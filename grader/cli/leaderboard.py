"""`grader leaderboard`: a speed leaderboard of a graded class, as a page a TA can publish
(grader.batch.leaderboard). Reads course.toml (grader.batch.course) for the students named.

Exit codes: 0 written; 2 for a usage error or a malformed class folder or course file, with one line.
"""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from grader import spec as specs
from grader.cli.classfiles import load_course_or_fail
from grader.cli.common import console
from grader.cli.common import fail as _fail
from grader.settings import current


def leaderboard(
    out: Path = typer.Option(..., "--out", help="Where to write the page (index.html) to publish."),
    class_dir: Path = typer.Option(Path("reports"), "--class", help="The graded class folder (grader grade --out)."),
    anonymize: bool = typer.Option(False,
                                   help="Pseudonyms for everyone but the students course.toml names under "
                                        "[leaderboard] named."),
    course_file: Optional[Path] = typer.Option(None, "--course",
                                               help="The course file (default: COURSE/course.toml if there is one)."),
) -> None:
    """Write a speed leaderboard of the graded class, as a page a TA can publish."""
    from grader.batch.leaderboard import PSEUDONYMS, LeaderboardError, write_leaderboard

    course = load_course_or_fail(course_file, specs.Course.find(current()))
    try:
        page = write_leaderboard(class_dir, out, anonymize, course.named, course.name)
    except LeaderboardError as exc:
        _fail(exc)
    console.print(f"leaderboard: {page}")
    if anonymize:
        console.print(f"pseudonyms (private, not for publishing): {class_dir / PSEUDONYMS}")
    else:
        console.print("[yellow]names are shown: use --anonymize for pseudonyms unless every student agreed[/yellow]")


def register(app: typer.Typer) -> None:
    app.command("leaderboard")(leaderboard)
