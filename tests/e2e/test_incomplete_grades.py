"""A grade that is not the assignment's whole grade never reaches a gradebook unmarked: a CPU run's
(the points only a GPU can earn were not graded) and a partial run's (--case/--dtype). What the
gradebooks do with one is course.toml's `[gradebook] incomplete`: "mark" (the default: the score
written, its columns and notes say what it lacks), "omit" (the cell left empty, the note says why)
or "refuse" (no gradebook, the command says why). A whole grade is written as it always was."""

from __future__ import annotations

import csv
import io
import json
import shutil
from types import SimpleNamespace

import pytest

from tests.classbuild import make_class
from tests.conftest import COURSE, REPO_ROOT, run_cli
from grader.batch.classview import Cell, Row
from grader.batch.course import CourseConfig, CourseError, load_course
from grader.batch.exporters import EXPORTS, IncompleteGrades
from grader.results import AssignmentResult, RunResult, TestResult

CPU_NOTE = "CPU only: 6 of 10 points need a GPU, not graded"


def _view(gpu_points: float, incomplete: str = "mark", partial: dict | None = None) -> SimpleNamespace:
    """alice graded 4 of vector_add's 10 (`gpu_points` of them not graded: a CPU run) and 12 of softmax's 20."""
    va = Cell("vector_add", "graded", 4.0, 10.0, gpu_points=gpu_points, partial=partial or {},
              )
    alice = Row("alice", "alice", "fetched", name="=HYPERLINK(\"x\")", github_username="alice",
                cells={"vector_add": va, "softmax": Cell("softmax", "graded", 12.0, 20.0)})
    return SimpleNamespace(assignments=["vector_add", "softmax"], rows=[alice], catalogue=COURSE, late={},
                           course=CourseConfig(incomplete=incomplete), errors=[])


def _table(text: str) -> list[list[str]]:
    return list(csv.reader(io.StringIO(text)))


@pytest.mark.parametrize("name", sorted(EXPORTS))
def test_a_whole_grade_is_not_marked_in_any_gradebook(name):
    """Both directions: a complete run (a GPU's, every check ran) has no mark, no note column."""
    text = EXPORTS[name](_view(0.0))
    assert "CPU only" not in text and "partial" not in text and "incomplete" not in text.lower()
    assert "4" in [cell for row in _table(text) for cell in row]


def test_mark_names_the_cpu_only_column_and_total_and_says_why():
    view = _view(6.0)
    grades = _table(EXPORTS["grades.csv"](view))
    assert grades[0] == ["student", "commit", "vector_add (CPU only)", "softmax", "total (CPU only)", "late", "hours_late",
                         "late_penalty", "final (CPU only)", "note"]
    assert grades[1][2:5] == ["4", "12", "16"] and grades[1][8] == "16" and CPU_NOTE in grades[1][9]
    gradescope = _table(EXPORTS["gradescope.csv"](view))
    assert gradescope[0] == ["Name", "SID", "Email", "vector_add (CPU only)", "softmax", "Total Score (CPU only)", "Note"]
    assert gradescope[1][0] == "'=HYPERLINK(\"x\")"  # still never a formula
    assert gradescope[1][3:] == ["4", "12", "16", CPU_NOTE]
    canvas = _table(EXPORTS["canvas.csv"](view))
    assert canvas[0][5:] == ["vector_add (CPU only)", "softmax"] and canvas[2][5:] == ["4", "12"]
    classroom = {r["assignment_name"]: r for r in csv.DictReader(io.StringIO(EXPORTS["classroom.csv"](view)))}
    assert classroom["vector_add (CPU only)"]["points_awarded"] == "4" and classroom["vector_add (CPU only)"]["note"] == CPU_NOTE
    assert classroom["softmax"]["note"] == ""


