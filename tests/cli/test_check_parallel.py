"""A check grades its assignments at once (`grader check --jobs`, by default one per core in the
interpreter): each in its own workers, with the same results, in the same order, as one after
another, a crash, a flag and a failure included."""

from __future__ import annotations

import shutil
import threading

import pytest

from tests.conftest import COURSE, FIXTURES, build_submission, run_cli
from tests.e2e.test_check_batch_agree import differences

from grader import spec as specs
from grader.cli.check import check_jobs
from grader.judge.context import GradingContext
from grader.judge.session import open_session
from grader.submission import open_submission
from grader.settings import Settings

ASSIGNMENTS = ["dropout", "softmax", "vector_add"]


@pytest.mark.slow
def test_assignments_graded_at_once_give_the_same_results_as_one_after_another(tmp_path):
    # vector_add ends its own process (a crash), softmax hands the work to torch (a flag),
    # dropout forgets to scale (failed)
    repo = build_submission(tmp_path / "repo", "os_exit")
    for fixture in ("torch_softmax", "dropout_no_scale"):
        shutil.copytree(FIXTURES / fixture, repo, dirs_exist_ok=True)
    sub = open_submission(repo)
    chosen = [COURSE.get(a) for a in ASSIGNMENTS]
    ctx = GradingContext("cpu", 5, dtypes=("float32",))
    threads: set[str] = set()

    def seen(_: str) -> None:
        threads.add(threading.current_thread().name)

    one_by_one = open_session(ctx, Settings()).grade(sub, chosen, jobs=1)
    phases: dict[str, float] = {}
    at_once = open_session(ctx, Settings()).grade(sub, chosen, seen, phases=phases, jobs=3)

    assert len({t for t in threads if t.startswith("assignment")}) == 3  # each assignment in a thread of its own
    assert [a.name for a in at_once.assignments] == ASSIGNMENTS  # the order asked for, whatever ended first
    outcomes = {t.outcome for t in at_once.tests}
    assert {"crashed", "flagged", "failed", "passed"} <= outcomes, outcomes
    a, b = one_by_one.to_gradescope(), at_once.to_gradescope()
    assert differences(a, b) == []  # field by field, durations aside
    assert phases["correctness_calls"] > 0 and "worker_start_and_import" in phases  # every assignment's stages added up


def test_how_many_assignments_a_check_grades_at_once(monkeypatch):
    from grader.cli import check

    assert check_jobs(3, "cuda", 9) == 3  # as asked
    assert check_jobs(None, "cuda", 9) == 1  # a GPU: one at a time unless asked
    assert check_jobs(None, "cpu", 1) == 1
    monkeypatch.setattr(check.os, "sched_getaffinity", lambda _: set(range(8)))
    monkeypatch.setattr(check, "available_memory", lambda: 64 << 30)
    assert check_jobs(None, "cpu", 9) == 8  # one per core
    assert check_jobs(None, "cpu", 3) == 3  # no more than there are assignments
    monkeypatch.setattr(check, "available_memory", lambda: 5 << 30)
    assert check_jobs(None, "cpu", 9) == 2  # no more than memory holds (2 GiB a worker)
    monkeypatch.setattr(check, "available_memory", lambda: 1 << 30)
    assert check_jobs(None, "cpu", 9) == 1
    assert check.available_memory() > 0


def test_jobs_below_one_is_a_usage_error(tmp_path):
    repo = build_submission(tmp_path / "repo", "good")
    run = run_cli(["check", ".", "--device", "cpu", "--jobs", "0", "-a", "vector_add"], repo)
    assert run.returncode == 2 and "--jobs must be 1 or more" in run.stderr, run.stderr
