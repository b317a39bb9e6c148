"""The course staff's hand-out commands, `grader release` and `grader gradescope`, registered on the CLI.

Exit codes: 0 written; 2 a usage error, or a kit that would leak private material (nothing is
left at --out then), with its reason.
"""

from __future__ import annotations

from pathlib import Path
from typing import List, Optional

import typer
from rich.markup import escape

from grader import spec as specs
from grader.cli.common import console, err
from grader.settings import current


def _fail(message: str) -> None:
    err.print(f"[red]error:[/red] {escape(message)}", soft_wrap=True)
    raise typer.Exit(2)


NO_CHECK_HELP = ("Ship without running `grader course check` first (as otter assign's --no-run-tests): not advised, "
                 "an assignment that fails it is broken for every student.")


def _proved(catalogue: specs.Course, names: list[str] | None, settings, what: str) -> None:
    """`grader course check` on the assignments shipped (grader.kit.coursecheck, once per content of
    the course: a stamp in the kept cache); a course that fails it is refused with each problem's line."""
    from grader.cli.common import say, shown
    from grader.kit.coursecheck import proved

    chosen = names or sorted(p.parent.name for p in (catalogue.root / "assignments").glob("*/spec.py"))
    console.print(f"Checking {', '.join(chosen)} first (grader course check, on the CPU)")
    report = proved(catalogue, chosen, settings.check_cache_base / "course-check")  # as `grader course check` keeps it
    for line in report.lines():
        say(err, f"[red]{shown(line, 800)}[/red]")
    if not report.ok:
        _fail(f"{what} not written: {len(report.findings)} problem(s) found by grader course check "
              "(each above, with its file and line); mend them and run it again")


def release(
    out: Path = typer.Option(..., "--out", help="The kit's folder (the student template repository); empty or new."),
    assignment: Optional[List[str]] = typer.Option(None, "--assignment", "-a",
                                                   help="Only these assignments (default: all)."),
    grader_requirement: Optional[str] = typer.Option(None, help="What students pip-install for the grader (e.g. "
                                                      "'grader==0.1.0'); default: a wheel of this grader, in the kit."),
    gpu_runner: Optional[str] = typer.Option(None, help="Run the kit's CI on a self-hosted runner with this label "
                                             "(a CUDA GPU: speed and bf16 checked too) instead of GitHub's hosted CPU "
                                             "runner."),
    title: str = typer.Option("Triton kernels", help="The kit README's title."),
    force: bool = typer.Option(False, help="Replace --out if it is not empty."),
    classroom50: Optional[Path] = typer.Option(None, "--classroom50", help="Also write Classroom 50's side: "
                                               "CLASSROOM/autograders/<slug>/autograder.py and "
                                               "CLASSROOM/assignments.json (CLASSROOM: the classroom's folder in the "
                                               "classroom50 config repo)."),
    runs_on: Optional[List[str]] = typer.Option(None, "--runs-on",
                                                help="With --classroom50: the grade job's runner labels "
                                                "(repeatable, 1-10; default ubuntu-latest; e.g. --runs-on self-hosted "
                                                "--runs-on gpu for a GPU runner)."),
    course_file: Optional[Path] = typer.Option(None, "--course",
                                               help="With --classroom50: the course file whose deadlines "
                                               "become each assignment's `due` (default: COURSE/course.toml if there "
                                               "is one)."),
    no_check: bool = typer.Option(False, "--no-check", help=NO_CHECK_HELP),
) -> None:
    """Build the student kit: starters, handouts, public specs, README, CI workflow; no reference, hidden case or
    secret."""
    from grader.kit.release import ReleaseError, build_kit, ensure_secret

    catalogue = specs.Course.find(current())
    if (runs_on or course_file) and classroom50 is None:
        _fail(f"{'--runs-on' if runs_on else '--course'} goes with --classroom50 (the kit's own workflow takes "
              f"--gpu-runner)")
    try:
        from grader.batch.course import CourseError, find_course

        # course.toml's [ci] score and points, which the kit's CI runs report by; its deadlines are Classroom 50's `due`
        try:
            course = find_course(course_file, catalogue)
        except CourseError as exc:
            _fail(f"{exc} (its [ci] score and deadlines go into the kit)")
        if classroom50 is not None:
            from grader.kit.classroom50_config import check_runs_on

            check_runs_on(runs_on)  # said before the kit is built
            deadlines = course.deadlines
        made = ensure_secret(catalogue)
        if made:
            console.print(f"[yellow]made the course secret {made}: graded random shapes come from it. Keep it with the "
                          "course (never in a kit); every grader of this class needs the same one.[/yellow]")
        settings = current()
        kit = build_kit(out, assignment or None, force=force, requirement=grader_requirement, gpu_runner=gpu_runner,
                        title=title, catalogue=catalogue, ci_score=course.ci_score, points=course.points,
                        # checked with the secret: the graded random shapes
                        prove=None if no_check else lambda names: _proved(catalogue, names, settings, "the kit was"))
        if classroom50 is not None:
            from grader.kit.classroom50_config import write_classroom

            written = write_classroom(kit, classroom50, runs_on, deadlines, catalogue)
    except specs.UnknownAssignment as exc:
        _fail(exc.args[0])
    except ReleaseError as exc:
        _fail(str(exc))
    hidden = {n: catalogue.get(n).hidden_count for n in kit.assignments}
    console.print(f"Student kit in {kit.root}: {', '.join(kit.assignments)} ({len(kit.files)} files)")
    console.print(f"  students install the grader with: pip install -r requirements-grader.txt  ({kit.install})")
    kept = ", ".join(f"{n} {c}" for n, c in hidden.items() if c) or "none (no assignment has hidden.py)"
    console.print(f"  hidden cases kept back: {kept}")
    console.print("  scanned: no reference kernel, hidden case or course secret in it.")
    if classroom50 is not None:
        console.print(f"Classroom 50 in {escape(str(classroom50))}: {', '.join(written)} (scanned: nothing private; "
                      "the autograders folder is published)")
        console.print("Next: push the kit as the assignments' template repository, and commit the classroom folder to "
                      "the classroom50 config repo.")
    else:
        console.print("Next: push it as the template repository of the assignment (Classroom 50, Classmoji or a plain "
                      "template repository).")


