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


# -- a student's own check: the kit's CI, Classroom 50 and Gradescope say the class side's number ---------------

def _run_of(student: str):
    """The student's raw result as their own check would have it (the records' tests, no late penalty)."""
    from grader.results import RunResult

    run = RunResult(f"/checkout/{student}", 3, {"mode": "cpu"})
    for assignment, tests in CLASS[student][1].items():
        run.assignments.append(AssignmentResult.from_json(_record(student, assignment, ON_TIME, tests).result))
    return run


def _shipped(root: Path, tmp_path: Path):
    """course.toml (vector_add for 20 points, deadlines, a late policy) released as a kit and as a
    Gradescope autograder; the course each ships, as a check there finds it."""
    import zipfile

    from grader.kit import release
    from grader.kit.gradescope import build_autograder
    from grader.spec import Course

    course = load_course(root / "course.toml", COURSE)
    kit = release.build_kit(tmp_path / "kit", ASSIGNMENTS, requirement="grader==0.1.0", catalogue=COURSE,
                            ci_score=course.ci_score, points=course.points)
    zipped = tmp_path / "autograder.zip"
    build_autograder(zipped, ASSIGNMENTS, catalogue=COURSE, points=course.points)
    with zipfile.ZipFile(zipped) as z:
        z.extractall(tmp_path / "source")
    return Course(kit.root), Course(tmp_path / "source" / "course")


def test_a_kit_and_an_autograder_ship_course_tomls_points_and_nothing_else_of_it(tmp_path):
    import tomllib

    (tmp_path / "course.toml").write_text(COURSE_TOML)
    kit, autograder = _shipped(tmp_path, tmp_path / "shipped")
    manifest = tomllib.loads((kit.root / "grader-kit.toml").read_text())
    assert manifest["points"] == {"vector_add": 20}  # softmax: course.toml sets no points, the spec's stand
    readme = (kit.root / "README.md").read_text()  # the kit's table of assignments says the course's points
    assert re.search(r"\| `vector_add` \| 20 \|", readme) and re.search(r"\| `softmax` \| 20 \|", readme)
    shipped = tomllib.loads((autograder.root / "grader-points.toml").read_text())
    assert shipped == {"points": {"vector_add": 20}}
    for folder in (kit.root, autograder.root):  # no deadline, extension or late policy in either
        text = "".join(p.read_text(errors="replace") for p in folder.rglob("*") if p.is_file() and p.suffix != ".whl")
        assert "2025-02-01" not in text and "late_policy" not in text and "penalty_per_day" not in text
    from grader.kit.points import shipped_points

    assert shipped_points(kit) == shipped_points(autograder) == {"vector_add": 20}
    # without course.toml's points nothing is shipped and nothing changes
    plain = load_course(tmp_path / "course.toml", COURSE)
    plain.points.clear()
    from grader.kit import release

    bare = release.build_kit(tmp_path / "bare", ["vector_add"], requirement="grader==0.1.0", catalogue=COURSE,
                             points=plain.points)
    assert "points" not in tomllib.loads((bare.root / "grader-kit.toml").read_text())
    assert shipped_points(type(kit)(bare.root)) == {}


def test_a_hostile_points_table_changes_no_grade_and_stops_nothing(tmp_path):
    """grader-kit.toml lies in the student's repo: a value that is not a positive number is left out."""
    from grader.kit.points import shipped_points
    from grader.spec import Course

    (tmp_path / "grader-kit.toml").write_text('[points]\nvector_add = -3\nsoftmax = "20"\nrelu = true\n'
                                              'matmul_relu = inf\nlayernorm = 5\n')
    assert shipped_points(Course(tmp_path)) == {"layernorm": 5}
    (tmp_path / "grader-kit.toml").write_text("points = 7\n")
    assert shipped_points(Course(tmp_path)) == {}
    (tmp_path / "grader-kit.toml").write_text("[points\n")  # not TOML
    assert shipped_points(Course(tmp_path)) == {}


