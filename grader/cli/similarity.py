"""`grader similarity`: every pair of students' modules compared per assignment in a graded
class folder, and the dashboard's list of similar pairs rebuilt. Reads course.toml
(grader.batch.course); its flags override it.

Exit codes: 0 done; 1 the class view could not be written whole (each error has its line); 2 for
a usage error or a malformed lock or course file, with one line.
"""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from grader import spec as specs
from grader.cli.classfiles import class_lock, load_course_or_fail
from grader.cli.common import UsageError, console, err, shown
from grader.cli.common import fail as _fail
from grader.settings import current


def similarity(
    class_dir: Path = typer.Option(Path("reports"), "--class", help="The graded class folder (grader grade --out)."),
    threshold: Optional[float] = typer.Option(None,
                                              help="List pairs at least this similar (0-1; default: course.toml's, "
                                                   "else 0.6)."),
    course_file: Optional[Path] = typer.Option(None, "--course",
                                               help="The course file (default: COURSE/course.toml if there is one)."),
) -> None:
    """Compare every pair of students' modules per assignment; rebuild the dashboard's list of similar pairs."""
    from grader.batch import similarity as compare
    from grader.batch.classview import write_class_outputs

    if compare.MISSING is not None:
        _fail(UsageError("grader similarity needs copydetect, which comes with the TA's extra: "
                         "pip install \"grader[ta]\""))
    catalogue = specs.Course.find(current())
    course = load_course_or_fail(course_file, catalogue)
    if threshold is not None and not 0 < threshold <= 1:
        _fail(UsageError("--threshold must be in (0, 1]"))
    lock, manifest = class_lock(class_dir)
    view = write_class_outputs(class_dir, lock, manifest.get("assignments") or [], manifest, course, threshold,
                               catalogue=catalogue)
    for a in view.assignments:
        pairs = view.similarity.get(a, [])
        console.print(f"{a}: {len(pairs)} pair(s) at or above {view.similarity_meta['threshold']:g}"
                      + "".join(f"\n  {p.score:.0%}  {shown(p.a)} ~ {shown(p.b)}  {shown(class_dir / p.page)}"
                                for p in pairs[:10]))
        for student, why in (view.similarity_meta["per_assignment"].get(a) or {}).get("not_compared", {}).items():
            console.print(f"  [yellow]not compared[/yellow] {shown(student)}: {shown(why, 300)}")
    console.print(f"dashboard: {class_dir / 'index.html'}")
    for line in view.errors:
        err.print(f"[red]error:[/red] {shown(line, 600)}")
    if view.errors:
        raise typer.Exit(1)


def register(app: typer.Typer) -> None:
    app.command("similarity")(similarity)
