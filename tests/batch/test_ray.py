"""--executor ray: the same jobs as Ray tasks, the student's code travelling with each task,
the records stored here in the same layout. A stand-in for Ray checks the executor's
bookkeeping (a lost task is retried, a stuck one cancelled); a local Ray instance runs a
real job through the CLI where Ray is installed."""

from __future__ import annotations

import importlib.util
import io
import json
import tarfile
import time

import pytest

from tests.classbuild import make_class
from tests.conftest import run_cli
from grader.batch.jobs import new_record
from grader.batch.store import log_path, read_json, record_path
from grader.batch.executors import RayExecutor, Scheduler, _unpack, pack_repo
from grader.results import AssignmentResult, TestResult
from grader.settings import Settings
from tests.batch.test_pool import make_job


def test_the_submission_travels_without_git_caches_or_outputs(tmp_path):
    repo = tmp_path / "repo"
    (repo / "kernels" / "__pycache__").mkdir(parents=True)
    (repo / ".git").mkdir()
    (repo / "kernels" / "vector_add.py").write_text("# kernel\n")
    (repo / "kernels" / "__pycache__" / "x.pyc").write_bytes(b"\0")
    (repo / ".git" / "config").write_text("[core]\n")
    (repo / "big.safetensors").write_bytes(b"\0" * 10)
    dest = tmp_path / "unpacked"
    _unpack(pack_repo(repo), dest)
    assert sorted(str(p.relative_to(dest)) for p in dest.rglob("*") if p.is_file()) == ["kernels/vector_add.py"]


def test_an_archive_escaping_its_folder_is_refused(tmp_path):
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        info = tarfile.TarInfo("../escaped.py")
        info.size = 1
        tar.addfile(info, io.BytesIO(b"x"))
    with pytest.raises(Exception):
        _unpack(buffer.getvalue(), tmp_path / "dest")
    assert not (tmp_path / "escaped.py").exists()


class Ref:
    def __init__(self, job: dict, attempt: int) -> None:
        self.job, self.attempt = job, attempt


class FakeRay:
    """Just enough of Ray's API: a task's fate is told by its student's name."""

    def __init__(self):
        self.initialized = False
        self.options_seen, self.codes, self.cancelled, self.calls = [], [], [], {}

    def is_initialized(self):
        return self.initialized

    def init(self, **kwargs):
        self.initialized = True
        self.init_kwargs = kwargs

    def remote(self, fn):
        ray = self

        class Task:
            def options(self, **kw):
                ray.options_seen.append(kw)
                return self

            def remote(self, job, code):
                ray.codes.append(code)
                ray.calls[job["student"]] = ray.calls.get(job["student"], 0) + 1
                return Ref(job, ray.calls[job["student"]])

        return Task()

    def wait(self, refs, num_returns=1, timeout=None):
        ready = [r for r in refs if not r.job["student"].startswith("stuck")]
        if not ready:
            time.sleep(timeout or 0)
        return ready[:num_returns], [r for r in refs if r not in ready[:num_returns]]

    def get(self, ref):
        job = ref.job
        if job["student"].startswith("lost") and ref.attempt == 1:
            raise RuntimeError("the node running this task died")
        from grader.batch.jobs import Job

        j = Job(**job)
        test = TestResult(j.assignment, "correctness", "n=1 [float32]", "passed", "", max_score=6.0, score=6.0)
        record = new_record(j, "graded", result=AssignmentResult(j.assignment, "Vector addition", "m", [test]))
        record.node = "node-7"
        return record.to_json(), "graded on node-7\n"

    def cancel(self, ref, force=False):
        self.cancelled.append(ref.job["student"])


def test_ray_executor_stores_records_retries_lost_tasks_and_cancels_stuck_ones(tmp_path):
    out = tmp_path / "out"
    repo = tmp_path / "repo"
    (repo / "kernels").mkdir(parents=True)
    (repo / "kernels" / "vector_add.py").write_text("# the student's kernel\n")
    jobs = [make_job(out, name) for name in ("ok-1", "lost-1", "stuck-1")]
    for job in jobs:
        job.repo = str(repo)
    events = []
    fake = FakeRay()
    sched = Scheduler(jobs, 1, lambda kind, job, record: events.append((kind, job.student)))
    RayExecutor(None, max_in_flight=2, job_timeout=lambda job: 0.5, ray_module=fake,
                settings=Settings()).run(sched)
    assert fake.initialized and fake.options_seen[0] == {"max_retries": 0, "num_cpus": 1}
    first = tarfile.open(fileobj=io.BytesIO(fake.codes[0]), mode="r:gz")
    assert first.getnames() == ["kernels/vector_add.py"]
    ok, lost, stuck = (read_json(record_path(out, n, "vector_add")) for n in ("ok-1", "lost-1", "stuck-1"))
    assert ok["status"] == "graded" and ok["node"] == "node-7"
    assert ("retry", "lost-1") in events and lost["status"] == "graded"  # retried after the node died
    assert stuck["status"] == "infra_error" and "ran over its time limit" in stuck["error"]
    assert fake.cancelled == ["stuck-1", "stuck-1"]
    assert "on Ray node node-7" in log_path(out, "ok-1", "vector_add").read_text()
    assert (out / "students" / "ok-1" / "report.html").is_file()


@pytest.mark.slow
@pytest.mark.skipif(importlib.util.find_spec("ray") is None, reason="Ray is not installed (pip install -e '.[ray]')")
def test_local_ray_instance_grades_into_the_same_layout(tmp_path):
    roster = make_class(tmp_path, {"alice": "good"})
    run = run_cli(["grade", "--roster", str(roster), "--out", "out", "--executor", "ray", "--device", "cpu", "--jobs", "1",
                   "-a", "vector_add", "--case", "n=1", "--dtype", "float32", "--seed", "9"], tmp_path)
    assert run.returncode == 0, run.stdout + run.stderr
    record = json.loads((tmp_path / "out" / "students" / "alice" / "jobs" / "vector_add.json").read_text())
    assert record["status"] == "graded" and record["node"] and record["result"]["tests"][0]["outcome"] == "passed"
    # the one case's share of the 10 points (a partial run), as grader check gives it
    assert "(ray, isolation sandbox)" in run.stdout and "alice/vector_add: 0.13 / 10, partial run" in run.stdout
    results = json.loads((tmp_path / "out" / "students" / "alice" / "results.json").read_text())
    assert results["score"] == 0.13 and results["extra_data"]["seed"] == 9 and results["extra_data"]["partial"] is True
    assert "on Ray node" in (tmp_path / "out" / "students" / "alice" / "logs" / "vector_add.log").read_text()
    assert (tmp_path / "out" / "grades.csv").read_text().splitlines()[1].startswith("alice,")
