"""plan_batch decides which stored grades a run keeps: only with --resume, and only a real
grade made the same way (commit, spec, grader, GPU model, and every option that changes what
is graded: device, cases, dtypes, call timeout, seed, isolation). Anything else is graded again."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from grader.batch.jobs import new_record
from grader.batch.run import BatchOptions, class_seed, plan_batch
from grader.batch.store import store_record
from grader.judge.context import GradingContext
from grader.results import AssignmentResult, TestResult
from grader.settings import Settings
from grader.batch.workspace import Lock, Pinned
from tests.conftest import COURSE


@pytest.fixture
def lock(tmp_path, monkeypatch):
    """Two fetched students and one unfetched; their checkouts are not looked at here."""
    students = [Pinned("alice", "a.git", "fetched", commit="a1", notes=["late by 2 commits"]),
                Pinned("bob", "b.git", "fetched", commit="b1"), Pinned("carol", "c.git", "unfetched", reason="no such repo")]
    lock = Lock(students, created="2025-01-01T00:00:00+00:00", root=tmp_path)

    def ensure(given, p):
        assert given is lock
        return tmp_path / "repos" / p.student

    monkeypatch.setattr("grader.batch.workspace.ensure_checkout", ensure)
    return lock


def options(out: Path, seed: int | None = 3, cases=("n=1",), dtypes=("float32",), timeout=None, device="cpu",
            isolation="sandbox", **kw) -> BatchOptions:
    """The batch's options as `grader grade` makes them: the context fixed first (the seed as the CLI picks it)."""
    ctx = GradingContext(device, class_seed(out, seed), tuple(cases) if cases else None, tuple(dtypes) if dtypes else None,
                         timeout, isolation=isolation)
    return replace(BatchOptions(out, ["vector_add"], ctx, [None], "cpu-interpreter", catalogue=COURSE,
                                settings=Settings()), **kw)


def grade_everyone(lock, opts: BatchOptions, status: str = "graded") -> None:
    """Store a record for every planned job, as the job processes would."""
    for job in plan_batch(lock, opts).jobs:
        test = TestResult(job.assignment, "correctness", "n=1 [float32]", "passed", "", max_score=6.0, score=6.0)
        result = AssignmentResult(job.assignment, "Vector addition", "m", [test]) if status == "graded" else None
        store_record(Path(opts.out), new_record(job, status, "" if result else "the grader failed", result=result))


def labels(jobs) -> list[str]:
    return sorted(j.label for j in jobs)


def test_everyone_fetched_is_planned_once_per_assignment(lock, tmp_path):
    plan = plan_batch(lock, options(tmp_path / "out", assignments=["vector_add", "softmax"]))
    assert labels(plan.jobs) == ["alice/softmax", "alice/vector_add", "bob/softmax", "bob/vector_add"]
    assert plan.reused == [] and plan.seed == 3


def test_a_stored_grade_is_kept_only_with_resume(lock, tmp_path):
    out = tmp_path / "out"
    grade_everyone(lock, options(out))
    again = plan_batch(lock, options(out))  # a plain `grader grade`: everything is graded again
    assert labels(again.jobs) == ["alice/vector_add", "bob/vector_add"] and again.reused == []
    resumed = plan_batch(lock, options(out, resume=True))
    assert resumed.jobs == [] and labels(resumed.reused) == ["alice/vector_add", "bob/vector_add"]


@pytest.mark.parametrize("change", [
    {"cases": ["n=127"]}, {"cases": None}, {"dtypes": ["float16"]}, {"dtypes": None}, {"timeout": 5.0},
    {"device": "cuda", "gpu_model": "NVIDIA H100"}, {"seed": 4}, {"isolation": "none"},
], ids=lambda c: ",".join(c))
def test_resume_regrades_what_was_graded_another_way(lock, tmp_path, change):
    out = tmp_path / "out"
    grade_everyone(lock, options(out))
    plan = plan_batch(lock, options(out, resume=True, **change))
    assert labels(plan.jobs) == ["alice/vector_add", "bob/vector_add"] and plan.reused == []


