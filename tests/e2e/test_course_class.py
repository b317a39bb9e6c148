"""A class graded under course.toml, end to end in Triton's CPU interpreter: the late policy in
the pinning, the gradebooks and the student's report; an extension for one student; the
course's points; similar pairs on the dashboard with their side-by-side pages; the speed view.

The late rule (grader/batch/course.py, docs/course.md) worked by hand for these numbers: the deadline
is 2025-02-01T00:00Z, the grace 1 h, 10% of the points earned per started day after it.
alice's graded commit is dated 2025-02-02T01:00Z: 25 h late, 24 h after the grace, 1 day: 10%.
bob's commit has the same date, but his 48 h extension moves his deadline to 2025-02-03: on time.
"""

from __future__ import annotations

import csv
import io
import json
import shutil
from pathlib import Path

import pytest

from tests.classbuild import commit, make_class, unmarked
from tests.conftest import COURSE as CATALOGUE, run_cli

COURSE = """\
[course]
name = "Kernels 101"

[assignments.vector_add]
points = 20
deadline = "2025-02-01T00:00:00Z"

[assignments.softmax]
deadline = "2025-02-01T00:00:00Z"

[late_policy]
grace_hours = 1
penalty_per_day = 10
max_penalty = 50

[[extensions]]
student = "bob"
hours = 48
"""
QUICK = ["--device", "cpu", "--jobs", "2", "--case", "n=1", "--case", "1x1", "--dtype", "float32", "--seed", "3"]


def table(path: Path) -> dict[str, dict]:
    """A gradebook by student; QUICK's columns are marked partial, and read here by the assignment's name."""
    rows = csv.DictReader(io.StringIO(path.read_text()))
    return {row.get("student") or row.get("SID"): {unmarked(k): v for k, v in row.items()} for row in rows}


@pytest.fixture(scope="module")
def course_class(tmp_path_factory):
    """alice and bob: `good`, then an edit dated 25 h after the deadline; carol: an independent
    softmax; dave: alice's softmax renamed and reordered."""
    root = tmp_path_factory.mktemp("course")
    roster = make_class(root, {"alice": "good", "bob": "good", "carol": "softmax_independent", "dave": "softmax_renamed"})
    for s in ("alice", "bob"):
        module = root / "repos" / s / "kernels" / "vector_add.py"
        module.write_text(module.read_text() + "\n# tidied up after the deadline\n")
        commit(root / "repos" / s, "late edit", "2025-02-02T01:00:00+00:00")
    (root / "course.toml").write_text(COURSE)
    fetched = run_cli(["fetch", "--roster", str(roster), "--out", "ws", "--course", "course.toml"], root)
    assert fetched.returncode == 0, fetched.stdout + fetched.stderr
    run = run_cli(["grade", "--lock", "ws/lock.json", "--out", "out", "--course", "course.toml", *QUICK], root)
    assert run.returncode == 0, run.stdout + run.stderr
    return root, fetched, run


def test_fetch_pins_within_the_late_window_and_says_who_is_late(course_class):
    root, fetched, _ = course_class
    assert "pinned at the deadline 2025-02-01T00:00:00+00:00" in fetched.stdout
    assert "commits up to 2025-02-06T01:00:00+00:00 are graded" in fetched.stdout  # 1 h grace + 5 days to the 50% cap
    lock = {s["student"]: s for s in json.loads((root / "ws" / "lock.json").read_text())["students"]}
    assert lock["alice"]["commit_date"] == "2025-02-02T01:00:00+00:00" and lock["alice"]["late"] is True
    assert lock["bob"]["deadline"] == "2025-02-03T00:00:00+00:00" and lock["bob"]["late"] is False
    assert lock["carol"]["deadline"] == "2025-02-01T00:00:00+00:00"


