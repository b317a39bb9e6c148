"""A CI check the runner stopped, not the student's code (grader.kit.stops), on each CI path's
first screen: the kit's workflow steps as written (its sysctl step failing as a runner without
sudo fails it, its check step then stopping), Classmoji's command grader (`--ci classmoji`, the
environment stripped to what it passes), and a plain CI job found by the runner's work folder
alone. Namespaces are refused as the other weaker-sandbox tests refuse them: a PATH without
`unshare` (tests/kit/test_classroom50.apparmor_runner, which also stands in for sudo and sysctl)."""

from __future__ import annotations

import io
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from rich.console import Console

from grader.kit import stops
from grader.sandbox.isolation import SandboxError
from tests.conftest import REPO_ROOT, build_submission
from tests.kit.test_classroom50 import USERNS, apparmor_runner, commands_read

TITLE = "The runner stopped this check (not your code)"
FAULT = "The runner, not your code, stopped this check"
QUICK = ["-a", "vector_add", "--case", "n=1", "--dtype", "float32", "--device", "cpu"]
# what classroom-resources' autograding-command-grader hands a command: nothing of CI
CLASSMOJI_KEEPS = ("PATH", "HOME")


def _shim(folder: Path) -> None:
    """`grader` on the PATH: this checkout's (the one installed system-wide imports another)."""
    (folder / "grader").unlink(missing_ok=True)
    (folder / "grader").write_text(f"#!/bin/sh\nexec {sys.executable} -m grader \"$@\"\n")
    (folder / "grader").chmod(0o755)


def _errors(text: str) -> list[tuple[str, str]]:
    """(title, message) of each `::error` the runner reads in `text` (none inside a stop-commands block)."""
    found = []
    for line in commands_read(text):
        if line.startswith("::error title="):
            title, message = line[len("::error title="):].split("::", 1)
            found.append((title, message))
    return found


def test_every_platforms_words_put_whose_fault_it_is_first_and_the_fix_before_the_finding():
    error = SandboxError("the sandbox isolation cannot be built as asked on this machine: " + "x" * 2000)
    for platform in ("github", "classmoji", "ci"):
        message = stops.annotation(platform, error, 1000)
        assert message.startswith(FAULT) and len(message) <= 1000
        assert message.index("Course staff:") < message.index("Do not push again") < message.index("The grader found")
    assert "setup command" in stops.annotation("classmoji", error)
    assert stops.SYSCTL_LINE in stops.annotation("github", error) and "grader.yml" in stops.annotation("github", error)
    c50 = stops.classroom50_annotation(error)
    assert c50.startswith(FAULT) and len(c50) <= 300 and USERNS in c50 and "Do not push again" in c50
    assert stops.is_runner_stop(error) and not stops.is_runner_stop(ValueError("no assignment found"))


