"""Honest numbers of a run with --case/--dtype (a TA's dry run, a student's reproducer): the chosen
cases earn their share of the assignment's points, the same in `grader check` and `grader grade`,
and every output of the batch says the run was partial; a --case or --dtype that chooses nothing
is exit 2 naming it, never a check of nothing."""

from __future__ import annotations

import csv
import io
import json
from types import SimpleNamespace

import pytest

from tests.classbuild import make_class
from tests.conftest import COURSE, run_cli
from grader.batch.classview import Cell, Row
from grader.batch.exporters import EXPORTS

PARTIAL = {"cases_run": 1, "cases": 20, "assignment_points": 10}


def _view(partial: dict) -> SimpleNamespace:
    alice = Row("alice", "alice", "fetched", github_username="alice",
                cells={"vector_add": Cell("vector_add", "graded", 0.3, 10.0, partial=partial),
                       "softmax": Cell("softmax", "graded", 12.0, 20.0)})
    return SimpleNamespace(assignments=["vector_add", "softmax"], rows=[alice], course=None, catalogue=COURSE, late={})


@pytest.mark.parametrize("name", sorted(EXPORTS))
def test_every_gradebook_names_a_partial_column_and_only_that_one(name):
    marked = EXPORTS[name](_view(PARTIAL))
    plain = EXPORTS[name](_view({}))
    assert "vector_add (partial run)" in marked and "softmax (partial run)" not in marked
    assert "partial" not in plain and "Note" not in plain  # a full run's gradebook is as it always was
    # and the totals a partial score is part of say so too (Canvas's import has no total column)
    totals = {"grades.csv": ["total", "final"], "gradescope.csv": ["Total Score"]}.get(name, [])
    assert all(f"{t} (partial run)" in marked for t in totals), marked
    rows = lambda text: list(csv.reader(io.StringIO(text.replace("vector_add (partial run)", "vector_add"))))  # noqa: E731
    # the scores themselves are the same numbers (the mark, and the note, are all that differ)
    notes = {"grades.csv": -1}.get(name)  # grades.csv's note column says it in words; the others add a note column
    cut = (lambda r: r[:notes]) if notes else (lambda r: r)  # noqa: E731
    assert [cut(r[:len(p)]) for r, p in zip(rows(marked)[1:], rows(plain)[1:])] == [cut(r) for r in rows(plain)[1:]]
    if name == "grades.csv":
        assert rows(marked)[1][-1] == "vector_add: graded (partial run: 1 of 20 cases, --case/--dtype)"


@pytest.mark.parametrize("args, message", [
    (["--case", "n=1", "--case", "n=1x"], "--case n=1x: no such case in vector_add (named cases: n=1, "),
    (["--case", "hidden-looking-name"], "--case hidden-looking-name: no such case"),
])
def test_check_names_a_case_that_matches_nothing(submission, cli, args, message):
    run = cli(submission("good"), "-a", "vector_add", "--device", "cpu", "--seed", "3", *args)
    assert run.returncode == 2 and message in run.stderr, run.stderr
    assert "Traceback" not in run.stderr and run.results is None  # nothing ran, nothing written as if it had


def test_the_shape_a_case_error_suggests_is_one_the_assignment_takes(submission, cli):
    """The example of a case by its shape is the assignment's own way of naming its sizes (a
    vector's shape=17, rows' shape=1x17), and the check takes it."""
    repo = submission("good")
    for name, example in (("vector_add", "shape=17"), ("softmax", "shape=1x17")):
        run = cli(repo, "-a", name, "--device", "cpu", "--case", "nope")
        assert run.returncode == 2 and f"a random one by its shape, e.g. {example})" in run.stderr, run.stderr
    taken = cli(repo, "-a", "vector_add", "--device", "cpu", "--dtype", "float32", "--case", "shape=17")
    assert taken.returncode == 0 and "shape=17" in taken.stdout, taken.stdout + taken.stderr


