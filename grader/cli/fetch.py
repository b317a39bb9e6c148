"""`grader fetch`: every student's repo cloned or updated and the commit to grade pinned in
WORKDIR/lock.json (fetch_class, which `grader grade --roster` fetches with too). Reads course.toml
(grader.batch.course); its flags override it.

Exit codes: 0 every student fetched; 1 some could not be (each has its line, and the lock file is
written for the others); 2 for a usage error or a malformed roster or course file, with one line.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import List, Optional

import typer

from grader import spec as specs
from grader.batch.roster import RosterError, load_roster
from grader.cli.classfiles import load_course_or_fail
from grader.cli.common import UsageError, console, shown
from grader.cli.common import fail as _fail
from grader.settings import current


def fetch_class(roster: Path, out: Path, deadline: Optional[str], org: Optional[str], prefix: Optional[str],
                branch: Optional[str], jobs: int, course=None, names: Optional[List[str]] = None,
                classroom50: Optional[tuple[str, str]] = None, scores: Optional[Path] = None, catalogue=None):
    """Roster -> WORKDIR/repos + WORKDIR/lock.json, one line per student. The deadline is
    --deadline, else course.toml's for the assignments fetched; its extensions and late policy
    decide each student's deadline and the last commit still graded."""
    from grader.batch.course import CourseConfig, class_deadline
    from grader.batch.workspace import fetch_roster, parse_deadline

    course = course or CourseConfig()
    from grader.batch import classroom50 as c50

    try:
        if classroom50:  # (classroom, slug): repos ORG/<classroom>-<slug>-<user>
            entries = c50.load_roster(roster, org, *classroom50)
        else:
            entries = load_roster(roster, org, prefix)
        collected = c50.load_scores(scores) if scores else None
        when = parse_deadline(deadline) if deadline else None
        when, per_student = class_deadline(course, names or course.order or list(catalogue.catalogue()), when)
    except (RosterError, c50.ScoresError, ValueError) as exc:
        _fail(exc)
    console.print(f"Fetching {len(entries)} repos into {out}"
                  + (f", pinned at the deadline {when.isoformat()}" if when else ""))
    if course.policy and when:
        console.print(f"Late policy ({course.path}): {course.policy.describe()}; commits up to "
                      f"{course.cutoff(when).isoformat()} are graded, with the penalty")
    lock_print = threading.Lock()

    def show(p) -> None:
        with lock_print:
            if p.status == "fetched":
                late = ""
                if p.late and p.cutoff:
                    late = f"  [yellow]late: the graded commit is dated after the deadline {p.deadline}[/yellow]"
                elif p.late:
                    late = f"  [yellow]late: {p.late_commits} commit(s) after the deadline not graded[/yellow]"
                console.print(f"  [green]ok[/green]  {shown(p.student)}: {shown(p.branch)} @ {p.commit[:12]} "
                              f"({shown(p.commit_date or 'no readable date')}){late}")
                if p.passed_over:  # the commit graded is not the head: said, with why and what was left
                    console.print(f"      [yellow]not HEAD:[/yellow] {shown(p.passed_over, 600)}")
            else:
                console.print(f"  [red]unfetched[/red]  {shown(p.student)}: {shown(p.reason, 500)}")

    lock = fetch_roster(entries, out, when, branch, jobs=jobs, roster=roster, progress=show, per_student=per_student,
                        limits=course.fetch)
    if collected is not None:
        console.print(f"Classroom 50 scores: {len(collected)} kept (the latest per student and assignment) in "
                      f"{c50.save_scores(collected, out)}; the class view shows them beside the grades")
    bad = [p for p in lock.students if p.status != "fetched"]
    console.print(f"{len(lock.students) - len(bad)} fetched, {len(bad)} unfetched; lock file: {out / 'lock.json'}")
    if lock.warning:
        console.print(f"[yellow]{shown(lock.warning)}[/yellow]")
    return lock


def fetch(
    roster: Path = typer.Option(..., "--roster",
                                help="CSV: student,repo[,commit], or GitHub Classroom's roster export; "
                                "with --classroom50, usernames one a line or a CSV with a username column."),
    out: Path = typer.Option(..., "--out", help="The workspace: repos/ and lock.json are written there."),
    deadline: Optional[str] = typer.Option(None,
                                           help="ISO 8601 with a time zone: pin the last commit dated on or before it "
                                           "(default: course.toml's deadline for the assignments)."),
    org: Optional[str] = typer.Option(None, help="GitHub Classroom: the organization (or a base URL)."),
    prefix: Optional[str] = typer.Option(None, help="GitHub Classroom: the assignment's repo prefix."),
    branch: Optional[str] = typer.Option(None, help="The branch to grade (default: each repo's default branch)."),
    jobs: int = typer.Option(8, help="Repos fetched at once."),
    assignment: Optional[List[str]] = typer.Option(None, "--assignment", "-a",
                                                   help="The assignments this fetch is for: "
                                                   "their deadline in course.toml applies (default: the course's)."),
    course_file: Optional[Path] = typer.Option(None, "--course",
                                               help="The course file (default: COURSE/course.toml if there is one)."),
    classroom50: Optional[str] = typer.Option(None, "--classroom50",
                                              help="Classroom 50: the classroom's name; each repo "
                                              "is ORG/<classroom>-<slug>-<username>, lower case (with --org)."),
    slug: Optional[str] = typer.Option(None, help="Classroom 50: the assignment's slug (default: that of the one -a)."),
    scores: Optional[Path] = typer.Option(None, help="Classroom 50: a collected scores.json, shown beside the grades."),
    max_class_mb: Optional[int] = typer.Option(None, "--max-class-mb", min=1,
                                               help="The disk every student's repo may take together, in MiB "
                                               "(default: course.toml's [fetch] max_class_mb, 65536)."),
) -> None:
    """Clone or update every student's repo and pin the commit to grade in WORKDIR/lock.json."""
    import dataclasses

    catalogue = specs.Course.find(current())
    course = load_course_or_fail(course_file, catalogue)
    if max_class_mb is not None:
        course = dataclasses.replace(course, fetch=dataclasses.replace(course.fetch, class_bytes=max_class_mb << 20))
    try:
        for n in assignment or []:
            catalogue.get(n)
        if (slug or scores) and not classroom50:
            raise UsageError("--slug and --scores go with --classroom50 CLASSROOM")
        if classroom50 and not slug:
            if not assignment or len(assignment) != 1:
                raise UsageError("--classroom50: name the assignment's slug with --slug, or one assignment with -a")
            from grader.kit.classroom50 import slug_of

            slug = slug_of(assignment[0])
    except specs.UnknownAssignment as exc:
        _fail(UsageError(exc.args[0]))
    except UsageError as exc:
        _fail(exc)
    classroom_slug = None
    if classroom50:
        assert slug is not None  # given, or the one assignment's
        classroom_slug = (classroom50, slug)
    lock = fetch_class(roster, out, deadline, org, prefix, branch, jobs, course, assignment, classroom_slug, scores,
                       catalogue)
    raise typer.Exit(1 if any(p.status != "fetched" for p in lock.students) else 0)


def register(app: typer.Typer) -> None:
    app.command("fetch")(fetch)
