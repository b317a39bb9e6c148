"""`grader review` on a class graded in Triton's CPU interpreter: a TA clears or upholds an
integrity flag or sets the points, and the decision reaches results.json, the report, the
dashboard, summary.json and every gradebook; `grade --resume` keeps it; a regrade at a new commit
makes it stale; bad input is refused with the reason and changes nothing; hostile text in a note
is inert at every sink; two reviews at once both land; the log survives a crash mid-write."""

from __future__ import annotations

import csv
import io
import json
import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from tests.classbuild import commit, make_class, overlay, unmarked
from tests.conftest import REPO_ROOT, run_cli

QUICK = ["--device", "cpu", "--jobs", "2", "-a", "softmax", "--seed", "3"]  # a whole grade: a partial run is no grade to review


def graded_class(root: Path) -> Path:
    """alice: an honest softmax (8 of its 20 points: bfloat16 cases and timing do not run on the CPU); carol: torch's softmax (a
    conclusive flag, 0 points); dan: no repo."""
    roster = make_class(root, {"alice": "good", "carol": "torch_softmax"}, ["dan,repos/nowhere"])
    run_cli(["fetch", "--roster", str(roster), "--out", "ws"], root)
    run = run_cli(["grade", "--lock", "ws/lock.json", "--out", "out", *QUICK], root)
    assert run.returncode == 0, run.stdout + run.stderr
    return root / "out"


@pytest.fixture(scope="module")
def shared(tmp_path_factory):
    return graded_class(tmp_path_factory.mktemp("reviewed"))


def review(out: Path, *args: str):
    return run_cli(["review", str(out), *args], out.parent)


def csv_rows(out: Path, name: str) -> list[dict]:
    return [{unmarked(k): v for k, v in row.items()} for row in csv.DictReader(io.StringIO((out / name).read_text()))]


def everywhere(out: Path, student: str) -> dict:
    """The softmax points of a student at every place a grade is shown."""
    results = json.loads((out / "students" / student / "results.json").read_text())
    summary = json.loads((out / "summary.json").read_text())
    canvas = csv_rows(out, "canvas.csv")[1:]  # the Points Possible row first
    return {
        "results.json": results["score"],
        "summary.json": next(s for s in summary["students"] if s["student"] == student)["assignments"]["softmax"]["score"],
        "grades.csv": float(next(r for r in csv_rows(out, "grades.csv") if r["student"] == student)["softmax"]),
        "classroom.csv": float(next(r for r in csv_rows(out, "classroom.csv") if r["roster_identifier"] == student)["points_awarded"]),
        "gradescope.csv": float(next(r for r in csv_rows(out, "gradescope.csv") if r["SID"] == student)["softmax"]),
        "canvas.csv": float(next(r for r in canvas if r["SIS Login ID"] == student)["softmax"]),
    }


def same_everywhere(out: Path, student: str, points: float) -> None:
    found = everywhere(out, student)
    assert found == dict.fromkeys(found, points), found