@pytest.mark.parametrize("student", ["alice", "bob", "dan"])
def test_a_check_in_the_kit_and_the_autograder_says_the_class_sides_number(graded, tmp_path, student, monkeypatch):
    """The raw result a class grades (alice 8 / 10 and 20 / 20; bob 4 / 10 and 10 / 20, late; dan a
    CPU-only grade) checked in the kit and by the Gradescope autograder: the terminal's Score line,
    the report's headline, results.json's score and max_score, Classroom 50's result.json and the
    GitHub job summary and Points notice show the class side's number of the same maximum (grades.csv's,
    before the late penalty, which no check applies), vector_add out of course.toml's 20."""
    from types import SimpleNamespace

    from grader.cli import outputs
    from grader.cli.check import CheckOptions, sinks_for
    from grader.kit import classroom50 as c50
    from grader.kit import github
    from grader.settings import from_environment
    from tests.kit.test_classroom50 import runner_env

    out, _ = graded
    root = tmp_path / "course"
    root.mkdir()
    (root / "course.toml").write_text(COURSE_TOML)
    kit, autograder = _shipped(root, tmp_path / "shipped")
    row = {r["student"]: r for r in _csv(out, "grades.csv")}[student]
    penalty = _number(row["late_penalty"])
    scores = {a: _number(row[a]) for a in ASSIGNMENTS}  # the class side's, before the late penalty
    total, top = round(sum(scores.values()), 4), 40
    assert (round(_number(row["final"]) + penalty, 4)) == total
    possible = _csv(out, "canvas.csv")[0]
    assert {a: _number(possible[a]) for a in ASSIGNMENTS} == {"vector_add": 20, "softmax": 20}
    gpu = student == "dan"
    gradable = {a: scores[a] for a in ASSIGNMENTS} if gpu else {a: 20 for a in ASSIGNMENTS}  # dan: all that ran passed
    run = _run_of(student)

    for course in (kit, autograder):
        repo = tmp_path / f"checkout-{course.root.name}"
        repo.mkdir()
        monkeypatch.setenv("CLASSROOM", "cs101")
        options = CheckOptions(repo, json_file=repo / ".grader" / "results.json", html_dir=repo / ".grader",
                               ci="none" if course is autograder else None, ci_mode=None)
        sinks = sinks_for(options, from_environment({}), course)
        setup = SimpleNamespace(sub=SimpleNamespace(root=repo), ctx=SimpleNamespace(device="cpu"), keep=None)
        for sink in sinks:
            sink.setup = setup
        with outputs.console.capture() as captured:
            for sink in sinks:
                sink.finished(run)
        said = " ".join(captured.get().split())
        assert f"Score: {total:g} / {top} in the course's points" in said, said
        assert f"vector_add (vector_add.py): {run.assignments[0].score:g} / 10 points = {scores['vector_add']:g} / 20 " \
               "in the course's points" in said
        results = json.loads((repo / ".grader" / "results.json").read_text())
        assert (results["score"], results["max_score"]) == (total, top), course.root
        assert results["output"].startswith(f"{total:g} / {top} points in the course's points")
        assert "no late penalty" in results["output"].splitlines()[0]
        book = results["extra_data"]["gradebook"]
        assert {a: (book[a]["final"], book[a]["out_of"]) for a in ASSIGNMENTS} == {a: (scores[a], 20)
                                                                                   for a in ASSIGNMENTS}
        report = (repo / ".grader" / "report.html").read_text()
        assert f"{total:g} / {top} points <small>in the course's points" in report
        assert f"In the course's points: <b>{scores['vector_add']:g} / 20 points" in report

    # Classroom 50 (its autograder embeds the kit's grader-kit.toml) and a GitHub Actions job in the kit
    repo = tmp_path / "c50"
    env = runner_env(tmp_path)
    echoed: list[str] = []
    assert c50.report(run, repo if repo.mkdir() is None else repo, "cpu", env, echo=echoed.append, catalogue=kit) == 0
    data = json.loads((repo / "result.json").read_text())
    parts = {t["test-name"].split(":")[0]: t for t in data["tests"]}
    for a in ASSIGNMENTS:
        assert parts[a]["exact-score"] == f"{scores[a]:g}" and parts[a]["exact-max-score"] == f"{gradable[a]:g}"
    exact = c50.Fraction(repr(total))
    assert data["score"] == c50.round_half_up(exact)
    assert data["max-score"] == round(sum(gradable.values()))
    if gpu:  # out of what this runner can grade, the course's 40 at grading said beside it
        assert "(of 40 at grading)" in Path(env["GITHUB_OUTPUT"]).read_text()
    body = (repo / "release-body.md").read_text()
    assert f"Exact points: {total:g} / {sum(gradable.values()):g}" in body and "No late penalty is applied here" in body
    notices: list[str] = []
    summary, output = tmp_path / "summary.md", tmp_path / "output"
    github.report_github(run, repo, "cpu", {"GITHUB_STEP_SUMMARY": str(summary), "GITHUB_OUTPUT": str(output)},
                         echo=notices.append, catalogue=kit)
    import base64

    payload = json.loads(base64.b64decode(output.read_text().strip().split("=", 1)[1]))
    assert payload["max_score"] == sum(gradable.values())  # classroom-resources' result, in the course's points too
    notice = next(n for n in notices if n.startswith("::notice title=Points::"))
    head = f"{total:g} / {sum(gradable.values()):g} points"
    assert notice.startswith(f"::notice title=Points::{head}"), notice
    assert summary.read_text().startswith(f"## Triton kernels: {head}")
    assert f"| {scores['vector_add']:g} / {gradable['vector_add']:g} |" in summary.read_text()


