"""Isolation never weakens silently: where the sandbox can only be built weaker than asked (here:
no `unshare` on the PATH, so no namespaces), a batch and every `--ci` run stop with the reason and
the fix, unless `--isolation none` was asked for; `grader check` on a student's own machine falls
back, saying so first. As root and as an ordinary user (uid 65534).

And the cause of one such fallback: the sandbox's init decoded mount points with a codec, which
could not be imported once the view covered a Python installed under /tmp."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from tests.conftest import AS_NOBODY, COURSE, REPO_ROOT, build_submission
from tests.classbuild import make_class


def test_mount_points_are_unescaped_without_a_codec():
    """Run where no codec can be imported any more (as in the init once an interpreter under
    /tmp is covered): the unescaping still works."""
    code = ("import sys; sys.modules['encodings.unicode_escape'] = None\n"
            "from grader.sandbox.init import unescape_mount_point\n"
            "try:\n    b'x'.decode('unicode_escape')\nexcept LookupError:\n    pass\nelse:\n    raise SystemExit('codec still there')\n"
            "print(unescape_mount_point(r'/job/a\\040b\\011c\\134d\\012e'))")
    run = subprocess.run([sys.executable, "-c", code], cwd=REPO_ROOT, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    assert run.stdout == "/job/a b\tc\\d\ne\n"


def test_the_view_is_never_built_over_the_interpreter():
    from grader.sandbox.init import build_base

    assert build_base("/usr", "/usr/lib/python3.11") == "/tmp"
    assert build_base("/tmp/py", "/tmp/py/lib/python3.11") != "/tmp"
    assert not build_base("/tmp/py").startswith("/tmp")


# -- a machine where the sandbox can only be built weaker ------------------------------------------

def path_without_unshare(folder: Path) -> str:
    """A PATH with every command of this one but `unshare`."""
    folder.mkdir(parents=True, exist_ok=True)
    for d in os.environ.get("PATH", "/usr/bin:/bin").split(os.pathsep):
        if not os.path.isdir(d):
            continue
        for name in os.listdir(d):
            target = folder / name
            if name != "unshare" and not target.exists() and os.access(os.path.join(d, name), os.X_OK):
                target.symlink_to(os.path.join(d, name))
    os.chmod(folder, 0o755)
    return str(folder)


BASE_PYTHON = os.path.realpath(sys.executable)  # not a virtual environment's link: conftest.AS_NOBODY binds its prefix


def run(argv: list[str], cwd: Path, env: dict, nobody: bool) -> subprocess.CompletedProcess:
    if nobody:  # as uid 65534 (conftest.as_nobody), from the interpreter itself
        cmd = [BASE_PYTHON, "-c", AS_NOBODY.format(uid=65534, home=str(cwd), env=env), "-m", "grader", *argv]
    else:
        cmd = [sys.executable, "-m", "grader", *argv]
    return subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=600)


@pytest.mark.slow
@pytest.mark.parametrize("user", ["root", "nobody"])
def test_a_weaker_sandbox_stops_ci_and_a_batch_and_a_student_is_told_first(user):
    if user == "nobody" and os.geteuid() != 0:
        pytest.skip("not root: cannot switch to an ordinary user")
    base = Path(tempfile.mkdtemp(prefix="grader-weak-"))  # under /tmp: open to uid 65534
    base.chmod(0o755)
    try:
        _weaker(base, user == "nobody")
    finally:
        shutil.rmtree(base, ignore_errors=True)


def _weaker(base: Path, nobody: bool) -> None:
    repo = build_submission(base / "repo", "good")
    roster = make_class(base / "class", {"alice": "good"})
    summary, output = base / "summary.md", base / "output"
    for f in (summary, output):
        f.write_text("")
    # no CI of the machine running the tests: the student's own check below must be one
    env = {k: v for k, v in os.environ.items() if not k.startswith(("GITHUB_", "CLASSROOM")) and k != "CI"}
    env.update(PATH=path_without_unshare(base / "bin"), PYTHONPATH=str(REPO_ROOT), HOME=str(base / "home"),
               GRADER_CACHE_DIR=str(base / "cache"), GRADER_LOCK_DIR=str(base / "lock"), TMPDIR=str(base / "tmp"), COLUMNS="200",
               GRADER_COURSE_SECRET="a secret of this test's own")  # the course's file may be root's alone (grader release)
    for d in ("home", "cache", "lock", "tmp"):
        (base / d).mkdir()
    if nobody:
        subprocess.run(["chown", "-R", "65534:65534", str(base)], check=True)
    quick = ["-a", "vector_add", "--case", "n=1", "--device", "cpu", "--dtype", "float32"]
    ci = dict(env, GITHUB_ACTIONS="true", GITHUB_STEP_SUMMARY=str(summary), GITHUB_OUTPUT=str(output), GITHUB_WORKSPACE=str(repo))
    # CI: stops, with the reason and the fix, and the course's CI records that it could not run
    stopped = run(["check", str(repo), *quick, "--ci", "github"], repo, ci, nobody)
    assert stopped.returncode == 2, stopped.stdout + stopped.stderr
    said = " ".join((stopped.stdout + stopped.stderr).split())
    assert "the sandbox isolation cannot be built as asked on this machine" in said and "the unshare command is missing" in said
    assert "pass --isolation none to grade without a sandbox" in said
    assert output.read_text().startswith("result=") and "the runner stopped this check" in summary.read_text()
    # CI that asked for no isolation by name: runs
    asked = run(["check", str(repo), *quick, "--ci", "github", "--isolation", "none"], repo, ci, nobody)
    assert asked.returncode == 0, asked.stdout + asked.stderr
    # a student's own machine: falls back, and the first thing said is that it did
    own = run(["check", str(repo), *quick], repo, env, nobody)
    assert own.returncode == 0, own.stdout + own.stderr
    first = own.stderr.strip().splitlines()[0]
    assert first.startswith("warning: sandbox without namespaces (the unshare command is missing"), own.stderr
    # a batch: stops before it fetches or grades anyone
    batch = run(["grade", "--roster", str(roster), "--out", str(base / "out"), *quick], base / "class", env, nobody)
    assert batch.returncode == 2, batch.stdout + batch.stderr
    assert "cannot be built as asked" in batch.stderr and not (base / "out" / "students").exists()


# -- what a worker can read of the grader: no path on any command line it sees ----------------------

def peeked(message: str) -> list[str]:
    """The paths of the grader's a worker must not learn that appear in what it read (but the
    interpreter's own, which its view holds: a course's .venv may lie in the course folder)."""
    for own in (sys.executable, sys.prefix):
        message = message.replace(own, "")
    secrets = [str(REPO_ROOT), os.environ.get("GRADER_CACHE_DIR") or "", os.environ.get("GRADER_LOCK_DIR") or ""]
    return [s for s in secrets if s and s in message]


@pytest.mark.slow
@pytest.mark.parametrize("warm", [True, False], ids=["forked", "exec"])
def test_no_command_line_a_worker_reads_names_the_course_or_the_cache(tmp_path, warm, monkeypatch):
    from grader import spec as specs
    from grader.judge.context import GradingContext
    from grader.judge.session import open_session
    from grader.settings import from_environment
    from grader.submission import open_submission

    monkeypatch.setenv("GRADER_ZYGOTE", "1" if warm else "0")
    repo = build_submission(tmp_path / "peek", "hostile/peek")
    ctx = GradingContext("cpu", 1, ("n=1",), ("float32",), 30)
    run = open_session(ctx, from_environment()).grade(open_submission(repo), [COURSE.get("vector_add")])
    test = next(t for t in run.tests if t.name == "n=1 [float32]")
    assert test.outcome == "error" and "1: " in test.message, test.message
    # PID 1 is our init, or the fork of the zygote, whose command line is a fixed word (zygote.server._unnamed)
    assert ("grader-worker" if warm else "grader.sandbox.init") in test.message.split(" | ")[0], test.message
    assert peeked(test.message) == [], test.message


def test_the_kits_workflow_lets_the_sandbox_use_namespaces_before_the_check():
    """A CI check stops rather than grade without its sandbox, and GitHub's ubuntu-24.04 runners
    restrict unprivileged user namespaces: the kit's workflow lifts that first (sudo, where there is)."""
    import yaml

    from grader.kit.release import workflow

    for runner in (None, "gpu-a100"):
        steps = yaml.safe_load(workflow(runner))["jobs"]["run-autograding-tests"]["steps"]
        runs = [s.get("run", "") for s in steps]
        lift = next(i for i, r in enumerate(runs) if "kernel.apparmor_restrict_unprivileged_userns=0" in r)
        check = next(i for i, s in enumerate(steps) if s.get("id") == "grader")
        # it never fails the job, and never hides why it failed (tests/kit/test_stops.py runs it failing)
        assert lift < check and runs[lift].startswith("sudo -n ") and "|| echo \"::warning " in runs[lift]
        assert "2>/dev/null" not in runs[lift]