def test_the_kits_workflow_shows_why_the_sysctl_failed_and_its_check_says_whose_fault_the_stop_is(tmp_path):
    """The workflow's `run:` steps as written, on a hosted runner without passwordless sudo: the
    sysctl step prints sudo's reason and a warning and lets the job go on; the check stops (exit 2),
    its first screen an `::error` the runner reads whose first sentence says the runner stopped it,
    then the staff's workflow line, then that pushing again will not help; the job summary says the same."""
    from grader.kit.release import workflow

    steps = yaml.safe_load(workflow(None))["jobs"]["run-autograding-tests"]["steps"]
    lift = next(s["run"] for s in steps if USERNS in s.get("run", ""))
    check = next(s["run"] for s in steps if s.get("id") == "grader")
    assert "2>/dev/null" not in lift and "|| true" not in lift
    path, calls = apparmor_runner(tmp_path / "bin", sudo=False)
    _shim(tmp_path / "bin")
    repo = build_submission(tmp_path / "repo", "good")
    summary, output = tmp_path / "summary.md", tmp_path / "output"
    summary.write_text("")
    output.write_text("")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("GITHUB_", "CLASSROOM", "GRADER_COURSE"))}
    env.update(PATH=path, PYTHONPATH=str(REPO_ROOT), GITHUB_ACTIONS="true", CI="true", GITHUB_STEP_SUMMARY=str(summary),
               GITHUB_OUTPUT=str(output), GITHUB_WORKSPACE=str(repo), RUNNER_ENVIRONMENT="github-hosted",
               GRADER_CACHE_DIR=str(tmp_path / "cache"), COLUMNS="200")
    bash = ["bash", "--noprofile", "--norc", "-eo", "pipefail", "-c"]  # as Actions runs a `run:` step
    lifted = subprocess.run([*bash, lift], cwd=repo, env=env, capture_output=True, text=True, timeout=60)
    assert lifted.returncode == 0, lifted.stdout + lifted.stderr  # the job goes on
    assert "sudo: a password is required" in lifted.stderr  # sudo's reason shown, not thrown away
    assert lifted.stdout.startswith("::warning title=The grader's sandbox::"), lifted.stdout
    assert f"sudo -n sysctl -w {USERNS}=0" in calls.read_text()
    checked = subprocess.run([*bash, check.replace("--device cpu", " ".join(QUICK))], cwd=repo, env=env,
                             capture_output=True, text=True, timeout=600)
    assert checked.returncode == 2, checked.stdout + checked.stderr
    errors = _errors(checked.stdout)
    assert len(errors) == 1 and errors[0][0] == TITLE, checked.stdout
    message = errors[0][1]
    assert message.startswith(f"{FAULT}:"), message
    assert message.index(stops.SYSCTL_LINE) < message.index("Do not push again") < message.index("cannot be built")
    assert not _errors(checked.stderr)  # the terminal's own line is stopped: only ours is an annotation
    text = summary.read_text()
    assert text.startswith("## Triton kernels: the runner stopped this check, not your code\n"), text
    assert text.index("Do not push again") < text.index("What the grader found") and "Push again" not in text
    assert output.read_text().startswith("result=")  # the error payload for a step of the course's own


def _classmoji_env(tmp_path: Path) -> dict:
    path, _ = apparmor_runner(tmp_path / "bin", sudo=True)
    _shim(tmp_path / "bin")
    (tmp_path / "home").mkdir(exist_ok=True)
    env = {k: os.environ[k] for k in CLASSMOJI_KEEPS if k in os.environ}
    env.update(PATH=path, HOME=str(tmp_path / "home"), FORCE_COLOR="true", DOTNET_CLI_HOME="/tmp", DOTNET_NOLOGO="true",
               PYTHONPATH=str(REPO_ROOT))  # PYTHONPATH: this checkout stands for the recipe's venv
    return env