def test_omit_leaves_the_incomplete_score_and_the_total_empty_and_says_why():
    view = _view(6.0, "omit")
    grades = _table(EXPORTS["grades.csv"](view))
    assert grades[0][2:5] == ["vector_add", "softmax", "total"]
    assert grades[1][2:5] == ["", "12", ""] and grades[1][8] == ""  # no 16 that reads as the grade
    assert CPU_NOTE in grades[1][9] and 'incomplete = "omit"' in grades[1][9]
    gradescope = _table(EXPORTS["gradescope.csv"](view))
    assert gradescope[1][3:6] == ["", "12", ""] and CPU_NOTE in gradescope[1][6]
    assert _table(EXPORTS["canvas.csv"](view))[2][5:] == ["", "12"]
    classroom = {r["assignment_name"]: r for r in csv.DictReader(io.StringIO(EXPORTS["classroom.csv"](view)))}
    assert classroom["vector_add"]["points_awarded"] == classroom["vector_add"]["raw_points"] == ""
    assert classroom["softmax"]["points_awarded"] == "12"


@pytest.mark.parametrize("name", sorted(EXPORTS))
def test_refuse_writes_no_gradebook(name):
    with pytest.raises(IncompleteGrades, match=r"alice's vector_add: CPU only.*incomplete = \"refuse\""):
        EXPORTS[name](_view(6.0, "refuse"))
    assert EXPORTS[name](_view(0.0, "refuse"))  # a whole grade is written under any choice


def test_a_partial_cpu_grade_names_both():
    view = _view(6.0, partial={"cases_run": 1, "cases": 20, "assignment_points": 10})
    assert _table(EXPORTS["grades.csv"](view))[0][2] == "vector_add (partial run, CPU only)"


def test_course_toml_names_the_choice_and_its_line(tmp_path):
    path = tmp_path / "course.toml"
    path.write_text('[course]\nname = "x"\n\n[gradebook]\nincomplete = "drop"\n')
    with pytest.raises(CourseError, match=r"line 5: incomplete must be one of 'mark', 'omit', 'refuse', not 'drop'"):
        load_course(path, COURSE)
    path.write_text('[gradebook]\nincomplete = "omit"\n')
    assert load_course(path, COURSE).incomplete == "omit"
    path.write_text("[course]\n")
    assert load_course(path, COURSE).incomplete == "mark"


def test_a_whole_run_s_results_json_is_not_marked():
    """The GPU-like direction of Gradescope's results.json: every check ran, nothing is marked."""
    tests = [TestResult("vector_add", "correctness", "n=1 [float32]", "passed", max_score=6, score=6),
             TestResult("vector_add", "performance", "speed", "passed", max_score=4, score=4)]
    data = RunResult("s", 1, {}, [AssignmentResult("vector_add", "Vector addition", "kernels/vector_add.py", tests)]
                     ).to_gradescope()
    assert data["output"] == "10 / 10 points" and data["extra_data"]["incomplete"] == []
    tests[1] = TestResult("vector_add", "performance", "speed", "skipped", max_score=4)  # the same run on a CPU
    data = RunResult("s", 1, {}, [AssignmentResult("vector_add", "Vector addition", "kernels/vector_add.py", tests)]
                     ).to_gradescope()
    assert data["output"].splitlines()[1].startswith("CPU only: 4 of these 10 points need a GPU and were not graded")
    assert data["score"] == 6 and data["extra_data"]["incomplete"] == ["CPU only"]


@pytest.fixture(scope="module")
def cpu_class(tmp_path_factory):
    """alice's correct vector_add, graded by `grader grade` in the CPU interpreter (every case: no
    --case), and checked by `grader check` as Gradescope's run_autograder runs it."""
    root = tmp_path_factory.mktemp("cpu")
    roster = make_class(root, {"alice": "good"})
    graded = run_cli(["grade", "--roster", str(roster), "--out", "out", "-a", "vector_add", "--device", "cpu", "--jobs", "1",
                      "--seed", "3"], root)
    assert graded.returncode == 0, graded.stdout + graded.stderr
    checked = run_cli(["check", str(root / "repos" / "alice"), "-a", "vector_add", "--device", "cpu", "--ci", "none",
                       "--seed", "3", "--json", str(root / "c" / "results.json"), "--html", str(root / "c")], root)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    return root


