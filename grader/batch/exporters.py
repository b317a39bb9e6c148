"""Gradebook exports of a class view, one function per destination.

- grades.csv: one row a student (student, commit, a score per assignment, total, late, note):
  the TA's gradebook, for any spreadsheet or LMS import.
- classroom.csv: one row a student and assignment, in the columns of GitHub Classroom's own
  grades export (assignment_name, github_username, roster_identifier, student_repository_url,
  points_awarded, points_available), plus the graded commit: for tools that read that export.
- gradescope.csv: Name, SID, Email, a column per assignment and Total Score, for Gradescope's
  score upload (it asks which column is which). Each student's results.json is already in
  Gradescope's autograder schema.
- canvas.csv: Canvas's gradebook import (Grades > Import): Student, ID, SIS User ID, SIS Login ID,
  Section, then a column per assignment, and a Points Possible row under the header. Canvas matches
  a row to a student by ID, SIS User ID or SIS Login ID: the roster's student column goes in SIS
  Login ID (use the Canvas login or email there); ID, SIS User ID and Section are left empty (Canvas
  fills them or ignores them). A new column name makes Canvas create the assignment on import.

Every cell goes through grader.sanitize.for_csv_cell (a plain number as it is): a student's name,
repo URL or a note quoting their text never reaches a spreadsheet as a formula (`=`, `+`, `-`, `@`
first) or with a control character.

A partial run (`grader grade --case/--dtype`, a dry run) is no grade: each score is the chosen cases'
share of the assignment's points, and every gradebook says so where an import reads it, in the
assignment's column name (`vector_add (partial run)`; classroom.csv's assignment_name), so it is
never taken for the assignment's grade; grades.csv's note says how many cases ran.

A score cell is empty where there is no grade (unfetched, not graded yet, infra error):
an empty cell is not a zero, and the note says why.

Late penalties (course.toml's late policy, grader.batch.course) are applied at the student's total:
grades.csv keeps the raw scores and adds hours_late, late_penalty and final; gradescope.csv adds
a Late Penalty column (where course.toml sets a late policy) and its Total Score is the final one; classroom.csv, one
row per
assignment, awards the points after that assignment's penalty and shows both.
"""

from __future__ import annotations

import csv
import io
import re
from pathlib import Path

from grader.results import write_text_atomic
from grader.sanitize import for_csv_cell

# as _score writes one: a spreadsheet reads it as a number, never a formula
_NUMBER = re.compile(r"-?\d+(\.\d+)?(e[+-]?\d+)?")


def _score(value: float | None) -> str:
    return "" if value is None else f"{value:g}"


def _cell(value):
    return value if isinstance(value, str) and _NUMBER.fullmatch(value) else for_csv_cell(value)


def _csv(rows: list[list]) -> str:
    buffer = io.StringIO()
    csv.writer(buffer, lineterminator="\n").writerows([[_cell(v) for v in row] for row in rows])
    return buffer.getvalue()


def _penalty(view, r, a: str) -> float:
    """The late points deducted from one assignment's score."""
    from grader.batch.course import exact

    late, score = view.late.get((r.student, a)), r.cells[a].score
    return 0.0 if late is None or score is None else round(float(late.penalty(exact(score))), 4)


def _columns(view) -> list[str]:
    """Each assignment's column name: its name, marked where a grade of it is of a partial run."""
    return [f"{a} (partial run)" if any(r.cells[a].partial for r in view.rows if a in r.cells) else a
            for a in view.assignments]


def grades_csv(view) -> str:
    header = ["student", "commit", *_columns(view), "total", "late", "hours_late", "late_penalty", "final", "note"]
    rows = [header]
    for r in view.rows:
        late = "" if r.late is None else ("yes" if r.late else "no")
        hours = "" if r.hours_late is None else f"{max(0.0, r.hours_late):g}"
        rows.append([r.student, r.commit or "", *[_score(r.cells[a].score) for a in view.assignments], _score(r.total),
                     late,
                     hours, _score(r.penalty) if r.total is not None else "", _score(r.final), r.note])
    return _csv(rows)


def classroom_csv(view) -> str:
    rows = [["assignment_name", "github_username", "roster_identifier", "student_repository_url", "commit",
             "points_awarded", "points_available", "raw_points", "late_penalty"]]
    for r in view.rows:
        for a, name in zip(view.assignments, _columns(view)):
            c = r.cells[a]
            cut = _penalty(view, r, a)
            final = None if c.score is None else round(c.score - cut, 4)
            rows.append([name, r.github_username, r.student, r.repo or "", r.commit or "", _score(final),
                         _score(c.max_score),
                         _score(c.score), _score(cut) if c.score is not None else ""])
    return _csv(rows)


def gradescope_csv(view) -> str:
    policy = view.course is not None and view.course.policy is not None
    rows = [["Name", "SID", "Email", *_columns(view), *(["Late Penalty"] if policy else []), "Total Score"]]
    for r in view.rows:
        email = r.student if "@" in r.student else ""
        penalty = [_score(r.penalty) if r.total is not None else ""] if policy else []
        rows.append([r.name, r.student, email, *[_score(r.cells[a].score) for a in view.assignments], *penalty,
                     _score(r.final)])
    return _csv(rows)


CANVAS_HEADER = ["Student", "ID", "SIS User ID", "SIS Login ID", "Section"]


def canvas_csv(view) -> str:
    rows = [[*CANVAS_HEADER, *_columns(view)],
            ["Points Possible", "", "", "", "", *[_score(_points_possible(view, a)) for a in view.assignments]]]
    for r in view.rows:
        rows.append([r.name or r.student, "", "", r.student, "", *[_score(r.cells[a].score) for a in view.assignments]])
    return _csv(rows)


def _points_possible(view, assignment: str) -> float | None:
    """The assignment's full points (GPU-only points included): the spec's, else the most any row was graded on."""
    from grader.spec import UnknownAssignment

    try:
        return view.catalogue.get(assignment).max_points
    except UnknownAssignment:
        maxes = [r.cells[assignment].max_score for r in view.rows if r.cells[assignment].max_score is not None]
        return max(maxes) if maxes else None


EXPORTS = {"grades.csv": grades_csv, "classroom.csv": classroom_csv, "gradescope.csv": gradescope_csv,
           "canvas.csv": canvas_csv}


def write_all(view, out: Path) -> list[Path]:
    paths = []
    for name, export in EXPORTS.items():
        write_text_atomic(export(view), Path(out) / name)
        paths.append(Path(out) / name)
    return paths
