"""`grader check` in stages: the options read once, `run_check(options) -> RunResult`, and the
outputs as sinks the CI mode chooses. A sink is told of the check in order; only the sinks write."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import build_submission, has_gpu
from grader.cli.check import CheckNotRun, CheckOptions, exit_code, run_check, sinks_for
from grader.cli.outputs import Classroom50Sink, GitHubSink, HtmlSink, JsonSink, RunnerStopSink, Sink, TerminalSink
from grader.results import Outcome
from grader.settings import from_environment
from grader.spec import Course

C50_ENV = {"GITHUB_ACTIONS": "true", "CLASSROOM": "c", "ASSIGNMENT": "vector-add", "SUBMISSION_TAG": "submit/1",
           "COMMIT_URL": "https://x/c", "RELEASE_URL": "https://x/r", "REVIEW_URL": "https://x/v"}


class Recorder(Sink):
    def __init__(self) -> None:
        self.events: list[tuple] = []

    def begin(self) -> None:
        self.events.append(("begin",))

    def started(self, setup) -> None:
        self.events.append(("started", [s.name for s in setup.chosen], setup.ctx.device))

    def finished(self, run):
        self.events.append(("finished",))
        return None

    def not_run(self, error, unreadable):
        self.events.append(("not_run", unreadable))
        return None


def _course() -> Course:
    return Course.find(from_environment())


def _options(tmp_path: Path, repo: Path, **kw) -> CheckOptions:
    return CheckOptions.parse(repo, kw.pop("assignment", None), tmp_path / "out" / "results.json", tmp_path / "out",
                              kw.pop("device", "cpu"), kw.pop("seed", 7), kw.pop("case", None), None, None, "sandbox",
                              kw.pop("jobs", None), kw.pop("ci", None))


@pytest.mark.parametrize("env, ci, last", [({}, None, TerminalSink), ({"GITHUB_ACTIONS": "true"}, None, GitHubSink),
                                           (C50_ENV, None, Classroom50Sink), (C50_ENV, "github", GitHubSink),
                                           # plain output, but a CI job: a stop the runner caused is annotated
                                           ({"GITHUB_ACTIONS": "true"}, "none", RunnerStopSink),
                                           ({}, "classmoji", RunnerStopSink)])
def test_the_ci_mode_chooses_the_sinks(tmp_path, monkeypatch, env, ci, last):
    for name in ("GITHUB_ACTIONS", "CI", *C50_ENV):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    sinks = sinks_for(_options(tmp_path, tmp_path, ci=ci), from_environment(), _course())
    assert [type(s) for s in sinks[:3]] == [JsonSink, HtmlSink, TerminalSink]  # the files and the terminal, always
    assert type(sinks[-1]) is last and len(sinks) == (3 if last is TerminalSink else 4)


def test_an_option_that_cannot_work_stops_the_check_before_any_sink_begins(tmp_path):
    recorder = Recorder()
    with pytest.raises(CheckNotRun) as stop:
        run_check(_options(tmp_path, tmp_path, jobs=0), from_environment(), _course(), [recorder])
    assert "--jobs must be 1 or more" in str(stop.value.error) and not stop.value.unreadable
    assert recorder.events == []  # the options are checked before a CI sink clears or checks anything


def test_a_folder_with_no_assignment_is_the_submissions_own_fault(tmp_path):
    (tmp_path / "repo").mkdir()
    recorder = Recorder()
    with pytest.raises(CheckNotRun) as stop:
        run_check(_options(tmp_path, tmp_path / "repo"), from_environment(), _course(), [recorder])
    assert "no assignment found" in str(stop.value.error) and stop.value.unreadable  # graded 0 in Classroom 50
    assert recorder.events == [("begin",)]


@pytest.mark.skipif(has_gpu(), reason="the interpreter's expectations")
def test_run_check_grades_and_leaves_the_writing_to_the_sinks(tmp_path):
    repo = build_submission(tmp_path / "repo", "good")
    recorder = Recorder()
    options = _options(tmp_path, repo, assignment=["vector_add"], case=["n=127"])
    run = run_check(options, from_environment(), _course(), [recorder])
    assert recorder.events == [("begin",), ("started", ["vector_add"], "cpu")]  # finished is the caller's to tell
    assert {t.outcome for t in run.tests} == {Outcome.PASSED, Outcome.SKIPPED} and exit_code(run) == 0
    assert run.seed == 7 and [a.name for a in run.assignments] == ["vector_add"]
    assert not options.json_file.exists() and not (options.html_dir / "report.html").exists()  # only a sink writes
    JsonSink(options.json_file).finished(run)
    assert options.json_file.is_file()


@pytest.mark.parametrize("columns, widest", [(None, 80), ("120", 120)])
def test_help_fills_the_terminals_width_and_80_columns_where_it_is_unknown(columns, widest):
    """`grader grade --help` as plain text at the reader's width, its option help not squeezed into a
    column of about 25 (rich's boxes did); where no width is known, 80."""
    import os
    import subprocess
    import sys

    from tests.conftest import REPO_ROOT

    env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "LINES")}
    env["PYTHONPATH"] = str(REPO_ROOT)
    if columns:
        env["COLUMNS"] = columns
    proc = subprocess.run([sys.executable, "-m", "grader", "grade", "--help"], env=env, capture_output=True,
                          text=True, timeout=120, stdin=subprocess.DEVNULL)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert max(map(len, lines)) <= widest and max(map(len, lines)) >= widest - 12, lines
    roster = next(line for line in lines if line.lstrip().startswith("--roster"))
    assert "Grade from a roster (fetched first into" in roster and "│" not in proc.stdout
