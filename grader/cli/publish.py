"""`grader publish canvas OUT --course-id N`: a graded class's grades into Canvas (grader.batch.canvas).

The token comes from an environment variable (CANVAS_API_TOKEN, or the one --token-env names),
the Canvas address from --url or CANVAS_API_URL. `--dry-run` shows the change table and contacts
nothing.

Exit codes: 0 every grade to send was sent (or nothing changed); 1 some grade was not sent (each
has its line; the next run sends it); 2 nothing could be sent (no canvasapi, no token, a token or
course Canvas refused), with a one-line message.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Optional

import typer
from rich.table import Table

from grader.cli.common import UsageError, console, err, fail, shown

app = typer.Typer(no_args_is_help=True, help="Publish a graded class's grades into an LMS.")


_WHY = {"no Canvas id": " (the roster has no canvas_user_id, sis_user_id or sis_login_id for this student)",
        "incomplete": " (--include-incomplete sends it)", "held for review": " (--include-incomplete sends it)"}


def _table(changes) -> Table:
    table = Table("student", "assignment", "last sent", "now", "out of", "action", title="Canvas: the change")
    for c in changes:
        table.add_row(shown(c.student, 80), shown(c.assignment, 80), "" if c.before is None else f"{c.before:g}",
                      "" if c.grade is None else f"{c.grade:g}", "" if c.out_of is None else f"{c.out_of:g}",
                      c.action)
    return table


@app.command("canvas")
def canvas(
    out: Path = typer.Argument(..., help="The graded class folder (grader grade --out)."),
    course_id: int = typer.Option(..., "--course-id", min=1, help="The Canvas course's number (its URL's last part)."),
    url: Optional[str] = typer.Option(None, "--url", help="The Canvas address, e.g. https://canvas.example.edu "
                                      "(default: $CANVAS_API_URL)."),
    token_env: str = typer.Option("CANVAS_API_TOKEN", "--token-env",
                                  help="The environment variable that holds the TA's Canvas access token."),
    dry_run: bool = typer.Option(False, "--dry-run", help="Show what would be sent; contact nothing."),
    include_incomplete: bool = typer.Option(False, "--include-incomplete",
                                            help="Send CPU-only and partial-run grades, and those held for "
                                                 "review, too."),
    allow_unpublished: bool = typer.Option(False, "--allow-unpublished",
                                           help="Send grades to a course that is not published yet."),
    show_all: bool = typer.Option(False, "--all", help="List unchanged grades in the table too."),
    comment: bool = typer.Option(False, "--comment", help="Send a submission comment with each grade, saying it."),
) -> None:
    """Send the class's grades (course.toml's points, reviews and late penalties applied) to a Canvas course."""
    from grader.batch import canvas as lms

    if not (Path(out) / "summary.json").is_file():
        fail(UsageError(f"{out}: no summary.json: not a graded class folder (grader grade --out {out})"))
    try:
        changes = lms.plan(out, course_id, include_incomplete)
    except lms.PublishError as exc:
        fail(UsageError(str(exc)))
    shown_changes = [c for c in changes if show_all or c.action != "unchanged"]
    todo = [c for c in changes if c.action == "send"]
    if dry_run:
        console.print(_table(shown_changes))
        console.print(f"{len(todo)} grade(s) to send, {sum(c.action == 'unchanged' for c in changes)} unchanged "
                      f"since the last publish (dry run: nothing sent)")
        raise typer.Exit(0)
    base = url or os.environ.get(lms.URL_ENV, "")
    if not base:
        fail(UsageError(f"give --url https://canvas.example.edu or set {lms.URL_ENV}"))
    token = os.environ.get(token_env, "")
    if not token.strip():
        fail(UsageError(f"no Canvas token: set {token_env} to a TA's access token (Canvas: Account > Settings > "
                        "New access token); it is never read from a file or the command line"))
    try:
        changes, result = lms.publish(out, course_id, base, token.strip(), include_incomplete=include_incomplete,
                                      allow_unpublished=allow_unpublished, comment=comment,
                                      on_sent=lambda c: console.print(f"  sent {shown(c.student, 80)}/"
                                                                      f"{shown(c.assignment, 80)}: {c.grade:g}"))
    except lms.PublishError as exc:
        err.print(f"[red]error:[/red] {shown(str(exc), 600)}")
        raise typer.Exit(2) from None
    for line in result.said:
        console.print(shown(line, 300))
    for c in changes:
        if c.action not in ("send", "unchanged"):
            console.print(f"  [yellow]not sent[/yellow] {shown(c.student, 80)}/{shown(c.assignment, 80)}: {c.action}"
                          f"{_WHY.get(c.action.split(':')[0], '')}")
    for line in result.failed:
        err.print(f"[red]failed:[/red] {shown(line, 600)}")
    unchanged = sum(c.action == "unchanged" for c in changes)
    console.print(f"{len(result.sent)} grade(s) sent to course {course_id}, {len(result.failed)} failed, {unchanged} "
                  f"unchanged; record: {lms.record_path(out, course_id)}")
    raise typer.Exit(1 if result.failed else 0)


def register(root: typer.Typer) -> None:
    root.add_typer(app, name="publish")