def test_resume_regrades_a_new_commit_and_a_failed_job_only(lock, tmp_path):
    out = tmp_path / "out"
    grade_everyone(lock, options(out))
    lock.students[0].commit = "a2"  # alice pushed again and was re-fetched
    plan = plan_batch(lock, options(out, resume=True))
    assert labels(plan.jobs) == ["alice/vector_add"] and labels(plan.reused) == ["bob/vector_add"]


def test_an_infra_error_is_never_kept(lock, tmp_path):
    out = tmp_path / "out"
    grade_everyone(lock, options(out), status="infra_error")
    plan = plan_batch(lock, options(out, resume=True))
    assert labels(plan.jobs) == ["alice/vector_add", "bob/vector_add"] and plan.reused == []


def test_only_names_the_students_to_grade(lock, tmp_path):
    out = tmp_path / "out"
    grade_everyone(lock, options(out))
    plan = plan_batch(lock, options(out, only=["bob"]))
    assert labels(plan.jobs) == ["bob/vector_add"] and plan.reused == []


def test_the_class_keeps_its_seed_unless_one_is_given(lock, tmp_path):
    import json

    out = tmp_path / "out"
    out.mkdir()
    (out / "batch.json").write_text(json.dumps({"seed": 77}))
    assert plan_batch(lock, options(out, seed=None)).seed == 77
    assert plan_batch(lock, options(out, seed=5)).seed == 5


def test_a_job_carries_what_it_is_graded_with_and_its_full_key(lock, tmp_path):
    import grader
    from grader import spec as specs
    from grader.batch.jobs import spec_fingerprint

    out = tmp_path / "out"
    plan = plan_batch(lock, options(out, timeout=7.0))
    job = next(j for j in plan.jobs if j.student == "alice")
    assert (job.folder, job.assignment, job.repo, job.repo_url, job.commit) == ("alice", "vector_add", str(tmp_path / "repos" / "alice"), "a.git", "a1")
    ctx = job.grading_context()
    assert (job.out, job.seed, job.device, ctx.cases, ctx.dtypes, ctx.call_timeout) == (str(out.resolve()), 3, "cpu", ("n=1",), ("float32",), 7.0)
    assert job.notes == ["late by 2 commits"] and job.notes is not lock.students[0].notes
    reference = COURSE.root / "reference" / "vector_add.py"
    assert job.key == {"commit": "a1", "spec": spec_fingerprint(COURSE.get("vector_add"), reference), "grader": grader.__version__,
                       "gpu_model": "cpu-interpreter",
                       "options": {"device": "cpu", "cases": ["n=1"], "dtypes": ["float32"], "timeout": 7.0, "seed": 3,
                                   "isolation": "sandbox"}}


def test_a_new_class_gets_a_random_seed_kept_for_later_runs(lock, tmp_path):
    seeds = {plan_batch(lock, options(tmp_path / f"out{i}", seed=None)).seed for i in range(20)}
    assert len(seeds) > 10 and all(0 <= s < 2**31 for s in seeds) and max(seeds) > 2**20  # a secret, not a small number


def test_a_damaged_checkout_is_not_graded_and_says_why(lock, tmp_path, monkeypatch):
    def ensure(lock, p):
        if p.student == "bob":
            raise OSError("not a git repository")
        return tmp_path / "repos" / p.student

    monkeypatch.setattr("grader.batch.workspace.ensure_checkout", ensure)
    out = tmp_path / "out"
    plan = plan_batch(lock, options(out))
    assert labels(plan.jobs) == ["alice/vector_add"]
    assert plan.broken == ["the checkout of bob in the workspace is missing or damaged (not a git repository): run grader fetch again"]
    from grader.batch.store import read_records

    record = read_records(out, "bob")["vector_add"]
    assert (record.status, record.error, record.student) == ("infra_error", plan.broken[0], "bob")