def test_gradebooks_show_raw_score_penalty_and_final(course_class):
    root, _, run = course_class
    out = root / "out"
    g = table(out / "grades.csv")
    alice, bob = g["alice"], g["bob"]
    # the course's 20 points for vector_add; softmax keeps its spec's points. QUICK is a partial run: alice
    # earns the one case's share of the spec's 10 points, 0.13 (as grader check gives it): 0.13 / 10 of 20 = 0.26
    assert float(alice["vector_add"]) == 0.26
    raw = float(alice["total"])
    assert raw == float(alice["vector_add"]) + float(alice["softmax"])
    assert (alice["late"], alice["hours_late"]) == ("yes", "25")
    assert float(alice["late_penalty"]) == pytest.approx(raw / 10)  # 10% of every point she earned
    assert float(alice["final"]) == pytest.approx(raw * 0.9)
    assert (bob["late"], bob["late_penalty"]) == ("no", "0") and bob["final"] == bob["total"] == alice["total"]
    assert g["carol"]["late_penalty"] == "0"
    gradescope = list(csv.reader(io.StringIO((out / "gradescope.csv").read_text())))
    assert gradescope[0] == ["Name", "SID", "Email", "vector_add (partial run, CPU only)", "softmax (partial run, CPU only)",
                             "Late Penalty", "Total Score (partial run, CPU only)", "Note"]
    assert float(table(out / "gradescope.csv")["alice"]["Total Score"]) == pytest.approx(raw * 0.9)
    classroom = [r for r in csv.DictReader(io.StringIO((out / "classroom.csv").read_text())) if r["roster_identifier"] == "alice"]
    va = next(r for r in classroom if r["assignment_name"] == "vector_add (partial run, CPU only)")
    assert (va["points_available"], va["raw_points"], va["late_penalty"], va["points_awarded"]) == ("20", "0.26", "0.026", "0.234")
    summary = json.loads((out / "summary.json").read_text())
    s_alice = next(s for s in summary["students"] if s["student"] == "alice")
    assert s_alice["late_penalty"] == pytest.approx(raw / 10) and s_alice["hours_late"] == 25.0
    assert summary["late_policy"] == "1 h of grace, then 10% of the points per started day late, at most 50%"


def test_the_report_tells_the_student_how_the_penalty_was_computed(course_class):
    root, _, _ = course_class
    alice = (root / "out" / "students" / "alice" / "report.html").read_text()
    assert "25.0 h after your deadline 2025-02-01T00:00:00+00:00" in alice
    assert "1 started day(s) after the grace" in alice and "set by your own machine" in alice
    assert "this course counts vector_add for 20 points" in alice and "0.026 deducted, 0.234 count" in alice  # of 0.26
    bob = (root / "out" / "students" / "bob" / "report.html").read_text()
    assert "after your deadline" not in bob


def test_dashboard_lists_similar_pairs_with_side_by_side_pages(course_class):
    root, _, _ = course_class
    out = root / "out"
    summary = json.loads((out / "summary.json").read_text())
    softmax = summary["similarity"]["pairs"]["softmax"]
    pairs = {(p["a"], p["b"]) for p in softmax}
    # alice and bob hand in the same `good` softmax; dave's is it renamed and reordered; carol's is her own
    assert pairs == {("alice", "bob"), ("alice", "dave"), ("bob", "dave")}
    assert summary["similarity"]["settings"]["threshold"] == 0.6
    html = (out / "index.html").read_text()
    section = html.split("<h2>Similar submissions</h2>")[1].split("<h2>")[0]
    for p in softmax:
        page = out / p["page"]
        assert page.is_file() and f'href="{p["page"]}"' in section
        assert "<mark>" in page.read_text()
    assert "carol" not in section.split("(softmax)</small></h3>")[1]  # (vector_add is `good` for all four)
    # the speed view is there; on the CPU nothing is timed, so nothing is ranked
    speed = html.split("<h2>Speed</h2>")[1].split("<h2>")[0]
    assert "4 graded without a scored timing" in speed and "GPU only" in speed
    assert "late penalty" in html and "1 h of grace" in html
    assert "<h1>Class dashboard: Kernels 101</h1>" in html


def test_similarity_command_rebuilds_with_another_threshold(course_class, tmp_path):
    root, _, _ = course_class
    work = tmp_path / "c"
    shutil.copytree(root, work, symlinks=True)
    out = work / "out"
    batch = json.loads((out / "batch.json").read_text())
    batch["lock"] = str(work / "ws")
    (out / "batch.json").write_text(json.dumps(batch))
    run = run_cli(["similarity", "--class", "out", "--course", "course.toml", "--threshold", "0.95"], work)
    assert run.returncode == 0, run.stdout + run.stderr
    pairs = json.loads((out / "summary.json").read_text())["similarity"]["pairs"]["softmax"]
    assert [(p["a"], p["b"], p["score"]) for p in pairs] == [("alice", "bob", 1.0)]
    assert not (out / "similarity" / "softmax" / "alice--dave.html").exists()  # the old pages go
    bad = run_cli(["similarity", "--class", "out", "--threshold", "2"], work)
    assert bad.returncode == 2 and "--threshold must be in (0, 1]" in bad.stderr


