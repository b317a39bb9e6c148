"""CPU-side throughput of grading, as pytest-benchmark benchmarks (deselected by default).

    python -m pytest tests/bench -m bench --benchmark-autosave          # record a baseline
    python -m pytest tests/bench -m bench --benchmark-compare           # compare with the last one

- interpreter check time per assignment: a grading session's grade() on the correct submission with every
  default case, in Triton's CPU interpreter (what a student's `grader check` costs);
- the harness's own overhead per job: one tiny job (one call) through the job process of
  `grader grade`, beside the same call graded in-process and a bare worker start: the
  difference is what the pool adds to each job;
- a worker's start forked by the zygote against a fresh interpreter, and eight tiny jobs
  through one job server (what a warm pool slot costs per job);
- the class view: the dashboard and gradebooks of a 200-student class from records on disk.
"""

from __future__ import annotations

import sys

import pytest

from tests.conftest import SANDBOX, COURSE, build_submission
from grader.settings import Settings
from grader import spec as specs
from grader.judge.context import GradingContext
from grader.judge.session import open_session
from grader.settings import Settings
from grader.submission import open_submission
from grader.settings import Settings

pytestmark = pytest.mark.bench


@pytest.fixture(scope="module")
def good(tmp_path_factory):
    return open_submission(build_submission(tmp_path_factory.mktemp("bench") / "good", "good"))


@pytest.mark.parametrize("assignment", sorted(COURSE.catalogue()))
def test_interpreter_check_time_per_assignment(benchmark, good, assignment):
    spec = COURSE.get(assignment)
    opts = GradingContext("cpu", seed=1)

    def check():
        return open_session(opts, Settings()).grade(good, [spec]).assignments[0]

    result = benchmark.pedantic(check, rounds=1, iterations=1)
    assert result.score == result.max_score > 0
    benchmark.extra_info["checks"] = sum(t.outcome != "skipped" for t in result.tests)


def test_one_call_graded_in_process(benchmark, good):
    spec = COURSE.get("vector_add")
    opts = GradingContext("cpu", seed=1, cases=("n=1",), dtypes=("float32",))

    def check():
        return open_session(opts, Settings()).grade(good, [spec]).assignments[0]

    assert benchmark.pedantic(check, rounds=3, iterations=1).score == 6


def test_one_call_as_a_pool_job(benchmark, good, tmp_path):
    from grader.batch.executors import LocalExecutor, Scheduler
    from grader.batch.jobs import Job
    from grader.batch.store import read_json, record_path

    out = tmp_path / "out"

    def job():
        ctx = GradingContext("cpu", 1, cases=("n=1",), dtypes=("float32",))
        j = Job("alice", "alice", "vector_add", str(good.root), None, None, {}, str(out), ctx.to_json())
        LocalExecutor([None], settings=Settings()).run(Scheduler([j], 0, lambda *a: None))
        return read_json(record_path(out, "alice", "vector_add"))

    assert benchmark.pedantic(job, rounds=3, iterations=1)["status"] == "graded"


def test_bare_worker_start(benchmark, tmp_path):
    from grader.protocol import Load
    from grader.sandbox.process import WorkerProcess

    def start():
        w = WorkerProcess(tmp_path, tmp_path / "scratch", interpret=True, settings=Settings(), sandbox=SANDBOX)
        try:
            return w.request(Load({}), 60)
        finally:
            w.close()

    assert benchmark.pedantic(start, rounds=3, iterations=1).ok


@pytest.mark.parametrize("start", ["forked", "fresh"])
def test_worker_start_forked_or_fresh(benchmark, tmp_path, monkeypatch, start):
    """A sandboxed worker's start to its first answer: forked by the zygote (its imports done
    once per job process) against a fresh interpreter (GRADER_ZYGOTE=0, the previous way)."""
    from grader.sandbox import zygote
    from grader.protocol import Ok, Ping
    from grader.sandbox.process import WorkerProcess

    monkeypatch.setenv("GRADER_ZYGOTE", "1" if start == "forked" else "0")
    if start == "forked":  # the zygote's own start is paid once per job process: not in the rounds
        WorkerProcess(tmp_path / "warm", tmp_path / "warm-scratch", interpret=True, settings=Settings(), sandbox=SANDBOX).close()
    rounds = iter(range(100))

    def one():
        job = tmp_path / f"job{next(rounds)}"
        w = WorkerProcess(job / "repo", job / "scratch", interpret=True, settings=Settings(), sandbox=SANDBOX)
        try:
            assert isinstance(w.proc, zygote.Forked) == (start == "forked")
            return w.request(Ping(), 120)
        finally:
            w.close()

    assert benchmark.pedantic(one, rounds=5, iterations=1) == Ok()


def test_eight_tiny_jobs_through_one_job_server(benchmark, good, tmp_path):
    """Eight one-call jobs in one pool slot: the job server's per-job cost once it is warm
    (the first job pays for the interpreter, torch, the probe and the zygote)."""
    from grader.batch.executors import LocalExecutor, Scheduler
    from grader.batch.jobs import Job
    from grader.batch.store import read_json, record_path

    runs = iter(range(100))

    def batch():
        out = tmp_path / f"out{next(runs)}"
        ctx = GradingContext("cpu", 1, cases=("n=1",), dtypes=("float32",))
        jobs = [Job(f"s{i}", f"s{i}", "vector_add", str(good.root), None, None, {}, str(out), ctx.to_json()) for i in range(8)]
        LocalExecutor([None], settings=Settings()).run(Scheduler(jobs, 0, lambda *a: None))
        return [read_json(record_path(out, j.folder, "vector_add")) for j in jobs]

    records = benchmark.pedantic(batch, rounds=2, iterations=1)
    assert all(r["status"] == "graded" and r["result"]["tests"][0]["score"] > 0 for r in records)


def test_class_view_of_200_students(benchmark, tmp_path):
    from grader.batch.jobs import Job, new_record
    from grader.batch.store import store_record
    from grader.batch.classview import write_class_outputs
    from grader.results import AssignmentResult, TestResult
    from grader.batch.workspace import Lock, Pinned

    students = []
    for i in range(200):
        name = f"s{i:03d}"
        students.append(Pinned(name, f"https://example.edu/{name}", "fetched", commit="c" * 40, path=f"repos/{name}"))
        for a in ("vector_add", "softmax"):
            job = Job(name, name, a, "", None, "c" * 40, {}, str(tmp_path), GradingContext("cpu", 1).to_json())
            tests = [TestResult(a, "correctness", f"case{k} [float32]", "passed" if (i + k) % 7 else "failed", "", 1.0,
                                float(bool((i + k) % 7))) for k in range(20)]
            store_record(tmp_path, new_record(job, "graded", result=AssignmentResult(a, a, "m", tests)))
    lock = Lock(students, "now", root=tmp_path)
    view = benchmark.pedantic(lambda: write_class_outputs(tmp_path, lock, ["vector_add", "softmax"], catalogue=COURSE), rounds=3, iterations=1)
    assert len(view.rows) == 200 and (tmp_path / "index.html").stat().st_size > 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(pytest.main([__file__, "-m", "bench"]))