def test_grade_names_a_case_that_matches_nothing(tmp_path):
    roster = make_class(tmp_path, {"alice": "good"})
    run = run_cli(["grade", "--roster", str(roster), "--out", "out", "-a", "vector_add", "--device", "cpu",
                   "--case", "n=1", "--case", "n=l"], tmp_path)
    assert run.returncode == 2 and "--case n=l: no such case in vector_add" in run.stderr, run.stdout + run.stderr
    assert not (tmp_path / "out" / "grades.csv").exists()


@pytest.mark.slow
def test_a_case_batch_gives_the_chosen_cases_the_points_check_gives_and_says_partial(tmp_path):
    flags = ["-a", "vector_add", "--device", "cpu", "--case", "n=1", "--dtype", "float32", "--seed", "3"]
    roster = make_class(tmp_path, {"alice": "good"})
    graded = run_cli(["grade", "--roster", str(roster), "--out", "out", *flags], tmp_path)
    assert graded.returncode == 0, graded.stdout + graded.stderr
    assert "Partial run (--case/--dtype)" in graded.stdout
    checked = run_cli(["check", str(tmp_path / "repos" / "alice"), *flags, "--json", str(tmp_path / "c" / "results.json"),
                       "--html", str(tmp_path / "c")], tmp_path)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    check_points = json.loads((tmp_path / "c" / "results.json").read_text())["extra_data"]["assignments"]["vector_add"]
    out = tmp_path / "out"
    results = json.loads((out / "students" / "alice" / "results.json").read_text())
    batch_points = results["extra_data"]["assignments"]["vector_add"]
    assert batch_points["score"] == check_points["score"] and 0 < batch_points["score"] < 1  # one case's share of 10
    assert batch_points["partial"] == check_points["partial"] and batch_points["partial"]["assignment_points"] == 10
    assert results["extra_data"]["partial"] is True and results["output"].startswith(f"{batch_points['score']:g} / 10 points (partial run")
    summary = json.loads((out / "summary.json").read_text())
    cell = summary["students"][0]["assignments"]["vector_add"]
    assert summary["partial"] is True and cell["partial"]["cases_run"] == 1
    assert (cell["score"], cell["max_score"]) == (batch_points["score"], 10)
    assert "Partial run" in (out / "index.html").read_text()
    # a CPU's partial run: both marks, on the score and on every total it is in
    mark = " (partial run, CPU only)"
    grades = list(csv.DictReader(io.StringIO((out / "grades.csv").read_text())))
    assert float(grades[0]["vector_add" + mark]) == batch_points["score"] and "partial run: 1 of" in grades[0]["note"]
    assert grades[0]["total" + mark] == grades[0]["final" + mark] == grades[0]["vector_add" + mark]
    gradescope = next(csv.DictReader(io.StringIO((out / "gradescope.csv").read_text())))
    assert gradescope["Total Score" + mark] == grades[0]["vector_add" + mark]
    assert "partial run: 1 of" in gradescope["Note"] and "need a GPU, not graded" in gradescope["Note"]
    classroom = next(csv.DictReader(io.StringIO((out / "classroom.csv").read_text())))
    assert classroom["assignment_name"] == "vector_add" + mark and "partial run: 1 of" in classroom["note"]
    assert next(csv.reader(io.StringIO((out / "canvas.csv").read_text())))[-1] == "vector_add" + mark


def test_a_dtype_no_assignment_takes_is_named():
    """A course's assignment of one dtype: --dtype float16 would choose none of its cases."""
    from grader.judge.context import GradingContext

    spec = SimpleNamespace(name="scan", cases=[SimpleNamespace(name="n=8", params={"n": 8})], dtypes=("float32",),
                           random_cases=lambda rng: [], shapes_secret=None)
    assert GradingContext("cpu", 3, dtypes=("float32",)).unmatched([spec]) == []
    assert GradingContext("cpu", 3, cases=("n=8",)).unmatched([spec]) == []
    assert GradingContext("cpu", 3, cases=("n=9",), dtypes=("float16",)).unmatched([spec]) == [
        "--case n=9: no such case in scan (named cases: n=8; a random one by its shape, e.g. shape=17)",
        "--dtype float16: no case of scan is in it (their dtypes: float32)"]