@pytest.mark.parametrize("how", ["--ci classmoji", "the runner's work folder"])
def test_a_ci_job_whose_platform_strips_the_environment_still_refuses_a_weaker_sandbox(tmp_path, how):
    """Classmoji's command grader passes PATH, HOME, FORCE_COLOR and a few more: no CI, no
    GITHUB_ACTIONS. The check still knows it is in CI, by the recipe's `--ci classmoji`, or, with
    `--ci none`, by the runner's work folder around its checkout (<work>/<repo>/<repo> beside
    <work>/_temp), and stops as `--ci github` does, an annotation first saying whose fault it is."""
    env = _classmoji_env(tmp_path)
    if how == "--ci classmoji":
        repo, ci = build_submission(tmp_path / "repo", "good"), "classmoji"
    else:
        (tmp_path / "work" / "_temp").mkdir(parents=True)
        repo, ci = build_submission(tmp_path / "work" / "kernels-alice" / "kernels-alice", "good"), "none"
    proc = subprocess.run(["grader", "check", *QUICK, "--ci", ci], cwd=repo, env=env, capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "cannot be built as asked" in proc.stderr and "Weaker sandbox" not in proc.stdout
    errors = _errors(proc.stdout)
    assert len(errors) == 1 and errors[0][0] == TITLE and errors[0][1].startswith(f"{FAULT}:"), proc.stdout
    fix = "Classmoji test's setup command" if ci == "classmoji" else "before `grader check`, run"
    assert fix in errors[0][1] and stops.SYSCTL_LINE in errors[0][1], errors
    assert not (repo / ".grader" / "results.json").exists()  # nothing graded, nothing that looks graded


def test_a_working_folder_inside_a_runners_work_folder_is_ci(tmp_path):
    from grader.settings import from_environment, on_actions_runner

    checkout = tmp_path / "work" / "kernels" / "kernels"
    checkout.mkdir(parents=True)
    assert not on_actions_runner(checkout)  # no _temp: a folder that happens to be called work
    (tmp_path / "work" / "_temp").mkdir()
    (checkout / "sub").mkdir()
    assert on_actions_runner(checkout) and on_actions_runner(checkout / "sub")
    assert not on_actions_runner(tmp_path)
    here = os.getcwd()
    os.chdir(checkout)
    try:
        settings = from_environment({})  # no variable of CI's at all
    finally:
        os.chdir(here)
    assert settings.in_ci and settings.warm.keep_seconds == 0


def test_every_ci_mode_keeps_nothing_warm():
    from grader.cli.check import CheckOptions
    from grader.settings import from_environment

    settings = from_environment({"GRADER_WARM_SECONDS": "600"})
    assert not settings.in_ci and settings.warm.keep_seconds == 600 and settings.warm.resident
    for ci in ("classroom50", "github", "classmoji"):
        options = CheckOptions.parse(Path("."), None, None, None, "cpu", None, None, None, None, "sandbox", None, ci)
        assert options.in_ci(settings), ci
        kept = settings.for_ci()
        assert kept.in_ci and kept.warm.keep_seconds == 0 and not kept.warm.resident
    plain = CheckOptions.parse(Path("."), None, None, None, "cpu", None, None, None, None, "sandbox", None, "none")
    assert not plain.in_ci(settings) and plain.in_ci(settings.for_ci())


def test_force_color_draws_no_live_bar_where_the_log_is_not_a_terminal(monkeypatch):
    """FORCE_COLOR (Classmoji's command grader sets it) makes rich take a file for a terminal: the
    progress stays plain lines there, no redraws or cursor codes."""
    from grader.cli import check, common

    log = io.StringIO()
    forced = Console(file=log, force_terminal=True, highlight=False)
    assert forced.is_terminal and not common.is_terminal(forced)
    monkeypatch.setattr(check, "console", forced)
    monkeypatch.setattr(check, "PIPED_PROGRESS_EVERY", 0.0)
    with check._progress(3) as step:
        for i in range(3):
            step(f"case {i}")
    text = log.getvalue()
    assert "[0/3] starting the workers" in text and "case 2" in text
    assert "\x1b[?25l" not in text and "\r" not in text, repr(text)  # no hidden cursor, no line redrawn


@pytest.mark.slow
def test_a_classmoji_check_leaves_no_warm_process_behind(tmp_path):
    """A graded check under Classmoji's environment: even with GRADER_WARM_SECONDS asking for ten
    minutes, `--ci classmoji` keeps no zygote or judge past the command (a student's own check
    does, and says so)."""
    from tests.conftest import leftovers

    env = _classmoji_env(tmp_path)
    env.update(PATH=os.environ["PATH"], GRADER_WARM_SECONDS="600", GRADER_CACHE_DIR=str(tmp_path / "cache"),
               COLUMNS="200")  # namespaces as this machine allows them: it grades
    repo = build_submission(tmp_path / "repo", "good")
    args = [sys.executable, "-m", "grader", "check", *QUICK, "--isolation", "none"]
    try:
        ci = subprocess.run([*args, "--ci", "classmoji"], cwd=repo, env=env, capture_output=True, text=True,
                            timeout=600)
        assert ci.returncode == 0, ci.stdout + ci.stderr
        assert "warm" not in ci.stdout and not leftovers(within=tmp_path / "cache"), ci.stdout
        own = subprocess.run(args, cwd=repo, env=env, capture_output=True, text=True, timeout=600)
        assert own.returncode == 0, own.stdout + own.stderr
        assert "a warm worker start" in own.stdout  # the control: the same check off CI keeps one
    finally:
        for line in leftovers(within=tmp_path / "cache"):  # the control's, ended by its id
            os.kill(int(line.split(":", 1)[0]), 9)


@pytest.mark.parametrize("ci", ["github", "classroom50"])
def test_a_course_error_in_ci_writes_the_assignments_stop_where_the_runner_keeps_it(tmp_path, ci):
    """A spec that raises while grading, in a CI check: its one line and exit 2 as anywhere, and
    the stop the CI sinks write for a runner's stop, in the assignment's words: an `::error` the
    runner reads (the assignment's fault, the staff's fix, not to push again), the job summary
    naming the spec's file and line, the error payload; no result.json for Classroom 50 (no score)."""
    from tests.coursebuild import broken_course
    from tests.kit.test_classroom50 import outputs, runner_env

    course = broken_course(tmp_path / "course")
    repo = build_submission(tmp_path / "repo", "good")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("GITHUB_", "CLASSROOM", "GRADER_COURSE"))}
    env.update(runner_env(tmp_path), CI="true", GITHUB_WORKSPACE=str(repo), PYTHONPATH=str(REPO_ROOT), COLUMNS="200",
               GRADER_CACHE_DIR=str(tmp_path / "cache"))
    argv = [sys.executable, "-m", "grader", "--course", str(course), "check", str(repo), "--ci", ci, "-a",
            "fails_truth", "--case", "n=1", "--dtype", "float32", "--device", "cpu",
            "--json", str(tmp_path / "out" / "results.json"), "--html", str(tmp_path / "out")]
    run = subprocess.run(argv, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    where = "assignments/fails_truth/spec.py:18"
    assert run.returncode == 2, run.stdout + run.stderr
    assert f"{where}: truth() raised AssertionError: too short on case n=1 [float32]: the assignment is broken" \
        in run.stderr, run.stderr
    assert "Traceback" not in run.stderr
    errors = _errors(run.stdout)
    assert len(errors) == 1 and errors[0][0] == stops.COURSE_TITLE, run.stdout
    message = errors[0][1]
    assert message.startswith("The assignment is broken, not your code"), message
    assert where in message and "Do not push again" in message and "runner" not in message, message
    assert not _errors(run.stderr)  # the terminal's own line is stopped: only ours is an annotation
    import html

    summary = html.unescape(Path(env["GITHUB_STEP_SUMMARY"]).read_text())  # the finding's text, as a page shows it
    assert summary.startswith("## Triton kernels: the assignment is broken, not your code\n"), summary
    assert where in summary and summary.index("Do not push again") < summary.index("What the grader found")
    assert "Push again" not in summary and "could not run" not in summary
    if ci == "classroom50":
        assert not (repo / "result.json").exists()  # no score released for the assignment's fault
        assert outputs(env)["status"] == "error" and "the assignment is broken" in outputs(env)["summary"]
    else:
        assert Path(env["GITHUB_OUTPUT"]).read_text().startswith("result=")


def test_a_course_errors_words_name_the_assignment_not_the_runner():
    from grader.spec import CourseCodeError

    error = CourseCodeError("assignments/relu/spec.py:12", "make_inputs", "n=1 [float32]", "KeyError: 'n'")
    assert stops.is_course_error(error) and stops.stops_every_push(error) and not stops.is_runner_stop(error)
    assert not stops.is_course_error(SandboxError("no namespaces")) and stops.stops_every_push(SandboxError("x"))
    for platform in ("github", "classmoji", "ci"):
        message = stops.annotation(platform, error, 1000)
        assert message.startswith(stops.COURSE_FAULT) and "sysctl" not in message
        assert message.index("Course staff:") < message.index("Do not push again") < message.index("spec.py:12")
    c50 = stops.classroom50_annotation(error)
    assert c50.startswith("The assignment is broken") and len(c50) <= 300 and "spec.py:12" in c50, c50
    assert stops.title(error) == stops.COURSE_TITLE and stops.title(SandboxError("x")) == stops.TITLE