@pytest.mark.slow
def test_clear_uphold_points_resume_and_a_regrade_at_a_new_commit(tmp_path):
    out = graded_class(tmp_path)
    same_everywhere(out, "carol", 0)
    listed = review(out, "--list")
    assert listed.returncode == 0 and "Flags awaiting review (1 of 1)" in listed.stdout, listed.stdout + listed.stderr
    assert "carol/softmax: conclusive uses its own Triton kernel" in listed.stdout
    assert "evidence: " + str(out / "students/carol/report.html#softmax") in listed.stdout

    cleared = review(out, "carol", "softmax", "--clear", "--note", "the kernel is Triton; the torch call is a test helper",
                     "--by", "ta-ann")
    assert cleared.returncode == 0, cleared.stdout + cleared.stderr
    assert "carol/softmax: flag cleared by ta-ann: 8 / 20 points (the grader's verdict: 0)" in cleared.stdout
    same_everywhere(out, "carol", 8)
    results = json.loads((out / "students/carol/results.json").read_text())
    kept = results["extra_data"]["assignments"]["softmax"]
    assert kept["verdict_score"] == 0 and kept["review"]["decision"] == "clear" and kept["review"]["by"] == "ta-ann"
    assert [t["outcome"] for t in results["tests"] if t["outcome"] == "flagged"] == ["flagged"]  # the verdict is kept beside it
    report = (out / "students/carol/report.html").read_text()
    assert "8 / 20 points" in report and "Reviewed by ta-ann" in report and "the torch call is a test helper" in report
    dashboard = (out / "index.html").read_text()
    assert "Integrity flags awaiting review (0 of 1)" in dashboard and "Reviews done (1)" in dashboard
    summary = json.loads((out / "summary.json").read_text())
    assert summary["reviews"]["awaiting"] == [] and summary["reviews"]["done"][0]["decided"] == 8
    line = json.loads((out / "reviews.jsonl").read_text().splitlines()[0])
    record = json.loads((out / "students/carol/jobs/softmax.json").read_text())
    assert line["record"]["key"] == record["key"] and line["by"] == "ta-ann" and line["verdict"]["score"] == 0
    assert not record["result"].get("review")  # the job's record is never changed

    upheld = review(out, "carol", "softmax", "--uphold", "--note", "on a second look, torch computes it")
    assert upheld.returncode == 0, upheld.stdout + upheld.stderr
    same_everywhere(out, "carol", 0)
    assert "reviewed: uphold" in (out / "index.html").read_text()
    assert json.loads((out / "summary.json").read_text())["reviews"]["awaiting"] == []  # upheld is reviewed

    pointed = review(out, "alice", "softmax", "--points", "7.5", "--note", "regrade request: partial credit agreed")
    assert pointed.returncode == 0, pointed.stdout + pointed.stderr
    same_everywhere(out, "alice", 7.5)
    assert len((out / "reviews.jsonl").read_text().splitlines()) == 3  # every review kept, in order

    resumed = run_cli(["grade", "--lock", "ws/lock.json", "--out", "out", "--resume", *QUICK], out.parent)
    assert resumed.returncode == 0 and "0 jobs graded" in resumed.stdout, resumed.stdout + resumed.stderr
    same_everywhere(out, "alice", 7.5)
    same_everywhere(out, "carol", 0)
    (out / "students/alice/results.json").unlink()  # a report lost: the next run rebuilds it with the review
    again = run_cli(["grade", "--lock", "ws/lock.json", "--out", "out", "--resume", *QUICK], out.parent)
    assert again.returncode == 0, again.stdout + again.stderr
    same_everywhere(out, "alice", 7.5)

    repo = out.parent / "repos" / "alice"
    (repo / "NOTES.md").write_text("a later commit\n")
    commit(repo, "a later commit", "2025-01-11T12:00:00+00:00")
    assert run_cli(["fetch", "--roster", "roster.csv", "--out", "ws"], out.parent).returncode == 1  # dan is still unfetched
    regraded = run_cli(["grade", "--lock", "ws/lock.json", "--out", "out", "--resume", *QUICK], out.parent)
    assert regraded.returncode == 0 and "1 jobs graded" in regraded.stdout, regraded.stdout + regraded.stderr
    same_everywhere(out, "alice", 8)  # the new verdict stands
    same_everywhere(out, "carol", 0)  # carol's commit did not change: her review stands
    summary = json.loads((out / "summary.json").read_text())
    stale = summary["reviews"]["stale"]
    assert [(s["student"], s["decision"]) for s in stale] == [("alice", "points")] and "commit" in stale[0]["why_stale"]
    cells = {s["student"]: s["assignments"]["softmax"] for s in summary["students"]}
    assert "commit" in cells["alice"]["stale_review"] and not cells["alice"]["review"] and cells["carol"]["review"]
    dashboard = (out / "index.html").read_text()
    assert "Stale reviews (1)" in dashboard and "the new verdict stands" in dashboard
    assert "no longer applies" in (out / "students/alice/report.html").read_text()
    listed = review(out, "--list")
    assert "Stale reviews (1)" in listed.stdout and "alice/softmax: points by" in listed.stdout, listed.stdout


