"""One grade, one number: a class with course.toml's scaling, a late penalty, a TA's review, an
unreviewed integrity flag and a CPU-only grade, its records written as a batch writes them (no
worker runs), then every output compared field by field: the console's summary, each student's
report.html and results.json, the dashboard, summary.json, grades.csv, classroom.csv,
gradescope.csv and canvas.csv. Each shows the same grade out of the same points."""

from __future__ import annotations

import csv
import io
import json
import re
from pathlib import Path

import pytest

from grader.batch import reviews
from grader.batch.classview import write_class_outputs
from grader.batch.course import load_course
from grader.batch.grades import class_grades
from grader.batch.record import JobRecord
from grader.batch.store import read_record, record_path, store_record
from grader.batch.workspace import Lock, Pinned
from grader.payloads import Kind
from grader.results import AssignmentResult, Outcome, TestResult
from tests.classbuild import unmarked
from tests.conftest import COURSE

ASSIGNMENTS = ["vector_add", "softmax"]
COURSE_TOML = """
[assignments.vector_add]
points = 20
deadline = "2025-02-01T00:00:00Z"

[assignments.softmax]
deadline = "2025-02-01T00:00:00Z"

[late_policy]
grace_hours = 1
penalty_per_day = 10
max_penalty = 50
"""
ON_TIME, LATE = "2025-01-31T12:00:00+00:00", "2025-02-02T01:00:00+00:00"  # LATE: one started day, 10%

# student -> (commit date, {assignment: [(kind, outcome, score, max_score)]})
CLASS = {
    "alice": (ON_TIME, {"vector_add": [("correctness", "passed", 6, 6), ("performance", "passed", 2, 4)],
                        "softmax": [("correctness", "passed", 12, 12), ("performance", "passed", 8, 8)]}),
    "bob": (LATE, {"vector_add": [("correctness", "passed", 4, 6), ("performance", "failed", 0, 4)],
                   "softmax": [("correctness", "passed", 10, 12), ("performance", "failed", 0, 8)]}),
    # vector_add: the TA sets 5 of 10 points; softmax: flagged, no review yet (held)
    "carol": (ON_TIME, {"vector_add": [("correctness", "failed", 3, 6), ("performance", "failed", 0, 4)],
                        "softmax": [("correctness", "passed", 12, 12), ("integrity", "flagged", 0, 0),
                                    ("performance", "failed", 0, 8)]}),
    # graded on a CPU: the timing points were not graded
    "dan": (ON_TIME, {"vector_add": [("correctness", "passed", 6, 6), ("performance", "skipped", 0, 4)],
                      "softmax": [("correctness", "passed", 12, 12), ("performance", "skipped", 0, 8)]}),
}
# what each grade must be: (final, out of, late penalty, lacks, held)
EXPECTED = {
    ("alice", "vector_add"): (16, 20, 0, [], False), ("alice", "softmax"): (20, 20, 0, [], False),
    ("bob", "vector_add"): (7.2, 20, 0.8, [], False), ("bob", "softmax"): (9, 20, 1, [], False),
    ("carol", "vector_add"): (10, 20, 0, [], False), ("carol", "softmax"): (12, 20, 0, [], True),
    ("dan", "vector_add"): (12, 20, 0, ["CPU only"], False), ("dan", "softmax"): (12, 20, 0, ["CPU only"], False),
}


def _record(student: str, assignment: str, date: str, tests: list) -> JobRecord:
    result = AssignmentResult(assignment, assignment, f"{assignment}.py",
                              [TestResult(assignment, Kind(k), f"{k} {i}", Outcome(o), score=s, max_score=m)
                               for i, (k, o, s, m) in enumerate(tests)])
    return JobRecord(student, student, assignment, "graded", "", {"commit": f"c0ffee{student}"}, "1",
                     f"c0ffee{student}", f"https://example.edu/{student}.git", 3, None, {}, date, date, 1.0,
                     result=result.to_json())


def build(root: Path):
    (root / "course.toml").write_text(COURSE_TOML)
    course = load_course(root / "course.toml", COURSE)
    out = root / "out"
    students = []
    for student, (date, jobs) in CLASS.items():
        students.append(Pinned(student, f"https://example.edu/{student}.git", "fetched", commit=f"c0ffee{student}",
                               commit_date=date, name=student.title(),
                               lms={"canvas_user_id": str(100 + len(students)), "gradescope_sid": f"S{student}",
                                    "email": f"{student}@uni.edu"}))
        for assignment, tests in jobs.items():
            store_record(out, _record(student, assignment, date, tests))
    carol = read_record(record_path(out, "carol", "vector_add"))
    reviews.append(out, reviews.make("carol", "carol", "vector_add", carol, "points", 5, "partial credit", "ta-ann"))
    lock = Lock(students, "2025-02-03T00:00:00+00:00", root=root)
    return out, rebuild(out, lock, course), lock


def rebuild(out: Path, lock: Lock, course):
    """The class view written again (after a review, as `grader review` does)."""
    view = write_class_outputs(out, lock, ASSIGNMENTS, {"seed": 3}, course, catalogue=COURSE)
    assert view.errors == []
    return view