def gradescope(
    out: Path = typer.Option(Path("autograder.zip"), "--out",
                             help="The zip to upload as a Gradescope programming assignment's autograder."),
    assignment: Optional[List[str]] = typer.Option(None, "--assignment", "-a",
                                                   help="Only these assignments (default: all)."),
    cuda: bool = typer.Option(False,
                              help="Install torch's CUDA build (a Gradescope GPU image); default: the CPU build."),
    torch_index: Optional[str] = typer.Option(None, help="The pip index torch comes from (overrides --cuda's choice)."),
    no_check: bool = typer.Option(False, "--no-check", help=NO_CHECK_HELP),
) -> None:
    """Build a Gradescope autograder zip: setup.sh, run_autograder, the grader and the course (reference included)."""
    from grader.batch.course import CourseError, find_course
    from grader.kit.gradescope import build_autograder
    from grader.kit.release import ReleaseError

    try:
        settings = current()
        catalogue = specs.Course.find(settings)
        try:  # Gradescope stores every score it is given: a CPU image's would lack the GPU-only points
            course = find_course(None, catalogue)
            incomplete = course.incomplete
        except CourseError as exc:
            _fail(str(exc))
        if not cuda and incomplete != "mark":
            _fail(f'course.toml says [gradebook] incomplete = "{incomplete}", and every score a CPU autograder gives '
                  "lacks the points only a GPU can earn (speed, bfloat16), which Gradescope would store as the grade: "
                  'build it with --cuda for a Gradescope GPU image, or set incomplete = "mark" (the score stored, its '
                  "output saying it is CPU only)")
        if not no_check:
            _proved(catalogue, assignment or None, settings, "the autograder was")
        members = build_autograder(out, assignment or None, cuda=cuda, torch_index=torch_index,
                                   reference_dir=settings.reference_dir, catalogue=catalogue,
                                   points=course.points)  # course.toml's points only: results.json is out of them
    except specs.UnknownAssignment as exc:
        _fail(exc.args[0])
    except ReleaseError as exc:
        _fail(str(exc))
    console.print(f"Gradescope autograder: {out} ({len(members)} files; torch {'CUDA' if cuda else 'CPU'} build)")
    console.print("  it holds these assignments' reference kernels and hidden cases (no course secret): upload it to "
                  "Gradescope only.")


def register(app: typer.Typer) -> None:
    app.command("release")(release)
    app.command("gradescope")(gradescope)