@pytest.mark.slow
@pytest.mark.parametrize("args, message", [
    (["zoe", "softmax", "--clear", "--note", "x"], "no student 'zoe'"),
    (["carol", "vector_add", "--clear", "--note", "x"], "'vector_add': not graded in this class folder"),
    (["carol", "nonesuch", "--clear", "--note", "x"], "'nonesuch': no such assignment"),
    (["dan", "softmax", "--points", "1", "--note", "x"], "dan has no graded record of softmax (no record)"),
    (["alice", "softmax", "--points", "21", "--note", "x"], "--points must be between 0 and 20"),
    (["alice", "softmax", "--points", "-1", "--note", "x"], "--points must be between 0 and 20"),
    (["alice", "softmax", "--points", "nan", "--note", "x"], "--points must be between 0 and 20"),
    (["alice", "softmax", "--clear", "--note", "x"], "alice's softmax has no integrity flag to clear"),
    (["carol", "softmax", "--clear"], "--note is required"),
    (["carol", "softmax", "--clear", "--note", "  "], "--note is required"),
    (["carol", "softmax", "--clear", "--note", "x" * 2001], "--note is 2001 characters"),
    (["carol", "softmax", "--clear", "--note", "x", "--by", " "], "--by: the reviewer's name is empty"),
    (["carol", "softmax", "--clear", "--uphold", "--note", "x"], "give one decision"),
    (["carol", "softmax", "--note", "x"], "give one decision"),
    (["carol", "--clear", "--note", "x"], "name the STUDENT and the ASSIGNMENT"),
    (["carol", "--list"], "--list takes only the class folder"),
])
def test_bad_input_is_refused_with_the_reason_and_changes_nothing(shared, args, message):
    before = {p: p.read_bytes() for p in [shared / "summary.json", shared / "grades.csv", *shared.glob("students/*/results.json")]}
    log = shared / "reviews.jsonl"
    logged = log.read_bytes() if log.exists() else None
    bad = review(shared, *args)
    assert bad.returncode == 2, bad.stdout + bad.stderr
    assert message in bad.stderr and len(bad.stderr.strip().splitlines()) == 1, bad.stderr
    assert (log.read_bytes() if log.exists() else None) == logged
    assert {p: p.read_bytes() for p in before} == before


def test_a_folder_that_is_no_graded_class_is_refused(tmp_path):
    bad = review(tmp_path / "out", "carol", "softmax", "--clear", "--note", "x")
    assert bad.returncode == 2 and "not a class folder graded by grader grade" in bad.stderr, bad.stderr


HOSTILE_NOTE = "=HYPERLINK(\"http://x\")\x1b]0;pwned\x07\x1b[2J<script>alert(1)</script>\n::error::forged [red]x[/red]"
HOSTILE_BY = "@SUM(1+1)<img src=x onerror=alert(2)>\x1b[31m"


@pytest.mark.slow
def test_hostile_text_in_a_note_or_name_is_inert_at_every_sink(shared):
    made = review(shared, "carol", "softmax", "--clear", "--note", HOSTILE_NOTE, "--by", HOSTILE_BY)
    assert made.returncode == 0, made.stdout + made.stderr
    listed = review(shared, "--list")
    for shown in (made.stdout + made.stderr, listed.stdout + listed.stderr):
        assert "\x1b" not in shown and "\x07" not in shown and "\\x1b" in shown  # the escapes shown, not run
        assert not any(line.lstrip().startswith("::") for line in shown.splitlines())
    assert "[red]x[/red]" in listed.stdout  # rich markup shown as text, not read
    for page in (shared / "index.html", shared / "students/carol/report.html"):
        html = page.read_text()
        assert "<script>alert" not in html and "<img src" not in html, page  # autoescaped: shown, never run
        assert "&lt;script&gt;alert(1)&lt;/script&gt;" in html and "&lt;img src=x onerror=alert(2)&gt;" in html, page
    for name in ("grades.csv", "classroom.csv", "gradescope.csv", "canvas.csv"):
        for row in csv.reader(io.StringIO((shared / name).read_text())):
            for cell in row:
                assert not cell.startswith(("=", "+", "-", "@", "\t", "\r")) or cell.lstrip("-").replace(".", "").isdigit(), (name, cell)
                assert "\x1b" not in cell, (name, cell)
    assert "@SUM" in (shared / "grades.csv").read_text()  # the name is there, inside the note cell
    results = json.loads((shared / "students/carol/results.json").read_text())
    assert results["extra_data"]["assignments"]["softmax"]["review"]["note"] == HOSTILE_NOTE  # kept exactly, as data
    assert "\x1b" not in results["output"] and "reviewed by @SUM(1+1)" in results["output"]  # what Gradescope shows, as text
    for test in results["tests"]:
        assert "\x1b" not in test["output"]