def _rebuild(root, incomplete: str):
    """The same class's gradebooks again under a course.toml that makes this choice."""
    (root / "course.toml").write_text(f'[gradebook]\nincomplete = "{incomplete}"\n')
    return run_cli(["similarity", "--class", "out", "--course", "course.toml"], root)


@pytest.mark.slow
def test_a_cpu_grade_is_marked_in_every_gradebook_and_results_json(cpu_class):
    out = cpu_class / "out"
    rebuilt = _rebuild(cpu_class, "mark")
    assert rebuilt.returncode == 0, rebuilt.stdout + rebuilt.stderr
    grades = next(csv.DictReader(io.StringIO((out / "grades.csv").read_text())))
    score = grades["vector_add (CPU only)"]
    assert 3.8 <= float(score) <= 4.2  # the correct sample: every check a CPU can run passes
    assert grades["total (CPU only)"] == grades["final (CPU only)"] == score and CPU_NOTE in grades["note"]
    gradescope = next(csv.DictReader(io.StringIO((out / "gradescope.csv").read_text())))
    assert gradescope["Total Score (CPU only)"] == score and gradescope["Note"] == CPU_NOTE
    canvas = _table((out / "canvas.csv").read_text())
    assert canvas[0][5] == "vector_add (CPU only)" and canvas[1][5] == "10" and canvas[2][5] == score
    classroom = next(csv.DictReader(io.StringIO((out / "classroom.csv").read_text())))
    assert classroom["assignment_name"] == "vector_add (CPU only)" and classroom["note"] == CPU_NOTE
    for results in (out / "students" / "alice" / "results.json", cpu_class / "c" / "results.json"):
        data = json.loads(results.read_text())
        first, second = data["output"].splitlines()[:2]
        assert first == f"{data['score']:g} / 10 points", results
        assert second.startswith("CPU only: 6 of these 10 points need a GPU and were not graded here"), results
        assert data["extra_data"]["incomplete"] == ["CPU only"]


@pytest.mark.slow
def test_a_course_that_omits_cpu_grades_leaves_them_empty(cpu_class):
    out = cpu_class / "out"
    rebuilt = _rebuild(cpu_class, "omit")
    assert rebuilt.returncode == 0, rebuilt.stdout + rebuilt.stderr
    grades = next(csv.DictReader(io.StringIO((out / "grades.csv").read_text())))
    assert (grades["vector_add"], grades["total"], grades["final"]) == ("", "", "") and CPU_NOTE in grades["note"]
    gradescope = next(csv.DictReader(io.StringIO((out / "gradescope.csv").read_text())))
    assert (gradescope["vector_add"], gradescope["Total Score"]) == ("", "") and CPU_NOTE in gradescope["Note"]
    assert _table((out / "canvas.csv").read_text())[2][5] == ""
    assert next(csv.DictReader(io.StringIO((out / "classroom.csv").read_text())))["points_awarded"] == ""


@pytest.mark.slow
def test_a_course_that_refuses_cpu_grades_writes_no_gradebook_and_says_why(cpu_class):
    out = cpu_class / "out"
    rebuilt = _rebuild(cpu_class, "refuse")
    assert rebuilt.returncode == 1
    assert "no gradebook written: 1 grade(s) are not whole grades (alice's vector_add: CPU only)" in rebuilt.stderr
    assert rebuilt.stderr.count("no gradebook written") == 1  # said once, not per file
    assert not any((out / name).exists() for name in EXPORTS)  # the earlier run's would pass for this one's
    assert (out / "index.html").is_file() and (out / "summary.json").is_file()  # the rest of the class view stands


@pytest.mark.parametrize("incomplete", ["omit", "refuse"])
def test_a_cpu_gradescope_autograder_is_refused_where_the_course_keeps_cpu_scores_out(tmp_path, monkeypatch, incomplete):
    """Gradescope stores every score it is given: a course that omits or refuses CPU-only grades gets no
    CPU autograder, and is told to build a GPU one (nothing is written)."""
    course = tmp_path / "course"
    shutil.copytree(REPO_ROOT / "assignments" / "vector_add", course / "assignments" / "vector_add",
                    ignore=shutil.ignore_patterns("__pycache__"))
    (course / "course.toml").write_text(f'[gradebook]\nincomplete = "{incomplete}"\n')
    monkeypatch.setenv("GRADER_COURSE", str(course))
    run = run_cli(["gradescope", "--out", "autograder.zip"], tmp_path)
    assert run.returncode == 2, run.stdout + run.stderr
    assert f'course.toml says [gradebook] incomplete = "{incomplete}"' in run.stderr and "--cuda" in run.stderr
    assert not (tmp_path / "autograder.zip").exists()


