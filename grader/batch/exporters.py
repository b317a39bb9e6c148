"""Gradebook exports of a class view, one function per destination.

- grades.csv: one row a student (student, commit, a score per assignment, total, late, note):
  the TA's gradebook, for any spreadsheet or LMS import.
- classroom.csv: one row a student and assignment, in the columns of GitHub Classroom's own
  grades export (assignment_name, github_username, roster_identifier, student_repository_url,
  points_awarded, points_available), plus the graded commit: for tools that read that export.
- gradescope.csv: Name, SID, Email, a column per assignment and Total Score, for Gradescope's
  score upload (it asks which column is which): the roster's name, gradescope_sid and email
  (grader.batch.roster.LMS_COLUMNS; without them the student id as SID, and as Email where it is
  one). Each student's results.json is already in Gradescope's autograder schema.
- canvas.csv: Canvas's gradebook import (Grades > Import): Student, ID, SIS User ID, SIS Login ID,
  Section, then a column per assignment, and a Points Possible row under the header (course.toml's
  points). Canvas matches a row to a student by ID, SIS User ID or SIS Login ID: the roster's
  canvas_user_id, sis_user_id and sis_login_id, or without any, the roster's student id as SIS Login
  ID. Each cell is the assignment's grade after its late penalty (Canvas reads no other column of
  ours). A new column name makes Canvas create the assignment on import.

Every grade is the class view's (grader.batch.grades): course.toml's points, a TA's review and the
late penalty applied once there, read here, never recomputed.

Every cell goes through grader.sanitize.for_csv_cell (a plain number as it is): a student's name,
repo URL or a note quoting their text never reaches a spreadsheet as a formula (`=`, `+`, `-`, `@`
first) or with a control character.

An incomplete grade is never taken for the assignment's grade. Two kinds (Cell.lacks): a partial run
(`grader grade --case/--dtype`, a dry run: each score is the chosen cases' share of the points) and a
CPU-only one (`--device cpu`, or no GPU: the points only a GPU can earn were not graded). What the
gradebooks do with one is the course's choice, course.toml's `[gradebook] incomplete`:
- "mark" (the default): the score is written, and every gradebook says what it lacks where an import
  reads it: in the assignment's column name (`vector_add (CPU only)`, `vector_add (partial run)`;
  classroom.csv's assignment_name) and in the total's (`total (CPU only)`, gradescope.csv's `Total
  Score (CPU only)`); grades.csv's note, and a `note` column in classroom.csv and gradescope.csv, say
  it in words ("CPU only: 6 of 10 points need a GPU, not graded", "partial run: 1 of 20 cases").
  canvas.csv has its column names alone (any other column would be a new assignment in Canvas).
- "omit": the score cell is left empty (and so is the student's total), the note says why.
- "refuse": no gradebook is written (those of an earlier run are removed: they would pass for this
  one's), and the command says why and fails.

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


def _penalty(r, a: str) -> float:
    """The late points deducted from one assignment's score (the class view's Cell.penalty)."""
    return getattr(r.cells[a], "penalty", 0.0) or 0.0


def _final(cell, choice: str) -> float | None:
    """The grade a per-assignment gradebook shows: the score less its late penalty (Cell.final)."""
    shown = _shown(cell, choice)
    return None if shown is None else round(shown - (getattr(cell, "penalty", 0.0) or 0.0), 4)


class IncompleteGrades(Exception):
    """course.toml's `[gradebook] incomplete = "refuse"` and a grade that is not whole: no gradebook."""


LACKS = ("partial run", "CPU only")  # what an incomplete grade lacks (Cell.lacks), in this order in a column name


