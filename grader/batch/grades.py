"""A student's grade for an assignment as the course counts it: the one number every output shows.

The class view (grader.batch.classview) computes each cell once: the grader's verdict or a TA's
standing review (grader.batch.reviews), scaled to course.toml's points, less the late penalty
(grader.batch.course), marked where it is incomplete (CPU only, a partial run) or held (an
integrity flag no review has decided). `CourseGrade.of` reads that cell; every gradebook
(grader.batch.exporters), the dashboard, summary.json, the console's summary, the student's
report and results.json (written from OUT/students/<student>/grades.json, which
`write_student_grades` keeps) and `grader publish` take the grade from here, never recomputing it.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path

from grader.batch.store import GRADES, student_dir
from grader.results import write_text_atomic


@dataclass(frozen=True)
class CourseGrade:
    student: str
    assignment: str
    status: str  # the cell's: graded | infra_error | not graded | unfetched
    points: float | None  # after a TA's review and course.toml's scaling, before the late penalty
    out_of: float | None  # course.toml's points for it, else the spec's
    late_penalty: float  # points deducted for lateness (0 when on time)
    final: float | None  # points - late_penalty: the grade; None where there is none
    lacks: tuple[str, ...] = ()  # "partial run", "CPU only": not the assignment's whole grade
    held: bool = False  # an integrity flag that no TA's review has decided

    @classmethod
    def of(cls, row, cell) -> "CourseGrade":
        """The grade of a class view's cell (grader.batch.classview.Cell) of the row's student."""
        return cls(row.student, cell.assignment, cell.status, cell.score, cell.max_score, cell.penalty, cell.final,
                   tuple(cell.lacks), cell.held)

    @property
    def complete(self) -> bool:
        """A whole grade that may be sent as the assignment's grade: graded, not marked, not held."""
        return self.final is not None and not self.lacks and not self.held

    def headline(self) -> str:
        """'0.64 / 20 points (0.16 late penalty; CPU only)', or why there is no grade."""
        if self.final is None:
            return f"no grade ({self.status})"
        told = [*([f"{self.late_penalty:g} late penalty"] if self.late_penalty else []), *self.lacks,
                *(["held for review"] if self.held else [])]
        top = "?" if self.out_of is None else f"{self.out_of:g}"
        return f"{self.final:g} / {top} points" + (f" ({'; '.join(told)})" if told else "")

    def to_json(self) -> dict:
        data = asdict(self)
        data["lacks"] = list(self.lacks)
        return data


def class_grades(view) -> list[CourseGrade]:
    """Every (student, assignment) grade of the class view, rows in order."""
    return [CourseGrade.of(r, r.cells[a]) for r in view.rows for a in view.assignments if a in r.cells]


def write_student_grades(view, out: Path, rewrite) -> None:
    """Each graded student's course grades into OUT/students/<folder>/grades.json, and where they
    changed, `rewrite(folder)` (their results.json and report.html show them)."""
    for r in view.rows:
        if r.status != "fetched":
            continue
        grades = {a: CourseGrade.of(r, r.cells[a]).to_json() for a in view.assignments if a in r.cells}
        path = student_dir(out, r.folder) / GRADES
        new = json.dumps(grades, indent=1, sort_keys=True)
        old = path.read_text() if path.is_file() else None
        if old != new and path.parent.is_dir():
            write_text_atomic(new, path)
            rewrite(r.folder)

