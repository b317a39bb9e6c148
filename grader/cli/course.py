"""An instructor's course commands: `grader course new PATH` (a course repo of its own),
`grader course check` (every assignment proved before students see it, grader.kit.coursecheck),
`grader course ops NAME` (the aten ops a reference calls, for forbidden_ops) and
`grader assignment new NAME --shape ...` (a skeleton that passes the check as written,
grader.kit.skeleton).

Exit codes: 0 done (the course passes); 1 course check found a problem (one line each, with its
file and line); 2 a usage error.
"""

from __future__ import annotations

from pathlib import Path
from typing import List, Optional

import typer

from grader.cli.common import console, err, fail, shown

course_app = typer.Typer(no_args_is_help=True, help="A course of one's own: make one, check it.")
assignment_app = typer.Typer(no_args_is_help=True, help="Add an assignment to a course.")

COURSE_HELP = ("The course folder (assignments/, reference/, solutions/); default: $GRADER_COURSE, else the "
               "built-in one.")


def _course(path: Optional[Path]):
    from grader.settings import current, name_course
    from grader.spec import Course

    if path is not None:
        if not (path / "assignments").is_dir():
            fail(ValueError(f"{path} is no course folder (it has no assignments/; `grader course new {path}` "
                            "makes one)"))
        name_course(path)
    return Course.find(current())


@course_app.command("new")
def new_course(path: Path = typer.Argument(..., help="The new course's folder (new or empty)."),
               title: str = typer.Option("Triton kernels", help="The course's title (README, kit).")) -> None:
    """Make a course repo: assignments/, reference/, solutions/, course.toml, a README and a CI workflow
    that runs `grader course check`."""
    from grader.kit.skeleton import SkeletonError
    from grader.kit.skeleton import new_course as make

    try:
        written = make(path, title)
    except SkeletonError as exc:
        fail(exc)
    console.print(f"Course in {shown(path)}: {', '.join(written)}")
    console.print(f"Next: grader assignment new NAME --shape elementwise --course {shown(path)}")


@course_app.command("check")
def check_course(course: Optional[Path] = typer.Option(None, "--course", help=COURSE_HELP),
                 assignment: Optional[List[str]] = typer.Option(None, "--assignment", "-a",
                                                                help="Only these assignments (default: all)."),
                 device: str = typer.Option("auto", "--device", help="auto: time each reference beside torch's "
                                            "baseline where there is a GPU; cuda: require one; cpu: never.")) -> None:
    """Prove the course's assignments on the CPU: specs load; reference and solution pass every case; the starter
    fails; function, signature, module and handout agree; forbidden_ops are real aten ops the reference never calls.
    On a GPU, a reference slower than torch's baseline is named."""
    from grader.kit.coursecheck import check_course as check
    from grader.kit.coursecheck import speed_device
    from grader.spec import UnknownAssignment

    if device not in ("auto", "cuda", "cpu"):
        fail(ValueError(f"--device must be auto, cuda or cpu, not {shown(device)}"))
    catalogue = _course(course)
    timed = speed_device(device)
    if device == "cuda" and timed is None:
        fail(ValueError("--device cuda, but torch sees no CUDA GPU here (--device auto checks on the CPU alone)"))
    console.print(f"Checking the course in {shown(catalogue.root)} on the CPU (Triton's interpreter)"
                  + (", the references timed on the GPU" if timed else ""))
    try:
        report = check(catalogue, assignment or None, device=device)
    except UnknownAssignment as exc:
        fail(ValueError(exc.args[0]))
    for note in report.notes:
        console.print(f"  {shown(note, 400)}")
    for line in report.lines():
        err.print(f"[red]{shown(line, 800)}[/red]", soft_wrap=True)
    if report.findings:
        err.print(f"{len(report.findings)} problem{'s' if len(report.findings) != 1 else ''}: not ready for students")
        raise typer.Exit(1)
    from grader.kit.coursecheck import keep_proof
    from grader.settings import current

    keep_proof(catalogue, report.checked, current().check_cache_base / "course-check")  # release need not run it again
    console.print(f"[green]ok[/green]: {', '.join(report.checked)}")


@course_app.command("ops")
def ops(name: str = typer.Argument(..., help="The assignment."),
        course: Optional[Path] = typer.Option(None, "--course", help=COURSE_HELP),
        module: Optional[Path] = typer.Option(None, "--module", help="Another module than the reference (e.g. torch's "
                                              "own code for the op, to see what forbidden_ops should name).")) -> None:
    """Print the aten ops a reference (or --module) calls on the smallest public case: the names forbidden_ops takes."""
    from grader.kit.coursecheck import interpreted_ops
    from grader.spec import UnknownAssignment

    catalogue = _course(course)
    try:
        catalogue.get(name)
        found = interpreted_ops(catalogue, name, module.resolve() if module else None)
    except UnknownAssignment as exc:
        fail(ValueError(exc.args[0]))
    except RuntimeError as exc:
        fail(exc)
    for op in found:
        console.print(op)


@assignment_app.command("new")
def new_assignment(name: str = typer.Argument(..., help="The assignment's name (a Python identifier: relu)."),
                   shape: str = typer.Option("elementwise", "--shape",
                                             help="elementwise, rowwise (a reduction over each row) or matmul."),
                   course: Optional[Path] = typer.Option(None, "--course", help=COURSE_HELP)) -> None:
    """Write assignments/NAME (spec, hidden cases, starter, handout), reference/NAME.py and the solution: a skeleton
    that `grader course check` passes as written."""
    from grader.kit.skeleton import SkeletonError
    from grader.kit.skeleton import new_assignment as make

    catalogue = _course(course)
    try:
        written = make(catalogue.root, name, shape)
    except SkeletonError as exc:
        fail(exc)
    console.print(f"{shown(name)} ({shown(shape)}) in {shown(catalogue.root)}: {', '.join(written)}")
    console.print("Next: edit them, then grader course check -a " + shown(name))


def register(app: typer.Typer) -> None:
    app.add_typer(course_app, name="course")
    app.add_typer(assignment_app, name="assignment")
