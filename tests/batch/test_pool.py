"""The pool and the record store, with a stand-in job process (no grading, so it is quick):
a job process that dies or hangs costs only its job, an infra_error is retried and never
overwrites a real grade, and a stopped pool writes nothing for the jobs it stopped."""

from __future__ import annotations

import sys
import textwrap
import threading
import time
from dataclasses import replace
from pathlib import Path

import pytest

from tests.conftest import COURSE, REPO_ROOT
from grader.batch.executors import LocalExecutor, Scheduler
from grader.batch.jobs import Job, job_key, new_record, spec_fingerprint
from grader.batch.record import JobRecord
from grader.batch.store import failed_path, is_reusable, log_path, read_json, read_record, record_path, store_record
from grader.judge.context import GradingContext
from grader.results import AssignmentResult, TestResult
from grader.settings import Settings

# A job process stand-in: what it does depends on the student's name.
FAKE_JOB = textwrap.dedent(f"""
    import json, os, sys, time
    spec = json.loads(sys.stdin.read())
    print("job process for", spec["student"] + "/" + spec["assignment"], "argv", sys.argv[1:], flush=True)
    how = spec["student"].split("-")[0]
    if how == "dies":
        os._exit(3)
    if how == "hangs":
        time.sleep(600)
    from pathlib import Path
    sys.path.insert(0, {str(REPO_ROOT)!r})
    from grader.batch.jobs import Job, new_record  # storing a record imports torch: slow on a busy machine
    from grader.batch.store import store_record
    from grader.results import AssignmentResult, TestResult

    job = Job(**spec)
    if how == "broken" or (how == "flaky" and job.tries == 1):
        store_record(Path(job.out), new_record(job, "infra_error", "the reference kernel failed to load"))
        sys.exit(0)
    test = TestResult(job.assignment, "correctness", "n=1 [float32]", "passed", "", max_score=6.0, score=6.0)
    result = AssignmentResult(job.assignment, "Vector addition", "kernels/vector_add.py:vector_add()", [test])
    store_record(Path(job.out), new_record(job, "graded", result=result, environment={{"mode": "cpu-interpreter"}}))
""")
HANG_LIMIT = 5.0  # the time limit of the jobs that hang; the others get one that no busy machine reaches
OTHER_LIMIT = 300.0


def make_job(out: Path, student: str, assignment: str = "vector_add", commit: str = "c0ffee") -> Job:
    return Job(student, student, assignment, "", None, commit, {"commit": commit, "spec": "s", "grader": "g", "gpu_model": "cpu"},
               str(out), GradingContext("cpu", 1).to_json())


def graded(job: Job, score: float = 6.0) -> JobRecord:
    test = TestResult(job.assignment, "correctness", "n=1 [float32]", "passed" if score else "failed", "", max_score=6.0, score=score)
    return new_record(job, "graded", result=AssignmentResult(job.assignment, "Vector addition", "m", [test]))


@pytest.fixture
def fake_runner(tmp_path):
    script = tmp_path / "fake_job.py"
    script.write_text(FAKE_JOB)
    return [sys.executable, str(script)]


def run_pool(jobs, runner, slots=2, retries=1):
    events = []
    sched = Scheduler(jobs, retries, lambda kind, job, record: events.append((kind, job.student)))
    limit = lambda job: HANG_LIMIT if job.student.startswith("hangs") else OTHER_LIMIT  # noqa: E731
    LocalExecutor([None] * slots, job_timeout=limit, runner=runner, settings=Settings()).run(sched)
    return events


@pytest.mark.slow
def test_a_job_that_dies_or_hangs_costs_only_that_job(tmp_path, fake_runner):
    out = tmp_path / "out"
    names = ["ok-1", "dies-1", "hangs-1", "flaky-1", "ok-2"]
    start = time.monotonic()
    events = run_pool([make_job(out, n) for n in names], fake_runner)
    assert time.monotonic() - start < OTHER_LIMIT  # the hung job was not waited for (it sleeps 600 s)
    records = {n: read_json(record_path(out, n, "vector_add")) for n in names}
    for n in ("ok-1", "ok-2"):
        assert records[n]["status"] == "graded" and records[n]["result"]["tests"][0]["score"] == 6.0
    # flaky: an infra_error the first time, tried again, graded
    assert ("retry", "flaky-1") in events and records["flaky-1"]["status"] == "graded"
    assert not failed_path(out, "flaky-1", "vector_add").exists()
    # dies and hangs: infra_error after the retry, with the reason, never a score
    assert events.count(("retry", "dies-1")) == 1 and events.count(("retry", "hangs-1")) == 1
    assert records["dies-1"]["status"] == "infra_error" and records["dies-1"]["result"] is None
    assert "the grading job process died (exit status 3)" in records["dies-1"]["error"]
    assert "ran over its time limit (5 s) and was killed" in records["hangs-1"]["error"]
    # the student's folder says so too, and the log keeps both attempts
    report = (out / "students" / "dies-1" / "results.json").read_text()
    assert "infra_error" in report and "retried on the next --resume" in report
    log = log_path(out, "hangs-1", "vector_add").read_text()
    assert log.count("=== ") == 2 and "job process for hangs-1/vector_add" in log and "--job" in log