def _choice(view) -> str:
    """course.toml's `[gradebook] incomplete` (grader.batch.course.INCOMPLETE): mark, omit or refuse."""
    course = getattr(view, "course", None)
    choice = getattr(course, "incomplete", "mark") if course is not None else "mark"
    if choice == "refuse" and (found := _incomplete(view)):
        r, a, lacks = found[0]
        more = f" and {len(found) - 1} more" if len(found) > 1 else ""
        raise IncompleteGrades(
            f"no gradebook written: {len(found)} grade(s) are not whole grades ({r.student}'s {a}: {', '.join(lacks)}"
            f"{more}), and course.toml says [gradebook] incomplete = \"refuse\". Grade on a GPU, without "
            "--case/--dtype, or set incomplete = \"mark\" (the score written and marked) or \"omit\" (left empty)")
    return choice


def _incomplete(view) -> list:
    """(row, assignment, what it lacks) of every incomplete grade of the view."""
    return [(r, a, r.cells[a].lacks) for r in view.rows for a in view.assignments if a in r.cells and r.cells[a].lacks]


def _marked(view, choice: str, lacks) -> str:
    """' (partial run, CPU only)': what the given grades lack, as a column name says it ('' when omitted)."""
    found = set(lacks)
    return f" ({', '.join(w for w in LACKS if w in found)})" if choice == "mark" and found else ""


def _columns(view, choice: str) -> list[str]:
    """Each assignment's column name: its name, marked where a grade of it is incomplete (course.toml: mark)."""
    return [a + _marked(view, choice, [w for r in view.rows if a in r.cells for w in r.cells[a].lacks])
            for a in view.assignments]


def _total_mark(view, choice: str) -> str:
    """The mark of a total column: what any grade in it lacks."""
    return _marked(view, choice, [w for _, _, lacks in _incomplete(view) for w in lacks])


def _shown(cell, choice: str) -> float | None:
    """The score a gradebook shows: none for an incomplete grade the course omits."""
    return None if choice == "omit" and cell.lacks else cell.score


def _row_omits(r, choice: str) -> bool:
    return choice == "omit" and any(c.lacks for c in r.cells.values())


def _note(r, choice: str) -> str:
    """The row's note (Row.note), and where a score is left out, why."""
    if not _row_omits(r, choice):
        return r.note
    return "; ".join(filter(None, [r.note, 'incomplete grades left empty '
                                           '(course.toml: [gradebook] incomplete = "omit")']))


def _cell_note(r, a: str, choice: str) -> str:
    """What one grade lacks, in words (the cell's note), for a gradebook row of one assignment."""
    c = r.cells[a]
    if not c.lacks:
        return ""
    return c.notes() + ('; left empty (course.toml: incomplete = "omit")' if choice == "omit" else "")


def grades_csv(view) -> str:
    choice = _choice(view)
    mark = _total_mark(view, choice)
    header = ["student", "commit", *_columns(view, choice), f"total{mark}", "late", "hours_late", "late_penalty",
              f"final{mark}", "note"]
    rows = [header]
    for r in view.rows:
        late = "" if r.late is None else ("yes" if r.late else "no")
        hours = "" if r.hours_late is None else f"{max(0.0, r.hours_late):g}"
        total, final = (None, None) if _row_omits(r, choice) else (r.total, r.final)
        rows.append([r.student, r.commit or "", *[_score(_shown(r.cells[a], choice)) for a in view.assignments],
                     _score(total), late, hours, _score(r.penalty) if total is not None else "", _score(final),
                     _note(r, choice)])
    return _csv(rows)


def classroom_csv(view) -> str:
    choice = _choice(view)
    noted = bool(_incomplete(view))  # a note column where some grade is incomplete
    rows = [["assignment_name", "github_username", "roster_identifier", "student_repository_url", "commit",
             "points_awarded", "points_available", "raw_points", "late_penalty", *(["note"] if noted else [])]]
    for r in view.rows:
        for a, name in zip(view.assignments, _columns(view, choice)):
            c = r.cells[a]
            score = _shown(c, choice)
            cut = _penalty(r, a)
            final = _final(c, choice)
            rows.append([name, r.github_username, r.student, r.repo or "", r.commit or "", _score(final),
                         _score(c.max_score), _score(score), _score(cut) if score is not None else "",
                         *([_cell_note(r, a, choice)] if noted else [])])
    return _csv(rows)


