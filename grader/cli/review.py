"""`grader review`: a TA's decision on a graded assignment (grader.batch.reviews), recorded in the
class folder's review log and applied to the student's results.json and report, the dashboard,
summary.json and every gradebook; `--list` shows the flags awaiting review and the reviews done.

Exit codes: 0 the review is recorded (or listed); 1 it is recorded but some class output could not
be rewritten (each has its line); 2 a usage error or a review that cannot be made, with the reason.
"""

from __future__ import annotations

import getpass
from pathlib import Path
from typing import Optional

import typer

from grader.cli.common import UsageError, console, err, fail, shown


def _reviewer() -> str:
    """Who runs the command: the review's author unless --by names another."""
    try:
        return getpass.getuser()
    except (KeyError, OSError):
        return ""


def review(
    out: Path = typer.Argument(..., help="The graded class folder (grader grade --out)."),
    student: Optional[str] = typer.Argument(None, help="The student, as the roster names them."),
    assignment: Optional[str] = typer.Argument(None, help="The assignment reviewed."),
    clear: bool = typer.Option(False, "--clear", help="Clear the integrity flag: the points it took are restored."),
    uphold: bool = typer.Option(False, "--uphold", help="Uphold the flag: the grade stands, marked reviewed."),
    points: Optional[float] = typer.Option(None, "--points", help="Set the assignment's points (0 to its maximum, "
                                           "in the assignment's own points, before course.toml scales them)."),
    note: Optional[str] = typer.Option(None, "--note",
                                       help="Why (required): kept in the log and shown in the student's report."),
    by: Optional[str] = typer.Option(None, "--by", help="The reviewer (default: the user running the command)."),
    list_: bool = typer.Option(False, "--list",
                               help="List the flags awaiting review, the reviews done and stale ones."),
    course_file: Optional[Path] = typer.Option(None, "--course",
                                               help="The course file (default: COURSE/course.toml if there is one)."),
) -> None:
    """Record a TA's review of a graded assignment: clear or uphold its flag, or set its points."""
    from grader import spec as specs
    from grader.batch import reviews
    from grader.batch.classview import build_class_view, write_class_outputs
    from grader.batch.record import RecordError
    from grader.batch.store import read_record, record_path, rewrite_student
    from grader.cli.classfiles import class_lock, load_course_or_fail

    decisions = [d for d, on in (("clear", clear), ("uphold", uphold), ("points", points is not None)) if on]
    if list_:
        if student or assignment or decisions or note is not None or by is not None:
            fail(UsageError("--list takes only the class folder"))
    elif not (student and assignment):
        fail(UsageError("name the STUDENT and the ASSIGNMENT reviewed (or --list)"))
    elif len(decisions) != 1:
        fail(UsageError("give one decision: --clear, --uphold or --points P"))
    elif note is None:
        fail(UsageError("--note is required: say why (it is kept in the review log and shown in the report)"))
    from grader.settings import current

    catalogue = specs.Course.find(current())
    course = load_course_or_fail(course_file, catalogue)
    lock, manifest = class_lock(out)
    assignments = manifest.get("assignments") or []
    if list_:
        _print_list(out, build_class_view(out, lock, assignments, manifest, course, catalogue=catalogue))
        return
    pinned = {p.student: p for p in lock.students}
    if student not in pinned:
        fail(UsageError(f"no student {student!r} in {out}'s class ({len(pinned)} students)"))
    if assignment not in assignments:
        known = catalogue.catalogue()
        why = "no such assignment" if assignment not in known else "not graded in this class folder"
        fail(UsageError(f"{assignment!r}: {why} (graded here: {', '.join(assignments) or 'none'})"))
    assert student and assignment and note is not None  # checked above, for a review that is not --list
    folder = pinned[student].folder
    with reviews.locked(out):
        try:
            made = reviews.make(student, folder, assignment, read_record(record_path(out, folder, assignment)),
                                decisions[0], points, note, by if by is not None else _reviewer())
        except (reviews.ReviewError, RecordError) as exc:
            fail(exc)
        log = reviews.append(out, made)
        rewrite_student(out, folder)
        view = write_class_outputs(out, lock, assignments, manifest, course, catalogue=catalogue)
    console.print(f"{shown(student)}/{shown(assignment)}: {made.words} by {shown(made.by, 100)}: {made.points:g} / "
                  f"{made.verdict['max_score']:g} points (the grader's verdict: {made.verdict['score']:g}); logged in "
                  f"{log}")
    console.print(f"dashboard: {out / 'index.html'}   report: {out / 'students' / folder / 'report.html'}")
    for line in view.errors:
        err.print(f"[red]error:[/red] {shown(line, 600)}")
    if view.errors:
        raise typer.Exit(1)


def _print_list(out: Path, view) -> None:
    awaiting = view.awaiting_review
    console.print(f"[bold]Flags awaiting review ({len(awaiting)} of {len(view.flags)})[/bold]")
    for f in awaiting:
        stale = " (its review is stale)" if f.get("review") == "stale" else ""
        console.print(f"  {shown(f['student'])}/{shown(f['assignment'])}: [yellow]{f['severity']}[/yellow] "
                      f"{shown(f['check'])}{stale}: {shown(f['message'], 300)}\n    evidence: "
                      f"{shown(out / f['link']) if f['link'] else '-'}")
    console.print(f"[bold]Reviews done ({len(view.reviews['done'])})[/bold]")
    for r in view.reviews["done"]:
        console.print(f"  {shown(r['student'])}/{shown(r['assignment'])}: {r['decision']}, {r['decided']:g} / "
                      f"{r['max_score']:g} (verdict {r['verdict']['score']:g}) by {shown(r['by'], 100)} on {r['at']}: "
                      f"{shown(r['note'], 300)}")
    if view.reviews["stale"]:
        console.print(f"[bold]Stale reviews ({len(view.reviews['stale'])})[/bold]: graded again since; the new verdict "
                      f"stands")
        for r in view.reviews["stale"]:
            console.print(f"  {shown(r['student'])}/{shown(r['assignment'])}: {r['decision']} by {shown(r['by'], 100)} "
                          f"on {r['at']} ({shown(r['why_stale'])}): {shown(r['note'], 300)}")
    for line in view.errors:
        err.print(f"[yellow]warning:[/yellow] {shown(line, 600)}")


def register(app: typer.Typer) -> None:
    app.command("review")(review)