@pytest.fixture(scope="module")
def graded(tmp_path_factory):
    out, view, _ = build(tmp_path_factory.mktemp("one-grade"))
    return out, view


def _csv(out: Path, name: str) -> list[dict]:
    return [{unmarked(k): v for k, v in row.items()} for row in csv.DictReader(io.StringIO((out / name).read_text()))]


def _number(text: str) -> float:
    return float(text)


def test_the_class_view_computes_each_grade_once(graded):
    _, view = graded
    found = {(g.student, g.assignment): (g.final, g.out_of, g.late_penalty, list(g.lacks), g.held)
             for g in class_grades(view)}
    assert found == EXPECTED


def test_every_gradebook_shows_the_same_grade_of_the_same_points(graded):
    out, _ = graded
    grades = {r["student"]: r for r in _csv(out, "grades.csv")}
    classroom = {(r["roster_identifier"], unmarked(r["assignment_name"])): r for r in _csv(out, "classroom.csv")}
    gradescope = {r["SID"]: r for r in _csv(out, "gradescope.csv")}
    canvas = _csv(out, "canvas.csv")
    possible, canvas_rows = canvas[0], {r["ID"]: r for r in canvas[1:]}
    summary = {s["student"]: s for s in json.loads((out / "summary.json").read_text())["students"]}
    for i, student in enumerate(CLASS):
        finals = {a: EXPECTED[(student, a)][0] for a in ASSIGNMENTS}
        penalties = {a: EXPECTED[(student, a)][2] for a in ASSIGNMENTS}
        for a in ASSIGNMENTS:
            final, out_of, penalty, _, held = EXPECTED[(student, a)]
            assert _number(classroom[(student, a)]["points_awarded"]) == final, (student, a)
            assert _number(classroom[(student, a)]["points_available"]) == out_of
            assert _number(classroom[(student, a)]["late_penalty"]) == penalty
            assert _number(canvas_rows[str(100 + i)][a]) == final, (student, a)
            assert _number(possible[a]) == out_of
            cell = summary[student]["assignments"][a]
            assert (cell["final"], cell["max_score"], cell["late_penalty"], cell["held"]) == (final, out_of, penalty,
                                                                                              held)
            # grades.csv and gradescope.csv: the score before the penalty, the penalty beside it
            assert _number(grades[student][a]) == _number(gradescope[f"S{student}"][a]) == final + penalty
        total = round(sum(finals.values()), 4)
        assert _number(grades[student]["final"]) == _number(gradescope[f"S{student}"]["Total Score"]) == total
        assert summary[student]["final"] == total
        assert _number(grades[student]["late_penalty"]) == _number(gradescope[f"S{student}"]["Late Penalty"]) \
            == round(sum(penalties.values()), 4)
        # the roster's identities: Gradescope's name, SID and email; Canvas's user id
        assert (gradescope[f"S{student}"]["Name"], gradescope[f"S{student}"]["Email"]) == (student.title(),
                                                                                           f"{student}@uni.edu")
        assert canvas_rows[str(100 + i)]["Student"] == student.title()


def test_the_report_results_json_dashboard_and_console_say_the_same(graded, capsys):
    out, view = graded
    dashboard = (out / "index.html").read_text()
    for student in CLASS:
        total = round(sum(EXPECTED[(student, a)][0] for a in ASSIGNMENTS), 4)
        results = json.loads((out / "students" / student / "results.json").read_text())
        assert (results["score"], results["max_score"]) == (total, 40), student
        assert results["output"].startswith(f"{total:g} / 40 points in the course's gradebook")
        book = results["extra_data"]["gradebook"]
        report = (out / "students" / student / "report.html").read_text()
        assert f"{total:g} / 40 points <small>in the course's gradebook" in report
        for a in ASSIGNMENTS:
            final, out_of, penalty, lacks, held = EXPECTED[(student, a)]
            assert (book[a]["final"], book[a]["out_of"], book[a]["late_penalty"]) == (final, out_of, penalty)
            assert re.search(rf"In the gradebook: <b>{re.escape(f'{final:g} / {out_of:g} points')}", report.split(
                f'id="{a}"')[1]), (student, a)
    # the dashboard: bob's late cell names its final grade beside the score
    assert "late &minus;0.8: 7.2" in dashboard and "late &minus;1: 9" in dashboard
    # the console's summary: one line a grade, the same numbers
    from grader.cli import grade as grade_cli

    with grade_cli.console.capture() as captured:
        grade_cli._print_summary(out, Lock([], ""), {"graded": 8, "infra_error": 0, "reused": 0, "wall_s": 1,
                                                      "grades": class_grades(view)})
    said = " ".join(captured.get().split())
    assert "bob vector_add: 7.2 / 20 points (0.8 late penalty)" in said
    assert "carol softmax: 12 / 20 points (held for review)" in said
    assert "dan softmax: 12 / 20 points (CPU only)" in said
    assert "alice vector_add: 16 / 20 points" in said
