"""The bounds check that GPU runs replay in the CPU interpreter (runs here: it never needs a GPU)."""

import pytest

from grader import spec as specs
from grader.judge.context import GradingContext
from grader.judge.grade import _bounds_check
from grader.judge.session import open_session
from grader.submission import open_submission
from grader.settings import Settings
from tests.conftest import COURSE


def _check(submission, tmp_path, fixture):
    sub = open_submission(submission(fixture))
    sub.private_copy(tmp_path / "work" / "repo")
    spec = COURSE.get("vector_add")
    return _bounds_check(open_session(GradingContext("cuda", seed=4), Settings()), spec, sub.target(spec), tmp_path / "work", 60)


@pytest.mark.slow
def test_missing_mask_fails_with_the_kernel_line(submission, tmp_path):
    result = _check(submission, tmp_path, "missing_mask")
    assert result.outcome == "failed" and "out-of-bounds load" in result.message
    assert 'kernels/vector_add.py", line 11, in add_kernel' in result.traceback
    assert "--device cpu" in result.reproducer


@pytest.mark.slow
def test_correct_kernel_passes_and_names_the_cases(submission, tmp_path):
    result = _check(submission, tmp_path, "good")
    assert result.outcome == "passed" and "n=127" in result.message and "strided-n=65537" in result.message


def test_the_replay_worker_sees_no_more_than_the_gpu_worker(submission, tmp_path, monkeypatch):
    """The interpreter replay's worker is contained like the GPU run's: the context's private
    folders and the folders beside the submission (other students) are hidden from it too."""
    from grader.judge import workers
    from grader.sandbox.isolation import SandboxError

    seen = []

    def spy(*args, **kwargs):  # records the worker's view, then refuses to start it
        seen.append([str(p) for p in kwargs["hide"]])
        raise SandboxError("not started in this test")

    monkeypatch.setattr(workers, "WorkerProcess", spy)
    sub = open_submission(submission("good"))
    sub.private_copy(tmp_path / "work" / "repo")
    spec = COURSE.get("vector_add")
    ctx = GradingContext("cuda", seed=4, hide=("/srv/course-references",))
    result = _bounds_check(open_session(ctx, Settings()), spec, sub.target(spec), tmp_path / "work", 60, hide=[sub.root.parent])
    assert result.outcome == "skipped" and "not started in this test" in result.message
    assert seen == [["/srv/course-references", str(sub.root.parent)]]


def test_the_bounds_check_runs_beside_the_correctness_calls_and_lands_in_its_place(monkeypatch):
    """On a GPU the bounds check starts once the module loads, in the interpreter beside the
    correctness calls, and its result is taken at its own stage, after theirs; a worker that
    could not be restarted (nothing loaded) leaves no bounds result, as before."""
    import threading
    import time
    from types import SimpleNamespace

    from grader.judge import grade

    started = threading.Event()

    def slow_bounds(*args):
        started.set()
        time.sleep(0.5)
        return "bounds result"

    monkeypatch.setattr(grade, "_start", lambda worker, spec: None)
    monkeypatch.setattr(grade, "_bounds_check", slow_bounds)
    for restarted in (True, False):
        started.clear()
        g = SimpleNamespace(runnable=[1], worker=object(), spec=SimpleNamespace(name="vector_add"),
                            ctx=SimpleNamespace(interpret=False), session=None, target=None, workdir=None,
                            call_timeout=1, neighbours=[], load_failure=None, bounds=None,
                            result=SimpleNamespace(tests=[]), step=lambda text: None)
        g.loaded = True
        began = time.monotonic()
        grade.load_module(g)
        assert started.wait(5) and time.monotonic() - began < 0.4, "it runs beside the next stage, not before it"
        g.result.tests.append("a correctness result")
        g.loaded = restarted
        grade.bounds_check(g)
        assert g.bounds is None and time.monotonic() - began >= 0.5
        assert g.result.tests == (["a correctness result", "bounds result"] if restarted else ["a correctness result"])
    g.ctx.interpret = True  # in the interpreter the calls themselves are checked: no bounds check
    grade.load_module(g)
    assert g.bounds is None


def _kept_session(tmp_path, seed: int):
    ctx = GradingContext("cuda", seed=seed).kept_between_checks(tmp_path / "kept", 1 << 30, seed_given=False,
                                                               own_uid=True, kernels_of="repo-identity")
    return open_session(ctx, Settings())


@pytest.mark.slow
def test_a_kept_check_of_an_unchanged_repository_reads_its_bounds_check_back(submission, tmp_path, monkeypatch):
    """Kept between checks (runcache.BoundsKeep): the second check of the same files, another
    seed given to the check, starts no interpreter worker and says the same; one changed byte,
    or a buggy kernel, is checked again, and a kept failure stays a failure."""
    from grader.judge import workers

    spec = COURSE.get("vector_add")
    sub = open_submission(submission("good"))
    sub.private_copy(tmp_path / "work" / "repo")
    first = _bounds_check(_kept_session(tmp_path, 4), spec, sub.target(spec), tmp_path / "work", 300)
    assert first.outcome == "passed", first.message
    started = []
    real = workers.WorkerProcess
    monkeypatch.setattr(workers, "WorkerProcess", lambda *a, **k: started.append(1) or real(*a, **k))
    again = _bounds_check(_kept_session(tmp_path, 5), spec, sub.target(spec), tmp_path / "work", 300)
    assert again.to_json() == first.to_json() and started == []
    kernel = tmp_path / "work" / "repo" / "kernels" / "vector_add.py"
    kernel.write_text(kernel.read_text() + "\n# changed\n")
    changed = _bounds_check(_kept_session(tmp_path, 4), spec, sub.target(spec), tmp_path / "work", 300)
    assert changed.outcome == "passed" and started, changed.message  # checked again
    bad = open_submission(submission("missing_mask"))
    bad.private_copy(tmp_path / "bad" / "repo")
    for _ in range(2):
        failed = _bounds_check(_kept_session(tmp_path, 4), spec, bad.target(spec), tmp_path / "bad", 300)
        assert failed.outcome == "failed" and "out-of-bounds load" in failed.message, failed.message