def test_read_records_skips_kept_failures_and_foreign_files(lock, tmp_path):
    from grader.batch.store import read_records, record_path

    out = tmp_path / "out"
    grade_everyone(lock, options(out, assignments=["vector_add", "softmax"]))
    jobs = record_path(out, "alice", "vector_add").parent
    (jobs / "vector_add.infra_error.json").write_text('{"format": 1, "assignment": "vector_add", "status": "infra_error"}')
    (jobs / ".partial.json").write_text('{"format": 1, "assignment": "partial"}')
    (jobs / "old.json").write_text('{"format": 0, "assignment": "old"}')
    (jobs / "junk.json").write_text("not json")
    records = read_records(out, "alice")
    assert set(records) == {"softmax", "vector_add"} and records["vector_add"].status == "graded"
    assert read_records(out, "nobody") == {}


# --- the job record: the stored keys, checked on read ------------------------------------------

RECORD_KEYS = ["format", "student", "folder", "assignment", "status", "error", "key", "attempt", "commit", "repo", "seed",
               "gpu", "environment", "started", "finished", "seconds", "result"]  # as class folders have always held them


def test_a_record_is_stored_with_the_keys_it_always_had_and_reads_back_the_same(lock, tmp_path):
    import json

    from grader.batch.record import JobRecord
    from grader.batch.store import read_records, record_path

    out = tmp_path / "out"
    grade_everyone(lock, options(out))
    stored = json.loads(record_path(out, "alice", "vector_add").read_text())
    assert list(stored) == RECORD_KEYS and stored["status"] == "graded" and stored["result"]["tests"][0]["score"] == 6.0
    record = read_records(out, "alice")["vector_add"]
    assert record.to_json() == stored and JobRecord.from_json(stored) == record
    record.phase_seconds, record.node = {"correctness_calls": 1.5}, "node-7"  # a job's phases, a Ray node: added at the end
    assert list(record.to_json()) == [*RECORD_KEYS, "phase_seconds", "node"]
    assert JobRecord.from_json(record.to_json()) == record


@pytest.mark.parametrize("change, words", [
    ({"status": "done"}, "'status' must be graded or infra_error, not 'done'"),
    ({"seed": "7"}, "'seed' must be int, not str"),
    ({"seed": True}, "'seed' must be int, not bool"),
    ({"key": None}, "'key' must be dict, not NoneType"),
    ({"result": ["not", "a", "result"]}, "'result' must be dict or null, not list"),
    ({"assignment": None}, "the record has no 'assignment'"),
])
def test_a_malformed_record_is_said_with_its_file_and_field_and_costs_only_its_student(lock, tmp_path, change, words):
    import json

    from grader.batch.classview import build_class_view
    from grader.batch.record import RecordError
    from grader.batch.store import read_records, record_path

    out = tmp_path / "out"
    grade_everyone(lock, options(out))
    path = record_path(out, "alice", "vector_add")
    data = dict(json.loads(path.read_text()), **change)
    if change.get("assignment", "") is None:
        del data["assignment"]
    path.write_text(json.dumps(data))
    with pytest.raises(RecordError) as caught:
        read_records(out, "alice")
    assert str(caught.value) == f"{path}: {words}"
    view = build_class_view(out, lock, ["vector_add"], catalogue=COURSE)
    rows = {r.student: r for r in view.rows}
    assert rows["alice"].problems == [f"records could not be read: RecordError: {path}: {words}"]
    assert rows["bob"].cells["vector_add"].status == "graded" and rows["bob"].cells["vector_add"].score == 6.0
    plan = plan_batch(lock, options(out, resume=True))
    assert labels(plan.jobs) == ["alice/vector_add"] and labels(plan.reused) == ["bob/vector_add"]  # graded again