def gradescope_csv(view) -> str:
    choice = _choice(view)
    policy = view.course is not None and view.course.policy is not None
    noted = bool(_incomplete(view))
    rows = [["Name", "SID", "Email", *_columns(view, choice), *(["Late Penalty"] if policy else []),
             f"Total Score{_total_mark(view, choice)}", *(["Note"] if noted else [])]]
    for r in view.rows:
        name, sid, email = gradescope_identity(r)
        omitted = _row_omits(r, choice)
        penalty = [_score(r.penalty) if r.total is not None and not omitted else ""] if policy else []
        rows.append([name, sid, email, *[_score(_shown(r.cells[a], choice)) for a in view.assignments],
                     *penalty, _score(None if omitted else r.final),
                     *(["; ".join(_cell_note(r, a, choice) for a in view.assignments if r.cells[a].lacks)]
                       if noted else [])])
    return _csv(rows)


def gradescope_identity(r) -> tuple[str, str, str]:
    """(Name, SID, Email) of a row for Gradescope: the roster's name, gradescope_sid and email
    (grader.batch.roster.LMS_COLUMNS); without them the roster's student id, as SID and, where it
    is one, as the email."""
    lms = getattr(r, "lms", None) or {}
    email = lms.get("email") or (r.student if "@" in r.student else "")
    return r.name or r.student, lms.get("gradescope_sid") or r.student, email


CANVAS_HEADER = ["Student", "ID", "SIS User ID", "SIS Login ID", "Section"]


def canvas_identity(r) -> tuple[str, str, str]:
    """(ID, SIS User ID, SIS Login ID) of a row for Canvas: the roster's canvas_user_id, sis_user_id
    and sis_login_id; with none of them, the roster's student id as the SIS Login ID."""
    lms = getattr(r, "lms", None) or {}
    user, sis = lms.get("canvas_user_id", ""), lms.get("sis_user_id", "")
    login = lms.get("sis_login_id") or ("" if user or sis else r.student)
    return user, sis, login


def canvas_csv(view) -> str:
    """Each cell is the assignment's grade (the late penalty deducted: Canvas has no column of ours
    for it), out of the Points Possible course.toml gives it."""
    choice = _choice(view)
    rows = [[*CANVAS_HEADER, *_columns(view, choice)],
            ["Points Possible", "", "", "", "", *[_score(points_possible(view, a)) for a in view.assignments]]]
    for r in view.rows:
        rows.append([r.name or r.student, *canvas_identity(r), "",
                     *[_score(_final(r.cells[a], choice)) for a in view.assignments]])
    return _csv(rows)


def points_possible(view, assignment: str) -> float | None:
    """The assignment's full points (GPU-only points included) as the gradebooks count them:
    course.toml's points for it, else the spec's, else the most any row was graded on."""
    from grader.spec import UnknownAssignment

    course = getattr(view, "course", None)
    if course is not None and assignment in course.points:
        return float(course.points[assignment])
    try:
        return view.catalogue.get(assignment).max_points
    except UnknownAssignment:
        maxes = [r.cells[assignment].max_score for r in view.rows if r.cells[assignment].max_score is not None]
        return max(maxes) if maxes else None


EXPORTS = {"grades.csv": grades_csv, "classroom.csv": classroom_csv, "gradescope.csv": gradescope_csv,
           "canvas.csv": canvas_csv}


def write_all(view, out: Path, guarded) -> None:
    """Every gradebook into `out`, each written atomically through `guarded(what, step)` (one that fails
    is reported there, the others are written); where course.toml refuses an incomplete grade, none:
    those of an earlier run are removed (they would pass for this run's) and view.errors says why, once."""
    try:
        _choice(view)
    except IncompleteGrades as exc:
        for name in EXPORTS:
            (Path(out) / name).unlink(missing_ok=True)
        view.errors.append(str(exc))
        return
    for name, export in EXPORTS.items():
        guarded(name, lambda: write_text_atomic(export(view), Path(out) / name))  # noqa: B023 - called at once