@pytest.mark.slow
def test_grader_check_in_a_released_kit_reports_the_course_points(tmp_path, monkeypatch):
    """The real command in a student's clone of a kit released from course.toml's 20 points for
    vector_add: a right kernel on the CPU earns 4 of the spec's 10 (6 need a GPU); the Score line,
    results.json and the report say the class side's 8 / 20, marked CPU only, with no late penalty."""
    import shutil

    from grader.batch.course import exact
    from grader.kit import release
    from tests.conftest import FIXTURES, run_cli

    (tmp_path / "course.toml").write_text(COURSE_TOML)
    course = load_course(tmp_path / "course.toml", COURSE)
    kit = release.build_kit(tmp_path / "kit", ["vector_add"], requirement="grader==0.1.0", catalogue=COURSE,
                            points=course.points)
    clone = tmp_path / "clone"
    shutil.copytree(kit.root, clone)
    shutil.copy(FIXTURES / "good" / "kernels" / "vector_add.py", clone / "kernels" / "vector_add.py")
    monkeypatch.setenv("GRADER_COURSE", str(clone))  # the kit's course, as the student's clone finds it
    monkeypatch.delenv("GRADER_COURSE_SECRET", raising=False)
    for ci in ("CI", "GITHUB_ACTIONS"):
        monkeypatch.delenv(ci, raising=False)
    checked = run_cli(["check", ".", "-a", "vector_add", "--device", "cpu", "--seed", "5"], clone)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    results = json.loads((clone / ".grader" / "results.json").read_text())
    raw = results["extra_data"]["assignments"]["vector_add"]
    assert (raw["score"], raw["max_score"]) == (4, 10)
    expected, top = course.scale("vector_add", exact(raw["score"]), exact(raw["max_score"]))  # the class view's
    grade = round(float(expected), 4)
    assert (results["score"], results["max_score"]) == (grade, float(top)) == (8, 20)
    assert results["extra_data"]["gradebook"]["vector_add"]["lacks"] == ["CPU only"]
    said = " ".join(checked.stdout.split())
    assert "Score: 8 / 20 in the course's points (course.toml's; CPU only; no late penalty in a check" in said, said
    assert "8 / 20 points <small>in the course's points" in (clone / ".grader" / "report.html").read_text()


def test_the_release_and_gradescope_commands_ship_the_course_points(tmp_path, monkeypatch):
    """`grader release` and `grader gradescope` (their --no-check fast path) on a course whose
    course.toml counts vector_add for 20: the kit's grader-kit.toml and the zip's grader-points.toml
    carry that and nothing else of course.toml."""
    import shutil
    import tomllib
    import zipfile

    from tests.conftest import REPO_ROOT, run_cli

    course = tmp_path / "course"
    for part in ("assignments", "reference"):
        shutil.copytree(REPO_ROOT / part, course / part, ignore=shutil.ignore_patterns("__pycache__"))
    (course / "course.toml").write_text(COURSE_TOML)
    monkeypatch.setenv("GRADER_COURSE", str(course))
    made = run_cli(["release", "--out", str(tmp_path / "kit"), "-a", "vector_add", "--no-check",
                    "--grader-requirement", "grader==0.1.0"], tmp_path)
    assert made.returncode == 0, made.stdout + made.stderr
    assert tomllib.loads((tmp_path / "kit" / "grader-kit.toml").read_text())["points"] == {"vector_add": 20}
    zipped = run_cli(["gradescope", "--out", str(tmp_path / "a.zip"), "-a", "vector_add", "--no-check"], tmp_path)
    assert zipped.returncode == 0, zipped.stdout + zipped.stderr
    with zipfile.ZipFile(tmp_path / "a.zip") as z:
        shipped = z.read("course/grader-points.toml").decode()
        assert not any(n.endswith("course.toml") for n in z.namelist())
    assert tomllib.loads(shipped) == {"points": {"vector_add": 20}} and "2025-02-01" not in shipped
