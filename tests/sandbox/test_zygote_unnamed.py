"""47.7: a worker forked by the zygote reads nothing of the grader's under /proc: its PID 1 (the
fork itself in the namespace sandbox), its own command line and initial environment name
neither the interpreter, nor the checkout's tag, nor the zygote's home, nor the course or the
cache (grader.sandbox.zygote.server._unnamed). A hostile fixture reads every
/proc/*/cmdline and /proc/*/environ it can list and raises with them."""

from __future__ import annotations

import os
import sys

import pytest

from tests.conftest import COURSE, REPO_ROOT, build_submission


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the zygote and /proc are Linux's")
def test_a_forked_worker_reads_no_command_line_or_environment_of_the_grader(tmp_path, monkeypatch):
    from grader.judge.context import GradingContext
    from grader.judge.session import open_session
    from grader.sandbox.interpreter import CHECKOUT_TAG, PACKAGE_PARENT
    from grader.settings import from_environment
    from grader.submission import open_submission

    monkeypatch.setenv("GRADER_ZYGOTE", "1")
    repo = build_submission(tmp_path / "peek", "hostile/peek_proc")
    ctx = GradingContext("cpu", 1, ("n=1",), ("float32",), 30)
    run = open_session(ctx, from_environment()).grade(open_submission(repo), [COURSE.get("vector_add")])
    test = next(t for t in run.tests if t.name == "n=1 [float32]")
    seen = test.output + test.message
    assert test.outcome == "error" and "self cmdline: grader-worker" in seen, seen
    if os.geteuid() == 0:  # the namespace sandbox: PID 1 is the fork itself
        assert "1 cmdline: grader-worker" in seen, seen
    leaks = [CHECKOUT_TAG, sys.executable, os.path.realpath(sys.executable), PACKAGE_PARENT, str(REPO_ROOT),
             "grader-zygote-", "exec(sys.stdin", os.environ.get("GRADER_CACHE_DIR") or str(REPO_ROOT)]
    assert [s for s in leaks if s in seen] == [], seen