def test_a_malformed_job_is_one_line_from_the_job_process_not_a_traceback(tmp_path):
    import json
    import subprocess
    import sys

    from tests.conftest import REPO_ROOT

    for job, words in [({"student": 1}, "the job's 'student' must be str, not int"), ({"bogus": 1}, "a job has no field 'bogus'"),
                       ({"student": "a"}, "the job has no 'folder'"), ("[]", "a job is a JSON object, not list"),
                       ("{", "Expecting property name")]:
        text = job if isinstance(job, str) else json.dumps(job)
        proc = subprocess.run([sys.executable, "-m", "grader.batch.jobs", "--job", "x", "--out", str(tmp_path)], input=text,
                              capture_output=True, text=True, cwd=REPO_ROOT, timeout=300)
        assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
        assert proc.stderr.startswith("grader.batch.jobs: the job on stdin cannot be read: ") and words in proc.stderr, proc.stderr


# --- kept records read back as input: hostile files in place of a record ------------------------

@pytest.mark.timeout(60)
@pytest.mark.parametrize("planted, words", [
    ("fifo", "vector_add.json is a FIFO, not a regular file"),
    ("link", "vector_add.json cannot be read: a symbolic link"),
    ("device", "vector_add.json cannot be read: a symbolic link"),
    ("large", "vector_add.json is larger than 67108864 bytes"),
])
def test_resume_reads_a_kept_record_bounded_never_through_a_link_nor_a_fifo(lock, tmp_path, planted, words):
    """A FIFO in place of alice's record stopped --resume until killed; a link to a graded record
    kept elsewhere (a planted grade) was kept as hers; /dev/zero and a huge file were read whole.
    Each is now one line for that job, which is graded again, and the rest of the class is kept."""
    import os

    from grader.batch.store import late_notes, read_records, record_path, student_dir

    out = tmp_path / "out"
    grade_everyone(lock, options(out))
    path = record_path(out, "alice", "vector_add")
    kept_elsewhere = tmp_path / "planted.json"
    path.rename(kept_elsewhere)
    if planted == "fifo":
        os.mkfifo(path)
    elif planted == "link":
        path.symlink_to(kept_elsewhere)
    elif planted == "device":
        path.symlink_to("/dev/zero")
    else:
        with open(path, "wb") as f:
            f.truncate((64 << 20) + 1)
    plan = plan_batch(lock, options(out, resume=True))
    assert labels(plan.jobs) == ["alice/vector_add"] and labels(plan.reused) == ["bob/vector_add"]
    assert plan.refused == [f"alice vector_add: the kept record is not used (jobs/{words}): graded again"]
    assert read_records(out, "alice") == {}  # not a record of hers: nothing shown from it
    grade_everyone(lock, options(out, resume=True))  # her job's new record replaces the planted file
    assert not path.is_symlink() and read_records(out, "alice")["vector_add"].status == "graded"
    assert kept_elsewhere.read_bytes()[:1] == b"{"  # the file a link led to: untouched
    notes = student_dir(out, "bob") / "late.json"
    os.mkfifo(notes)
    assert late_notes(notes.parent) == {}  # a FIFO as the late notes: none, no hang


def test_a_student_lock_that_is_a_link_or_a_fifo_is_refused_not_followed(lock, tmp_path):
    import os

    from grader.batch.store import student_dir
    from grader.results import FileLock

    out = tmp_path / "out"
    grade_everyone(lock, options(out))
    victim = tmp_path / "victim"
    victim.write_text("precious")
    lock_file = student_dir(out, "alice") / ".lock"
    lock_file.unlink()
    lock_file.symlink_to(victim)
    with pytest.raises(OSError, match="refused|symbolic link|Too many levels"):
        with FileLock(lock_file):
            pass
    assert victim.read_text() == "precious"
    lock_file.unlink()
    os.mkfifo(lock_file)
    with pytest.raises(OSError, match="not a plain file: refused as a lock"):
        with FileLock(lock_file):
            pass