def test_infra_error_never_overwrites_a_real_grade(tmp_path, fake_runner):
    out = tmp_path / "out"
    job = make_job(out, "broken-1")
    store_record(out, graded(job, score=3.0))
    before = record_path(out, "broken-1", "vector_add").read_bytes()
    events = run_pool([make_job(out, "broken-1")], fake_runner, slots=1)
    assert events.count(("retry", "broken-1")) == 1
    assert record_path(out, "broken-1", "vector_add").read_bytes() == before  # the grade stands
    kept = read_json(failed_path(out, "broken-1", "vector_add"))
    assert kept["status"] == "infra_error" and "failed to load" in kept["error"]
    # a later real grade replaces the grade and clears the failed attempt
    store_record(out, graded(job, score=6.0))
    assert read_json(record_path(out, "broken-1", "vector_add"))["result"]["tests"][0]["score"] == 6.0
    assert not failed_path(out, "broken-1", "vector_add").exists()


def test_stopping_the_pool_writes_nothing_for_the_stopped_jobs(tmp_path, fake_runner):
    out = tmp_path / "out"
    jobs = [make_job(out, f"hangs-{i}") for i in range(3)]
    events = []
    sched = Scheduler(jobs, 1, lambda kind, job, record: events.append((kind, job.student)))
    pool = LocalExecutor([None, None], job_timeout=lambda job: 300, runner=fake_runner, settings=Settings())
    t = threading.Thread(target=pool.run, args=(sched,))
    t.start()
    deadline = time.monotonic() + 120
    while len(pool.running) < 2:  # both slots busy with a hanging job
        assert time.monotonic() < deadline, pool.running
        time.sleep(0.05)
    sched.stop()
    pool.stop()
    t.join(30)
    assert not t.is_alive()
    assert sorted(events) == sorted([("start", "hangs-0"), ("start", "hangs-1"), ("interrupted", "hangs-0"), ("interrupted", "hangs-1")])
    assert not list(out.glob("students/*/jobs/*.json"))  # interrupted is not a result: --resume runs them again


def test_resume_reuses_only_a_real_grade_with_the_same_key(tmp_path):
    out = tmp_path / "out"
    job = make_job(out, "alice")
    assert not is_reusable(None, job.key)
    store_record(out, graded(job))
    record = read_record(record_path(out, "alice", "vector_add"))
    assert is_reusable(record, job.key)
    for part, value in [("commit", "other"), ("spec", "changed"), ("grader", "0.2"), ("gpu_model", "NVIDIA H100")]:
        assert not is_reusable(record, dict(job.key, **{part: value})), part
    assert not is_reusable(replace(record, status="infra_error"), job.key)


def test_key_follows_the_spec_and_reference_files(tmp_path, monkeypatch):
    from grader import spec as specs

    real = COURSE.get("vector_add")
    folder = tmp_path / "vector_add"
    folder.mkdir()
    (folder / "spec.py").write_text((Path(real.folder) / "spec.py").read_text())
    ctx = GradingContext("cpu", 1, reference_dir=str(tmp_path / "reference"))  # grader grade --reference-dir

    class Spec:
        name = "vector_add"
        reference_module = real.reference_module
        shapes_secret = None  # its course has no secret

    Spec.folder = folder
    spec = Spec()
    reference = ctx.reference_module(spec)
    assert reference == tmp_path / "reference" / "vector_add.py"
    first = spec_fingerprint(spec, reference)
    (tmp_path / "reference").mkdir()
    (tmp_path / "reference" / "vector_add.py").write_text("# the instructor's kernel\n")
    second = spec_fingerprint(spec, reference)
    (folder / "spec.py").write_text((folder / "spec.py").read_text() + "\n# points changed\n")
    third = spec_fingerprint(spec, reference)
    assert len({first, second, third}) == 3
    key = job_key("abc", spec, "cpu-interpreter", ctx)
    assert key["spec"] == third and key["commit"] == "abc" and key["gpu_model"] == "cpu-interpreter"
    assert key["options"] == ctx.key() and key["options"]["seed"] == 1


def test_reports_behind_their_records_are_rewritten(tmp_path):
    from grader.batch.store import repair_students

    out = tmp_path / "out"
    store_record(out, graded(make_job(out, "alice")))
    report = out / "students" / "alice" / "results.json"
    report.unlink()  # as if the job process died between its record and its reports
    repair_students(out, ["alice", "nobody"])
    assert '"score": 6.0' in report.read_text()