def test_the_grade_summary_names_no_gradebook_where_none_was_written(tmp_path, monkeypatch):
    """A course that refused an incomplete grade has no grades.csv: the closing line must not name one."""
    import io
    from types import SimpleNamespace

    from rich.console import Console

    from grader.cli import grade

    entry = {"graded": 1, "infra_error": 0, "reused": 0, "wall_s": 1.0}
    lock = SimpleNamespace(students=[])
    for written in (False, True):
        if written:
            (tmp_path / "grades.csv").write_text("student,total\n")
        buffer = io.StringIO()
        monkeypatch.setattr(grade, "console", Console(file=buffer, width=400))
        grade._print_summary(tmp_path, lock, entry)
        line = buffer.getvalue().strip().splitlines()[-1]
        assert ("gradebook: none written" in line) is not written
        assert (f"gradebook: {tmp_path / 'grades.csv'}" in line) is written


def test_the_dashboard_colours_a_cpu_run_by_the_points_it_could_earn_there():
    """A perfect CPU run (4 of the 4 points a CPU can earn, 6 more need a GPU) is full, not 40%; a run
    that earned nothing there is zero; a whole GPU grade is its share of all the points, as before."""
    perfect = Cell("vector_add", "graded", 4.0, 10.0, gpu_points=6.0, earnable=4.0)
    assert perfect.share == 1.0 and perfect.fraction == 0.4 and perfect.lacks == ["CPU only"]
    assert Cell("vector_add", "graded", 0.0, 10.0, gpu_points=6.0, earnable=4.0).share == 0.0
    assert Cell("vector_add", "graded", 7.0, 10.0, earnable=10.0).share == 0.7
    assert Cell("vector_add", "not graded").share is None


def test_checks_across_the_class_are_one_line_per_diagnosis_with_its_students():
    """Three students: one missing mask in two students' code (other lane counts, other lines: the same
    words), an untouched starter, one who passed: three diagnoses, each naming its students."""
    from grader.batch.classview import _diagnose

    def oob(student_line: int, lanes: int, case: str) -> TestResult:
        message = (f"out-of-bounds load in program (0, 0, 0): {lanes} of 1024 lanes fall outside the tensor; "
                   "mask this load (e.g. mask=offsets < n)")
        return TestResult("vector_add", "correctness", f"{case} [float32]", "failed", message, case=case,
                          dtype="float32", traceback=f'  File "kernels/vector_add.py", line {student_line}, in k')

    bob = AssignmentResult("vector_add", "Vector addition", "m", [oob(11, 1023, "n=1"), oob(11, 1, "n=1023")])
    dan = AssignmentResult("vector_add", "Vector addition", "m", [oob(14, 897, "n=127")])
    carol = AssignmentResult("vector_add", "Vector addition", "m",
                             [TestResult("vector_add", "correctness", "n=1 [float32]", "failed", "nan")],
                             headline="the kernel stores nothing yet: every output is still uninitialized memory")
    alice = AssignmentResult("vector_add", "Vector addition", "m",
                             [TestResult("vector_add", "correctness", "n=1 [float32]", "passed", "ok")])
    found: dict = {}
    for name, result in (("bob", bob), ("dan", dan), ("carol", carol), ("alice", alice)):
        _diagnose(found, name, f"students/{name}/report.html#vector_add", result)
    told = {d.outcome: d for d in found.values()}
    assert len(found) == 3 and set(told) == {"failed", "headline", "passed"}
    assert told["failed"].students == {"bob": 2, "dan": 1} and "mask this load" in told["failed"].words
    assert told["headline"].students == {"carol": 1} and told["passed"].students == {"alice": 0}
