"""The pool's job servers (`python -m grader.batch.jobs --serve`): one process per slot takes job after
job; a job that kills its server or hangs costs that job alone, and the next job gets a fresh one."""

import json
import os
import sys
import textwrap
import time
from pathlib import Path
from types import SimpleNamespace

from tests.conftest import REPO_ROOT, build_submission
from grader.batch.executors import LocalExecutor, Scheduler
from grader.batch.jobs import Job
from grader.batch.store import log_path, read_json, record_path
from grader.judge.context import GradingContext
from grader.settings import Settings

# a job server stand-in: one JSON job per line; what it does depends on the student's name
FAKE_SERVER = textwrap.dedent(f"""
    import json, os, sys, time
    sys.path.insert(0, {str(REPO_ROOT)!r})
    from pathlib import Path
    from grader.batch.jobs import Job, new_record
    from grader.batch.store import store_record
    from grader.results import AssignmentResult, TestResult
    for line in sys.stdin:
        job = Job(**json.loads(line))
        how = job.student.split("-")[0]
        if how == "dies":
            os._exit(3)
        if how == "hangs":
            time.sleep(600)
        test = TestResult(job.assignment, "correctness", "n=1 [float32]", "passed", "", max_score=6.0, score=6.0)
        result = AssignmentResult(job.assignment, "Vector addition", "m", [test])
        record = new_record(job, "graded", result=result)
        record.environment["server_pid"] = os.getpid()
        store_record(Path(job.out), record)
        print(json.dumps({{"done": job.attempt}}), flush=True)
""")


def make_job(out: Path, student: str, repo: str = "", assignment: str = "vector_add") -> Job:
    ctx = GradingContext("cpu", 1, ("n=1",), ("float32",), 30.0)
    return Job(student, student, assignment, repo, None, "c0ffee", {"commit": "c0ffee"}, str(out), ctx.to_json())


def run(jobs, server, slots=1, limit=lambda job: 300.0):
    events = []
    sched = Scheduler(jobs, 1, lambda kind, job, record: events.append((kind, job.student)))
    LocalExecutor([None] * slots, job_timeout=limit, server=server, settings=Settings()).run(sched)
    return events


def test_a_dying_or_hanging_job_costs_only_itself_and_the_next_gets_a_fresh_server(tmp_path):
    script = tmp_path / "fake_server.py"
    script.write_text(FAKE_SERVER)
    out = tmp_path / "out"
    names = ["ok-1", "ok-2", "dies-1", "ok-3", "hangs-1", "ok-4"]
    start = time.monotonic()
    events = run([make_job(out, n) for n in names], [sys.executable, str(script)],
                 limit=lambda job: 5.0 if job.student.startswith("hangs") else 300.0)
    assert time.monotonic() - start < 200  # the hung job was not waited for
    records = {n: read_json(record_path(out, n, "vector_add")) for n in names}
    assert all(records[n]["status"] == "graded" for n in ("ok-1", "ok-2", "ok-3", "ok-4"))
    assert "the grading job process died (exit status 3)" in records["dies-1"]["error"]
    assert "ran over its time limit (5 s) and was killed" in records["hangs-1"]["error"]
    assert events.count(("retry", "dies-1")) == 1 and events.count(("retry", "hangs-1")) == 1
    pids = [records[n]["environment"]["server_pid"] for n in ("ok-1", "ok-2", "ok-3", "ok-4")]
    assert pids[0] == pids[1]  # one server took both jobs
    assert pids[1] != pids[2] != pids[3]  # a new one after each death and each hang


def test_real_jobs_share_a_server_and_each_logs_to_its_own_file(tmp_path):
    repo = build_submission(tmp_path / "good", "good")
    out = tmp_path / "out"
    jobs = [make_job(out, "alice", str(repo)), make_job(out, "alice", str(repo), "softmax"), make_job(out, "bob", str(repo))]
    jobs[1].context = dict(jobs[1].context, cases=["1x1"])  # softmax has no n=1
    started = []
    pool = LocalExecutor([None], job_timeout=lambda job: 600.0, settings=Settings())
    original = pool._start_server
    pool._start_server = lambda job: started.append(job.student) or original(job)
    pool.run(Scheduler(jobs, 0, lambda *a: None))
    assert started == ["alice"]  # one job process for the three jobs
    for student, assignment, points in (("alice", "vector_add", 6), ("alice", "softmax", None), ("bob", "vector_add", 6)):
        record = read_json(record_path(out, student, assignment))
        assert record["status"] == "graded", record.get("error")
        result = record["result"]
        assert all(t["outcome"] in ("passed", "skipped") for t in result["tests"]), result["tests"]
        if points is not None:
            assert sum(t["score"] for t in result["tests"]) == points
        log = log_path(out, student, assignment).read_text()
        assert f"grading {student}/{assignment}" in log and f"{student}/{assignment}:" in log
        other = "bob" if student == "alice" else "alice"
        assert f"grading {other}/" not in log
        assert set(record["phase_seconds"]) >= {"before_grading", "worker_start_and_import", "correctness_calls"}
    assert (out / "students" / "alice" / "results.json").is_file() and (out / "students" / "bob" / "report.html").is_file()
    assert not json.loads((out / "students" / "alice" / "results.json").read_text()).get("error")


def test_several_slots_share_out_the_cores_to_their_jobs_and_workers(monkeypatch, tmp_path):
    """Each job process of a pool, and every worker it starts, gets its share of the cores:
    left alone, each one's torch and OpenMP pools take them all, and slots oversubscribe."""
    from grader.batch.executors import LocalExecutor, thread_share
    from grader.sandbox.launch import worker_env
    from grader.settings import from_environment

    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.setattr(os, "cpu_count", lambda: 16)
    unset = from_environment({})
    assert thread_share(1, unset) == {}  # one slot: every core, as before
    assert thread_share(4, unset) == {"GRADER_THREADS": "4", "OMP_NUM_THREADS": "4"}
    assert thread_share(32, unset)["GRADER_THREADS"] == "1"  # never none
    job = SimpleNamespace(device="cuda", gpu="0")
    assert LocalExecutor(["0", "0", "0", "0"], settings=unset)._env(job)["GRADER_THREADS"] == "4"
    assert "GRADER_THREADS" not in LocalExecutor(["0"], settings=unset)._env(job)
    assert "OMP_NUM_THREADS" not in worker_env(tmp_path, True, None, unset.threads)
    in_job = from_environment({"GRADER_THREADS": "4"})  # in the job process, as its slot set it
    env = worker_env(tmp_path, True, None, in_job.threads)
    assert env["OMP_NUM_THREADS"] == env["MKL_NUM_THREADS"] == "4" and "GRADER_THREADS" not in env
    assert thread_share(4, in_job) == {}  # the user's own value is kept