def test_a_bad_course_file_stops_fetch_and_grade_with_its_line(tmp_path):
    (tmp_path / "course.toml").write_text(COURSE.replace("penalty_per_day = 10", "penalty_per_day = ten"))
    (tmp_path / "roster.csv").write_text("student,repo\n")
    for args in (["fetch", "--roster", "roster.csv", "--out", "ws"], ["grade", "--roster", "roster.csv", "--out", "out"]):
        run = run_cli([*args, "--course", "course.toml"], tmp_path)
        assert run.returncode == 2 and "course.toml, line 13: not valid TOML" in run.stderr, run.stderr
    assert not (tmp_path / "ws").exists() and not (tmp_path / "out").exists()


def test_grade_refuses_a_threshold_out_of_range(tmp_path):
    make_class(tmp_path, {"alice": "good"})
    run = run_cli(["grade", "--roster", "roster.csv", "--out", "out", "--similarity-threshold", "1.5"], tmp_path)
    assert run.returncode == 2 and "--similarity-threshold must be in (0, 1]" in run.stderr
    assert not (tmp_path / "out").exists()


def test_fetch_of_assignments_with_different_deadlines_is_refused(tmp_path):
    (tmp_path / "course.toml").write_text(COURSE.replace('[assignments.softmax]\ndeadline = "2025-02-01', '[assignments.softmax]\ndeadline = "2025-02-08'))
    make_class(tmp_path, {"alice": "good"})
    run = run_cli(["fetch", "--roster", "roster.csv", "--out", "ws", "--course", "course.toml"], tmp_path)
    assert run.returncode == 2 and "different deadlines" in run.stderr and "-a NAME" in run.stderr
    ok = run_cli(["fetch", "--roster", "roster.csv", "--out", "ws", "--course", "course.toml", "-a", "softmax"], tmp_path)
    assert ok.returncode == 0 and "pinned at the deadline 2025-02-08T00:00:00+00:00" in ok.stdout, ok.stdout + ok.stderr


def test_similarity_of_a_class_large_enough_to_use_every_core(tmp_path):
    """40 students (tokenizing then runs in a spawned process pool, under `python -m grader`):
    20 hand in `good`, 20 the independent softmax; only pairs within each group are listed."""
    from grader.batch.similarity import PARALLEL_FROM

    n = max(40, PARALLEL_FROM)
    roster = make_class(tmp_path, {f"s{i:02d}": "good" if i % 2 else "softmax_independent" for i in range(n)})
    assert run_cli(["fetch", "--roster", str(roster), "--out", "ws"], tmp_path).returncode == 0
    out = tmp_path / "out"
    out.mkdir()
    (out / "batch.json").write_text(json.dumps({"lock": str(tmp_path / "ws"), "assignments": ["softmax"]}))
    run = run_cli(["similarity", "--class", "out"], tmp_path, timeout=600)
    assert run.returncode == 0, run.stdout + run.stderr
    summary = json.loads((out / "summary.json").read_text())
    counts = summary["similarity"]["settings"]["per_assignment"]["softmax"]
    half = n // 2
    assert counts["files"] == n and counts["above_threshold"] == 2 * half * (half - 1) // 2
    listed = summary["similarity"]["pairs"]["softmax"]
    assert len(listed) == min(200, counts["above_threshold"])
    assert all(int(p["a"][1:]) % 2 == int(p["b"][1:]) % 2 for p in listed)  # never a good and an independent one


def test_a_course_deadline_the_fetch_did_not_pin_by_is_applied_with_a_warning(course_class, tmp_path):
    """The lock fetched with no deadline (before course.toml had one): lateness still comes from
    course.toml, and the dashboard says the commits were not pinned by it."""
    from grader.batch.classview import write_class_outputs
    from grader.batch.course import load_course
    from grader.batch.workspace import read_lock

    root, _, _ = course_class
    work = tmp_path / "c"
    shutil.copytree(root, work, symlinks=True)
    lock = read_lock(work / "ws" / "lock.json")
    for p in lock.students:
        p.deadline = p.cutoff = None
    view = write_class_outputs(work / "out", lock, ["vector_add", "softmax"], None, load_course(work / "course.toml", CATALOGUE),
                               catalogue=CATALOGUE)
    g = table(work / "out" / "grades.csv")
    assert g["alice"]["total"], (g, view.errors)
    assert float(g["alice"]["late_penalty"]) == pytest.approx(float(g["alice"]["total"]) / 10)
    assert g["bob"]["late_penalty"] == "0"  # his extension is course.toml's too
    assert "not pinned by them" in view.warning and "not pinned by them" in (work / "out" / "index.html").read_text()