@pytest.mark.slow
def test_two_reviews_at_once_both_land(shared):
    env = dict(os.environ, PYTHONPATH=str(REPO_ROOT))
    args = [["carol", "softmax", "--uphold", "--note", "upheld at once"], ["alice", "softmax", "--points", "3", "--note", "set at once"]]
    before = (shared / "reviews.jsonl").read_text().splitlines() if (shared / "reviews.jsonl").exists() else []
    procs = [subprocess.Popen([sys.executable, "-m", "grader", "review", str(shared), *a], cwd=shared.parent, env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for a in args]
    for p in procs:
        assert p.wait(timeout=300) == 0, p.stdout.read()
    lines = (shared / "reviews.jsonl").read_text().splitlines()
    assert lines[:len(before)] == before and len(lines) == len(before) + 2
    assert {json.loads(line)["note"] for line in lines[len(before):]} == {"upheld at once", "set at once"}
    same_everywhere(shared, "carol", 0)
    same_everywhere(shared, "alice", 3)
    summary = json.loads((shared / "summary.json").read_text())
    assert {(r["student"], r["decision"]) for r in summary["reviews"]["done"]} == {("carol", "uphold"), ("alice", "points")}


def _job_record(**fields):
    from grader.batch.record import JobRecord

    return JobRecord(**{"student": "carol", "folder": "carol", "assignment": "softmax", "status": "graded", "error": "",
                        "key": {}, "attempt": "a", "commit": "c1", "repo": None, "seed": 1, "gpu": None, "environment": {},
                        "started": "t", "finished": "t", "seconds": 1.0, **fields})


def _record(tests, key=None):
    from grader.results import AssignmentResult

    return _job_record(key=key or {"commit": "c1", "spec": "s"},
                       result=AssignmentResult("softmax", "Softmax", "kernels/softmax.py", tests).to_json())


def _tests(severity: str = "conclusive"):
    """Two correctness tests passed and one failed, a timed test at 3/4 of its curve, and a finding."""
    from grader.results import TestResult

    finding = TestResult("softmax", "integrity", "torch op", "flagged", "aten ran", severity=severity,
                         details={"concerns": ["a"]} if severity == "review" else {})
    tests = [TestResult("softmax", "correctness", "a", "passed", max_score=4), TestResult("softmax", "correctness", "b", "passed", max_score=4),
             TestResult("softmax", "correctness", "c", "failed", max_score=4),
             TestResult("softmax", "performance", "perf", "passed", max_score=8, details={"score_fraction": 0.75}), finding]
    return tests


@pytest.mark.parametrize("severity, verdict", [("conclusive", 0), ("review", 10)])
def test_clearing_restores_what_the_finding_took_and_upholding_keeps_the_verdict(severity, verdict):
    from grader.judge.scoring import score_assignment
    from grader.batch import reviews
    from grader.results import AssignmentResult

    class Spec:
        correctness_points, performance_points = 12, 8

    result = AssignmentResult("softmax", "Softmax", "kernels/softmax.py", _tests(severity))
    score_assignment(Spec(), result)
    assert result.score == verdict
    record = _job_record(key={"commit": "c1"}, result=result.to_json())
    cleared = reviews.make("carol", "carol", "softmax", record, "clear", None, "why", "ta")
    upheld = reviews.make("carol", "carol", "softmax", record, "uphold", None, "why", "ta")
    assert (cleared.points, upheld.points) == (14, verdict)  # 4 + 4 + 0 + 6: what an honest kernel would have earned
    applied = AssignmentResult.from_json(record.result)
    assert reviews.apply(applied, cleared, record) == "applied"
    assert (applied.score, applied.verdict_score, applied.review["points"]) == (14, verdict, 14)
    later = replace(record, key={"commit": "c2"})
    stale = AssignmentResult.from_json(record.result)
    assert reviews.apply(stale, cleared, later) == "stale" and stale.score == verdict and not stale.review
    assert "no longer applies" in stale.notes[-1] and "commit" in reviews.what_changed(cleared, later)


def test_an_honest_grade_has_no_flag_to_clear_and_points_stay_in_range():
    from grader.batch import reviews
    from grader.results import TestResult

    honest = _record([TestResult("softmax", "correctness", "a", "passed", max_score=12, score=12)])
    for decision in ("clear", "uphold"):
        with pytest.raises(reviews.ReviewError, match="no integrity flag"):
            reviews.make("alice", "alice", "softmax", honest, decision, None, "why", "ta")
    for points in (-0.01, 12.01, float("nan"), float("inf")):
        with pytest.raises(reviews.ReviewError, match="between 0 and 12"):
            reviews.make("alice", "alice", "softmax", honest, "points", points, "why", "ta")
    assert reviews.make("alice", "alice", "softmax", honest, "points", 12, "why", "ta").points == 12
    with pytest.raises(reviews.ReviewError, match="no graded record"):
        reviews.make("alice", "alice", "softmax", replace(honest, status="infra_error"), "points", 1, "why", "ta")


def test_a_partial_run_is_no_grade_to_review():
    from grader.batch import reviews
    from grader.results import AssignmentResult

    record = _record(_tests("conclusive"))
    whole = AssignmentResult.from_json(record.result)
    whole.partial = {"cases_run": 1, "cases": 40, "assignment_points": 20}
    partial = replace(record, result=whole.to_json())
    for decision, points in (("clear", None), ("uphold", None), ("points", 1)):
        with pytest.raises(reviews.ReviewError, match="partial run .*1 of 40 cases.*grade the class without --case"):
            reviews.make("carol", "carol", "softmax", partial, decision, points, "why", "ta")
    assert reviews.make("carol", "carol", "softmax", record, "uphold", None, "why", "ta").decision == "uphold"


def test_the_log_is_appended_whole_and_a_crash_mid_write_loses_nothing(tmp_path):
    from grader.batch import reviews
    from grader.results import TestResult

    honest = _record([TestResult("softmax", "correctness", "a", "passed", max_score=12, score=12)])
    first = reviews.make("alice", "alice", "softmax", honest, "points", 5, "first", "ta")
    second = reviews.make("alice", "alice", "softmax", honest, "points", 6, "second", "ta")
    with reviews.locked(tmp_path):
        reviews.append(tmp_path, first)
    written = (tmp_path / reviews.LOG).read_bytes()
    (tmp_path / f".{reviews.LOG}.crashed").write_text('{"half": ')  # a writer killed before its rename
    with reviews.locked(tmp_path):
        reviews.append(tmp_path, second)
    assert (tmp_path / reviews.LOG).read_bytes().startswith(written)  # the earlier review, byte for byte
    log = reviews.read(tmp_path)
    assert [r.note for r in log.reviews] == ["first", "second"] and not log.problems
    assert log.latest("alice", "softmax").note == "second"
    with open(tmp_path / reviews.LOG, "a") as f:  # a hand edit that is no review
        f.write('{"torn": \n')
    with reviews.locked(tmp_path):
        reviews.append(tmp_path, first)
    log = reviews.read(tmp_path)
    assert [r.note for r in log.reviews] == ["first", "second", "first"]
    assert len(log.problems) == 1 and "line 3 is not a review" in log.problems[0]


def test_many_appends_at_once_lose_no_review(tmp_path):
    """Writers racing on the log (each its own open of the lock, as separate processes have): every review lands."""
    from concurrent.futures import ThreadPoolExecutor

    from grader.batch import reviews
    from grader.results import TestResult

    honest = _record([TestResult("softmax", "correctness", "a", "passed", max_score=12, score=12)])

    def one(i: int) -> None:
        with reviews.locked(tmp_path):
            reviews.append(tmp_path, reviews.make("alice", "alice", "softmax", honest, "points", i % 12, f"review {i}", "ta"))

    with ThreadPoolExecutor(8) as pool:
        list(pool.map(one, range(80)))
    assert sorted(r.note for r in reviews.read(tmp_path).reviews) == sorted(f"review {i}" for i in range(80))


def test_a_review_logged_before_a_crash_reaches_the_students_files_on_the_next_run(tmp_path):
    """Killed between the log's write and the student's files: the next batch's repair rewrites them from the log."""
    from grader.batch import reviews
    from grader.batch.store import repair_students, store_record
    from grader.results import TestResult

    record = replace(_record([TestResult("softmax", "correctness", "a", "passed", max_score=12, score=12)]),
                     student="alice", folder="alice", seed=3)
    store_record(tmp_path, record)
    results = tmp_path / "students/alice/results.json"
    assert json.loads(results.read_text())["score"] == 12
    with reviews.locked(tmp_path):
        reviews.append(tmp_path, reviews.make("alice", "alice", "softmax", record, "points", 5, "agreed", "ta"))
    os.utime(tmp_path / "students/alice/jobs/softmax.json", (1, 1))
    os.utime(results, (2, 2))  # the crash: the student's files newer than the record, older than the log
    repair_students(tmp_path, ["alice", "bob"])
    assert json.loads(results.read_text())["score"] == 5


def test_a_forged_line_in_the_log_is_skipped_and_said_never_applied(tmp_path):
    """The log is input (#47): a line appended by hand with points far above the assignment's is
    skipped and reported; one that also forges the maximum it was decided on still never reaches
    a result (the grade's own maximum bounds it); the TA's real review stands."""
    from grader.batch import reviews
    from grader.results import AssignmentResult, TestResult

    honest = _record([TestResult("softmax", "correctness", "a", "passed", max_score=12, score=12)])
    real = reviews.make("alice", "alice", "softmax", honest, "points", 5, "real", "ta")
    with reviews.locked(tmp_path):
        reviews.append(tmp_path, real)
    forged = {**real.to_json(), "points": 1e9, "note": "forged"}
    bad_types = [{**real.to_json(), "points": True}, {**real.to_json(), "note": ["x"]}, {**real.to_json(), "points": -1},
                 {**real.to_json(), "record": "x"}, [1, 2]]
    with open(tmp_path / reviews.LOG, "a") as f:
        for line in (forged, *bad_types):
            f.write(json.dumps(line) + "\n")
    log = reviews.read(tmp_path)
    assert [r.note for r in log.reviews] == ["real"], [r.note for r in log.reviews]
    assert len(log.problems) == 1 + len(bad_types) and "points 1000000000.0 are not within 0" in log.problems[0]
    high = reviews.Review(**{**forged, "verdict": {**forged["verdict"], "max_score": 1e9}})
    with open(tmp_path / reviews.LOG, "a") as f:
        f.write(json.dumps(high.to_json()) + "\n")
    log = reviews.read(tmp_path)
    assert log.latest("alice", "softmax").note == "forged"  # its own maximum claims 1e9
    result = AssignmentResult.from_json(honest.result)
    assert reviews.apply(result, log.latest("alice", "softmax"), honest) == ""
    assert result.score == 12 and not result.review and "outside 0 to 12: it is not applied" in result.notes[-1]


def test_a_log_that_is_a_link_or_a_fifo_is_not_read(tmp_path):
    from grader.batch import reviews

    (tmp_path / "elsewhere").write_text("")
    (tmp_path / reviews.LOG).symlink_to(tmp_path / "elsewhere")
    assert "could not be read" in reviews.read(tmp_path).problems[0]
    (tmp_path / reviews.LOG).unlink()
    os.mkfifo(tmp_path / reviews.LOG)
    assert "could not be read" in reviews.read(tmp_path).problems[0]  # at once, no hang
