"""plan_batch decides which stored grades a run keeps: only with --resume, and only a real
grade made the same way (commit, spec, grader, GPU model, and every option that changes what
is graded: device, cases, dtypes, call timeout, seed). Anything else is graded again."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from grader.batch import BatchOptions, new_record, plan_batch, store_record
from grader.results import AssignmentResult, TestResult
from grader.workspace import Lock, Pinned


@pytest.fixture
def lock(tmp_path, monkeypatch):
    """Two fetched students and one unfetched; their checkouts are not looked at here."""
    monkeypatch.setattr("grader.workspace.ensure_checkout", lambda lock, p: tmp_path / "repos" / p.student)
    students = [Pinned("alice", "a.git", "fetched", commit="a1"), Pinned("bob", "b.git", "fetched", commit="b1"),
                Pinned("carol", "c.git", "unfetched", reason="no such repo")]
    return Lock(students, created="2025-01-01T00:00:00+00:00", root=tmp_path)


def options(out: Path, **kw) -> BatchOptions:
    base = BatchOptions(out, ["vector_add"], "cpu", [None], "cpu-interpreter", seed=3, cases=["n=1"], dtypes=["float32"])
    return replace(base, **kw)


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
    {"device": "cuda", "gpu_model": "NVIDIA H100"}, {"seed": 4},
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
