"""Gradebook exports of a class view, one function per destination.

- grades.csv: one row a student (student, commit, a score per assignment, total, late, note):
  the TA's gradebook, for any spreadsheet or LMS import.
- classroom.csv: one row a student and assignment, in the columns of GitHub Classroom's own
  grades export (assignment_name, github_username, roster_identifier, student_repository_url,
  points_awarded, points_available), plus the graded commit: for tools that read that export.
- gradescope.csv: Name, SID, Email, a column per assignment and Total Score, for Gradescope's
  score upload (it asks which column is which). Each student's results.json is already in
  Gradescope's autograder schema.

A score cell is empty where there is no grade (unfetched, not graded yet, infra error):
an empty cell is not a zero, and the note says why.
"""

from __future__ import annotations

import csv
import io
from pathlib import Path

from grader.results import write_text_atomic


def _score(value: float | None) -> str:
    return "" if value is None else f"{value:g}"


def _csv(rows: list[list]) -> str:
    buffer = io.StringIO()
    csv.writer(buffer, lineterminator="\n").writerows(rows)
    return buffer.getvalue()


def grades_csv(view) -> str:
    header = ["student", "commit", *view.assignments, "total", "late", "note"]
    rows = [header]
    for r in view.rows:
        late = "" if r.late is None else ("yes" if r.late else "no")
        rows.append([r.student, r.commit or "", *[_score(r.cells[a].score) for a in view.assignments], _score(r.total), late, r.note])
    return _csv(rows)


def classroom_csv(view) -> str:
    rows = [["assignment_name", "github_username", "roster_identifier", "student_repository_url", "commit",
             "points_awarded", "points_available"]]
    for r in view.rows:
        for a in view.assignments:
            c = r.cells[a]
            rows.append([a, r.github_username, r.student, r.repo or "", r.commit or "", _score(c.score), _score(c.max_score)])
    return _csv(rows)


def gradescope_csv(view) -> str:
    rows = [["Name", "SID", "Email", *view.assignments, "Total Score"]]
    for r in view.rows:
        email = r.student if "@" in r.student else ""
        rows.append([r.name, r.student, email, *[_score(r.cells[a].score) for a in view.assignments], _score(r.total)])
    return _csv(rows)


EXPORTS = {"grades.csv": grades_csv, "classroom.csv": classroom_csv, "gradescope.csv": gradescope_csv}


def write_all(view, out: Path) -> list[Path]:
    paths = []
    for name, export in EXPORTS.items():
        write_text_atomic(export(view), Path(out) / name)
        paths.append(Path(out) / name)
    return paths
