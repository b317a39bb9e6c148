"""Classroom 50: `grader check --ci classroom50`, `grader release --classroom50`, and its class on the TA's side.

`validate` below is this test's own reading of the runner's rules for result.json (not the
grader's code): no other top-level key; every score a non-negative integer (not a float, not a
bool) and at most its max-score, overall and per test; classroom and assignment equal to the
environment's; submission starting with submit/; the URL and datetime fields non-empty strings;
extra keys inside a test kept. On top of them, the grader's own promise: the tests' integer
points add up exactly to the totals.
"""

from __future__ import annotations

import copy
import html
import importlib.util
import json
import os
import random
import re
import shutil
import subprocess
import sys
import zipfile
from datetime import datetime, timedelta, timezone
from fractions import Fraction
from pathlib import Path
from types import SimpleNamespace

import pytest

from tests import classroom50_rules as rules
from tests.classbuild import make_repo
from tests.conftest import COURSE, FIXTURES, REPO_ROOT, run_cli
from grader.batch import classroom50 as c50
from grader.batch.roster import RosterError
from grader.kit import classroom50 as ci
from grader.kit import classroom50_config as config
from grader.kit import release
from grader.results import AssignmentResult, RunResult, TestResult

TOP_KEYS = {"schema", "classroom", "assignment", "owner", "assignment_type", "submission", "commit", "release", "review",
            "datetime", "score", "max-score", "tests"}
TAG = "submit/20261125T101500Z-abc1234"
REPO_URL = "https://github.com/cs-org/cs101-vector-add-alice"


def runner_env(tmp_path: Path) -> dict[str, str]:
    """What Classroom 50's runner gives the autograder, with temporary output files."""
    (tmp_path / "gh").mkdir(exist_ok=True)
    output, summary = tmp_path / "gh" / "output", tmp_path / "gh" / "summary.md"
    output.write_text("")
    summary.write_text("")
    return {"GITHUB_ACTIONS": "true", "CLASSROOM": "cs101", "ASSIGNMENT": "vector-add", "SUBMISSION_TAG": TAG,
            "OWNER": "alice", "USERNAME": "alice", "ASSIGNMENT_TYPE": "individual", "COMMIT_URL": f"{REPO_URL}/commit/abc1234",
            "RELEASE_URL": f"{REPO_URL}/releases/tag/{TAG}", "REVIEW_URL": f"{REPO_URL}/pull/1",
            "GITHUB_OUTPUT": str(output), "GITHUB_STEP_SUMMARY": str(summary), "GITHUB_REPOSITORY": "cs-org/cs101-vector-add-alice"}


def _is_points(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def validate(data, env: dict) -> list[str]:
    """Why Classroom 50's runner would refuse `data` (empty: it accepts it)."""
    if not isinstance(data, dict):
        return ["not an object"]
    problems = []
    if set(data) != TOP_KEYS:
        problems.append(f"top-level keys differ: {sorted(set(data) ^ TOP_KEYS)}")
    if data.get("schema") != "classroom50/result/v1":
        problems.append("schema")
    if data.get("classroom") != env["CLASSROOM"] or data.get("assignment") != env["ASSIGNMENT"]:
        problems.append("classroom/assignment differ from the environment's")
    if not isinstance(data.get("submission"), str) or not data["submission"].startswith("submit/"):
        problems.append("submission")
    for key in ("commit", "release", "review", "datetime"):
        if not isinstance(data.get(key), str) or not data[key]:
            problems.append(f"{key} is not a non-empty string")
    if isinstance(data.get("datetime"), str) and not re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", data["datetime"]):
        problems.append("datetime format")
    for key in ("owner", "assignment_type"):
        if not isinstance(data.get(key), str):
            problems.append(f"{key} is not a string")
    if not _is_points(data.get("score")) or not _is_points(data.get("max-score")):
        problems.append("score/max-score not non-negative integers")
    elif data["score"] > data["max-score"]:
        problems.append("score above max-score")
    tests = data.get("tests")
    if not isinstance(tests, list):
        return problems + ["tests is not a list"]
    for i, t in enumerate(tests):
        if not isinstance(t, dict):
            problems.append(f"test {i} is not an object")
            continue
        if not isinstance(t.get("test-name"), str) or not isinstance(t.get("message"), str):
            problems.append(f"test {i}: test-name/message")
        if not isinstance(t.get("passed"), bool):
            problems.append(f"test {i}: passed is not a bool")
        if not _is_points(t.get("score")) or not _is_points(t.get("max-score")):
            problems.append(f"test {i}: points not non-negative integers")
        elif t["score"] > t["max-score"]:
            problems.append(f"test {i}: score above max-score")
    if not problems:  # the grader's own promise: the parts add up to the totals
        if sum(t["score"] for t in tests) != data["score"] or sum(t["max-score"] for t in tests) != data["max-score"]:
            problems.append("the tests' points do not add up to the totals")
    return problems


def outputs(env: dict) -> dict[str, str]:
    lines = Path(env["GITHUB_OUTPUT"]).read_text().splitlines()
    pairs = dict(line.split("=", 1) for line in lines)
    assert len(pairs) == len(lines) == 2, lines  # status and summary, one line each
    assert pairs["status"] in ("success", "failure", "error") and len(pairs["summary"]) <= 140
    return pairs


# -- the validator can fail ------------------------------------------------------------------------

GOOD = {"schema": "classroom50/result/v1", "classroom": "cs101", "assignment": "vector-add", "owner": "alice",
        "assignment_type": "individual", "submission": TAG, "commit": "c", "release": "r", "review": "v",
        "datetime": "2026-11-25T10:15:00Z", "score": 3, "max-score": 10,
        "tests": [{"test-name": "a", "passed": False, "score": 3, "max-score": 10, "message": "m", "extra": [1]}]}


@pytest.mark.parametrize("change, reason", [
    (lambda d: d.update(extra=1), "top-level keys"),
    (lambda d: d.update(score=3.0), "score/max-score"),
    (lambda d: d.update(score=True), "score/max-score"),
    (lambda d: d.update(score=-1), "score/max-score"),
    (lambda d: d.update(score=11), "score above"),
    (lambda d: d["tests"][0].update(score=2.5), "points not"),
    (lambda d: d["tests"][0].update(score=11), "score above"),
    (lambda d: d["tests"][0].update(passed=1), "passed is not a bool"),
    (lambda d: d.update(classroom="other"), "classroom/assignment"),
    (lambda d: d.update(submission="v1.0"), "submission"),
    (lambda d: d.update(release=""), "release is not"),
    (lambda d: d.update(datetime="2026-11-25 10:15"), "datetime format"),
    (lambda d: d.pop("review"), "top-level keys"),
    (lambda d: d["tests"].append({"test-name": "b", "passed": True, "score": 1, "max-score": 1, "message": ""}), "add up"),
])
def test_the_validator_refuses_each_broken_rule(change, reason):
    env = {"CLASSROOM": "cs101", "ASSIGNMENT": "vector-add"}
    assert validate(GOOD, env) == []  # extra keys inside a test are kept
    bad = copy.deepcopy(GOOD)
    change(bad)
    problems = validate(bad, env)
    assert any(reason in p for p in problems), problems
    # the published rules' reading refuses the same, but the sum of the parts: that promise is ours alone
    assert rules.result_problems(GOOD, "cs101", "vector-add") == []
    assert bool(rules.result_problems(bad, "cs101", "vector-add")) == (reason != "add up"), rules.result_problems(bad)


# -- integer points --------------------------------------------------------------------------------

def _assignment(name: str, pairs: list[tuple[float, float]]) -> AssignmentResult:
    a = AssignmentResult(name, name.title(), f"kernels/{name}.py:{name}()")
    for i, (score, top) in enumerate(pairs):
        a.tests.append(TestResult(name, "correctness", f"case{i}", "passed" if score == top else "failed", "",
                                  max_score=top, score=score))
    return a


def test_integer_points_add_up_to_the_rounded_totals_and_never_exceed_a_maximum():
    rng = random.Random(5)
    for _ in range(500):
        assignments = []
        for k in range(rng.randint(1, 6)):
            top = rng.choice([0.25, 0.5, 1.25, 2.5, 3.33, 10, 7.5])
            pairs = [(round(top * rng.choice([0, 0.25, 0.5, 1]), 2), top) for _ in range(rng.randint(1, 4))]
            assignments.append(_assignment(f"a{k}", pairs))
        score, top, parts = ci.integer_points(assignments)
        exact_score = sum(Fraction(round(a.score * 100), 100) for a in assignments)
        exact_top = sum(Fraction(round(a.max_score * 100), 100) for a in assignments)
        assert score == int(exact_score + Fraction(1, 2)) and top == int(exact_top + Fraction(1, 2))
        assert sum(s for s, _ in parts) == score and sum(m for _, m in parts) == top
        for (s, m), a in zip(parts, assignments):
            assert 0 <= s <= m and all(isinstance(x, int) for x in (s, m))
            assert abs(m - a.max_score) < 1 + 1e-9  # a share moves by less than a point


def test_largest_remainder_by_hand():
    # 2.5 + 2.5 = 5 points: the first remainder (a tie) gets the extra point, and the score follows its cap
    assert ci.integer_points([_assignment("a", [(2.5, 2.5)]), _assignment("b", [(2.5, 2.5)])]) == (5, 5, [(3, 3), (2, 2)])
    # 3.4 + 3.3 + 3.3 = 10; earned 0.6 + 3.3 + 0.1 = 4: floors 0 + 3 + 0, the largest remainder (0.6) gets the 4th
    run = [_assignment("a", [(0.6, 3.4)]), _assignment("b", [(3.3, 3.3)]), _assignment("c", [(0.1, 3.3)])]
    assert ci.integer_points(run) == (4, 10, [(1, 4), (3, 3), (0, 3)])


# -- result.json, the release body and the outputs for each kind of submission ----------------------

TRACEBACK = """Traceback (most recent call last):
  File "/tmp/grader-x1/vector_add/repo/kernels/vector_add.py", line 11, in add_kernel
    x = tl.load(x_ptr + offsets)
grader.worker.memcheck.OutOfBounds: out-of-bounds load
"""


def _run(repo: Path, kind: str) -> RunResult:
    (repo / "kernels").mkdir(parents=True, exist_ok=True)
    (repo / "kernels" / "vector_add.py").write_text("# the student's module\n" * 20)
    run = RunResult(str(repo), 7, {})
    a = AssignmentResult("vector_add", "Vector addition", "kernels/vector_add.py:vector_add()")
    a.tests.append(TestResult("vector_add", "correctness", "n=1 [float32]", "passed", "ok", max_score=2.5, score=2.5))
    if kind == "failing":
        a.tests.append(TestResult("vector_add", "correctness", "n=129 [float32]", "failed", "out-of-bounds load",
                                  max_score=2.5, traceback=TRACEBACK,
                                  reproducer="grader check . -a vector_add --case 'n=129' --dtype float32 --seed 7"))
    elif kind == "infra":
        a.tests.append(TestResult("vector_add", "correctness", "n=129 [float32]", "infra_error", "the sandbox could not start",
                                  max_score=2.5))
    else:
        a.tests.append(TestResult("vector_add", "correctness", "n=129 [float32]", "passed", "ok", max_score=2.5, score=2.5))
    if kind == "gpu":
        a.tests += [TestResult("vector_add", "correctness", "n=1 [bfloat16]", "skipped", "needs a GPU", max_score=2.5,
                               dtype="bfloat16", details={"points_if_run": 2.5}),
                    TestResult("vector_add", "performance", "speed", "skipped", "needs a GPU", max_score=2.5,
                               details={"points_if_run": 2.5})]
    else:
        a.tests += [TestResult("vector_add", "correctness", "n=1 [bfloat16]", "passed", "ok", max_score=2.5, score=2.5,
                               dtype="bfloat16"),
                    TestResult("vector_add", "performance", "speed", "passed", "fast", max_score=2.5, score=2.5)]
    run.assignments.append(a)
    return run


class _Kit:
    """The course an autograder grades with: its grader-kit.toml's [ci] score, no hidden case."""

    def __init__(self, score: str | None) -> None:
        self.manifest = {"ci": {"score": score}} if score is not None else {}

    def kit_manifest(self) -> dict:
        return self.manifest

    def get(self, name):
        return type("Spec", (), {"hidden_count": 0})()


@pytest.mark.parametrize("kind, code, status, score, top, basis", [
    ("passing", 0, "success", 10, 10, None), ("failing", 0, "failure", 8, 10, None),
    ("gpu", 0, "success", 5, 5, None), ("gpu", 0, "success", 5, 10, "whole"), ("gpu", 0, "success", 5, 5, "cpu-gradable"),
    ("infra", 2, "error", 8, 10, None)])
def test_each_kind_of_submission_gives_a_valid_result(tmp_path, kind, code, status, score, top, basis):
    """result.json, the commit status and the release body for each kind of run; the integer points
    out of what the kit's [ci] score says: by default the points this runner can grade (perfect
    work on a CPU is 5 / 5, "of 10 at grading"), with "whole" every point (5 / 10)."""
    repo = tmp_path / "checkout"
    run = _run(repo, kind)
    env = runner_env(tmp_path)
    echoed = []
    assert ci.report(run, repo, "cpu", env, echo=echoed.append, catalogue=_Kit(basis)) == code
    data = json.loads((repo / "result.json").read_text())
    assert validate(data, env) == [] and rules.result_problems(data, env["CLASSROOM"], env["ASSIGNMENT"]) == [], data
    assert (data["score"], data["max-score"]) == (score, top)  # 7.5 of 10 rounds half up to 8
    assert sum(t["max-score"] for t in data["tests"]) == top and data["tests"][0]["exact-max-score"] == f"{top:g}"
    out = outputs(env)
    assert out["status"] == status and out["summary"].startswith(f"{score}/{top} points")
    assert Path(env["GITHUB_STEP_SUMMARY"]).read_text() == ""  # the runner mirrors release-body.md: not written twice
    body = (repo / "release-body.md").read_text()
    assert body.startswith(f"## Triton kernels: {score} / {top} points")
    if top != 10:  # the whole said beside the runner's share
        assert body.startswith(f"## Triton kernels: {score} / {top} points gradable here\n")
        assert "**10 points at grading**: 5 more need a GPU" in body and "(of 10 at grading)" in out["summary"]
        assert "5 of 5 points (5 of 5 exactly, gradable here, of 10 at grading)" in data["tests"][0]["message"]
    assert f"{REPO_URL}/releases/download/{TAG}/report.html" in body
    if kind == "failing":
        assert "### Failing checks" in body and "`grader check . -a vector_add --case 'n=129' --dtype float32 --seed 7`" in body
        assert echoed == ["::error file=kernels/vector_add.py,line=11,title=vector_add n=129 [float32]%3A failed::"
                          "out-of-bounds load"]
    if kind == "gpu":
        test = data["tests"][0]
        assert "5 points need a GPU (bfloat16 cases, speed)" in test["message"] and test["needs-gpu"]["what"] == [
            "bfloat16 cases", "speed"]
        assert "5 need a GPU" in out["summary"]
        assert ("**5 of these points need a GPU** (bfloat16 cases, speed)" in body) == (top == 10)
    if kind == "infra":
        assert "infra_error" in body and "no grade" in out["summary"]
    if kind == "passing":
        assert data["tests"][0]["passed"] is True and "points need a GPU" not in body


def test_score_rounds_half_up(tmp_path):
    run = _run(tmp_path / "checkout", "failing")  # 7.5 of 10
    assert ci.integer_points(run.assignments)[:2] == (8, 10)


def test_hostile_text_stays_text_in_every_sink(tmp_path):
    """A message and a module path the student controls: no Markdown or HTML in the release body,
    no second line in the outputs, no workflow command of theirs in the log."""
    repo = tmp_path / "checkout"
    run = _run(repo, "failing")
    evil = "</details><img src=x onerror=alert(1)> | [x](javascript:alert(1)) **bold**\n::add-mask::secret\r\nstatus=success"
    run.assignments[0].module = "kernels/`x`<b>|.py"
    run.assignments[0].tests[1].message = evil
    run.assignments[0].tests[1].reproducer = "grader check . ``` </code>\nnext"
    env = runner_env(tmp_path)
    echoed = []
    ci.report(run, repo, "cpu", env, echo=echoed.append)
    body = (repo / "release-body.md").read_text()
    for raw in ("<img", "</details>", "[x](", "**bold**", "\n::add-mask::", "<b>", "\nnext", "\nstatus="):
        assert raw not in body, raw
    row = next(line for line in body.splitlines() if "kernels" in line and line.startswith("| "))
    assert row.count("|") == 7  # the student's | adds no cell to the table
    assert outputs(env) == {"status": "failure", "summary": "8/10 points, 1 check(s) failing"}
    assert len(echoed) == 1 and not re.search(r"[\r\n]", echoed[0]) and echoed[0].startswith("::error file=")
    data = json.loads((repo / "result.json").read_text())
    assert validate(data, env) == [] and "\n" not in data["tests"][0]["message"]


def test_a_url_that_would_end_a_link_is_not_linked(tmp_path):
    repo = tmp_path / "checkout"
    env = runner_env(tmp_path) | {"COMMIT_URL": "https://x.test/a) [click](https://evil.test"}
    ci.report(_run(repo, "passing"), repo, "cpu", env, echo=lambda _: None)
    body = (repo / "release-body.md").read_text()
    assert "evil.test" not in body and "this commit," in body


def test_mode_is_chosen_by_the_runners_environment():
    assert ci.mode(None, {"GITHUB_ACTIONS": "true", "CLASSROOM": "c", "SUBMISSION_TAG": "submit/x"}) == "classroom50"
    assert ci.mode(None, {"GITHUB_ACTIONS": "true"}) == "github"  # Classmoji and plain Actions
    assert ci.mode(None, {"CLASSROOM": "c", "SUBMISSION_TAG": "submit/x"}) is None  # not in Actions
    assert ci.mode("none", {"GITHUB_ACTIONS": "true", "CLASSROOM": "c", "SUBMISSION_TAG": "submit/x"}) is None
    assert ci.mode("github", {"CLASSROOM": "c", "SUBMISSION_TAG": "submit/x"}) == "github"
    with pytest.raises(ci.Classroom50Error, match="RELEASE_URL, REVIEW_URL are not set"):
        ci.runner_fields({"CLASSROOM": "c", "ASSIGNMENT": "a", "SUBMISSION_TAG": "submit/x", "COMMIT_URL": "u"})
    with pytest.raises(ci.Classroom50Error, match="does not start with submit/"):
        ci.runner_fields({k: "x" for k in ci.REQUIRED_ENV})


def _cli_env(env: dict):
    old = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    return old


def _restore(old: dict) -> None:
    for k, v in old.items():
        os.environ.pop(k) if v is None else os.environ.__setitem__(k, v)


def test_a_submission_with_nothing_to_grade_is_graded_zero_and_says_why(tmp_path):
    """No kernel in the checkout is the student's problem: a graded 0 with the reason (exit 0, so
    the runner publishes our result.json and body), a stale result.json replaced."""
    repo = tmp_path / "empty"
    repo.mkdir()
    (repo / "result.json").write_text(json.dumps(GOOD))  # from an earlier run, or planted
    env = runner_env(tmp_path)
    old = _cli_env(env)
    try:
        run = run_cli(["check", str(repo), "--json", str(tmp_path / "out" / "results.json"), "--html", str(tmp_path / "out")],
                      tmp_path)
    finally:
        _restore(old)
    assert run.returncode == 0 and "no assignment found" in run.stderr
    data = json.loads((repo / "result.json").read_text())
    assert validate(data, env) == [] and rules.result_problems(data, "cs101", "vector-add") == [], data
    assert data["score"] == 0 and data["max-score"] > 0 and data != GOOD
    assert all("no assignment found in . (looked for" in t["message"] for t in data["tests"])
    assert outputs(env)["status"] == "failure"
    body = (repo / "release-body.md").read_text()
    assert "failed: no assignment found in &#46; &#40;looked for kernels/" in body and "empty" not in body


def test_our_own_failure_exits_2_and_says_so_where_the_runner_leaves_it(tmp_path):
    """An option that cannot work is ours: exit 2 and no result.json (the runner then records an
    error, no score), the reason in an annotation and the job summary, which the runner keeps."""
    repo = tmp_path / "repo"
    shutil.copytree(FIXTURES / "good", repo)
    (repo / "result.json").write_text(json.dumps(GOOD))
    env = runner_env(tmp_path)
    old = _cli_env(env)
    try:
        run = run_cli(["check", str(repo), "--jobs", "0", "--json", str(tmp_path / "out" / "results.json"),
                       "--html", str(tmp_path / "out")], tmp_path)
    finally:
        _restore(old)
    assert run.returncode == 2 and "--jobs must be 1 or more" in run.stderr
    assert not (repo / "result.json").exists()
    assert outputs(env)["status"] == "error" and "--jobs must be 1 or more" in outputs(env)["summary"]
    assert "::error title=The grader could not run::--jobs must be 1 or more" in run.stdout
    summary = Path(env["GITHUB_STEP_SUMMARY"]).read_text()
    assert "the grader could not run" in summary and "jobs must be 1 or more" in summary
    assert "not a grade of your work" in summary


def test_explicit_classroom50_without_its_environment_is_a_usage_error(tmp_path, cli):
    (tmp_path / "empty").mkdir()
    saved = {k: os.environ.pop(k) for k in list(os.environ) if k in ci.REQUIRED_ENV}
    try:
        run = cli(tmp_path / "empty", "--ci", "classroom50")
    finally:
        os.environ.update(saved)
    assert run.returncode == 2 and "needs Classroom 50's environment" in run.stderr and "Traceback" not in run.stderr


@pytest.mark.slow
@pytest.mark.parametrize("fixture, status", [("good", "success"), ("missing_mask", "failure")])
def test_cli_in_a_fake_classroom50_run(tmp_path, submission, fixture, status):
    """The real CLI with the runner's environment and no --ci: on the CPU, a right kernel passes
    every check that runs and names the GPU's points; an unmasked one fails, still exit 0."""
    repo = submission(fixture)
    (repo / "result.json").write_text("stale")
    env = runner_env(tmp_path) | {"GITHUB_WORKSPACE": str(repo)}
    old = _cli_env(env)
    try:
        run = run_cli(["check", str(repo), "-a", "vector_add", "--device", "cpu", "--json",
                       str(tmp_path / "out" / "results.json"), "--html", str(tmp_path / "out")], tmp_path)
    finally:
        _restore(old)
    assert run.returncode == 0, run.stdout + run.stderr
    data = json.loads((repo / "result.json").read_text())
    assert validate(data, env) == [] and rules.result_problems(data, env["CLASSROOM"], env["ASSIGNMENT"]) == [], data
    # out of what this CPU runner can grade (the default [ci] score): 4 of the spec's 10, the 6 a GPU needs named
    assert data["max-score"] == 4 and outputs(env)["status"] == status
    test = data["tests"][0]
    assert test["needs-gpu"]["points"] == "6" and test["needs-gpu"]["counted"] is False
    assert "need a GPU (bfloat16 cases, speed)" in test["message"]
    body = (repo / "release-body.md").read_text()
    assert "**10 points at grading**: 6 more need a GPU (bfloat16 cases, speed)" in body
    if fixture == "good":
        assert data["score"] == 4 and test["passed"] is True
    else:
        assert data["score"] < 4 and test["passed"] is False and "reproduce: `grader check . --device cpu -a vector_add --case " in body
        assert str(repo) not in body and str(tmp_path) not in body  # pasted in the student's clone, not the runner's path
        assert re.search(r"^::error file=kernels/vector_add\.py,line=11,", run.stdout, re.M), run.stdout
    assert Path(env["GITHUB_STEP_SUMMARY"]).read_text() == ""


# -- grader release --classroom50 -------------------------------------------------------------------

SECRET = "c50-test-secret-77d2a1"
ESSAY = {"slug": "essay", "name": "Not ours", "mode": "group", "max_group_size": 3, "autograder": "essays",
         "due": "2026-12-01T12:00:00Z", "allowed_files": ["*", "!essay.md"]}
DEADLINE = datetime(2026, 12, 1, 23, 59, tzinfo=timezone(timedelta(hours=-5)))


@pytest.fixture(scope="module")
def released(tmp_path_factory):
    root = tmp_path_factory.mktemp("c50")
    os.environ["GRADER_COURSE_SECRET"] = SECRET
    try:
        kit = release.build_kit(root / "kit")
        classroom = root / "config" / "cs101"
        classroom.mkdir(parents=True)
        (classroom / "assignments.json").write_text(json.dumps({"schema": "classroom50/assignments/v1", "assignments": [
            ESSAY, {"slug": "softmax", "name": "old", "mode": "individual", "autograder": "default", "feedback_pr": True,
                    "runtime": {"runs-on": ["ubuntu-latest"], "python": "3.12"}, "newer_field": {"kept": 1}}]}))
        written = config.write_classroom(kit, classroom, ["self-hosted", "gpu"], {"vector_add": DEADLINE})
    finally:
        del os.environ["GRADER_COURSE_SECRET"]
    return kit, classroom, written


def test_release_writes_an_autograder_and_an_entry_per_assignment(released):
    kit, classroom, written = released
    data = json.loads((classroom / "assignments.json").read_text())
    entries = {e["slug"]: e for e in data["assignments"]}
    assert rules.assignments_problems(data) == [], data  # Classroom 50's v1 object, which its setup job accepts
    assert [e["slug"] for e in data["assignments"]][:2] == ["essay", "softmax"]
    assert entries["essay"] == ESSAY  # another assignment's, kept as it was
    assert entries["softmax"]["newer_field"] == {"kept": 1} and entries["softmax"]["feedback_pr"] is True  # fields not ours
    assert entries["softmax"]["runtime"] == {"runs-on": ["self-hosted", "gpu"], "python": "3.12"}
    assert entries["vector-add"]["due"] == "2026-12-02T04:59:00Z"  # course.toml's deadline, in UTC
    assert entries["vector-add"]["due_meta"] == {"input": "2026-12-01T23:59:00-05:00", "offset": "-05:00",
                                                 "source": "explicit-offset"}
    assert "due" not in entries["softmax"]  # no deadline in the course: none invented
    for name in kit.assignments:
        slug = name.replace("_", "-")
        assert entries[slug]["release_assets"] == [".grader/report.html"] and entries[slug]["mode"] == "individual"
        script = classroom / "autograders" / slug / "autograder.py"
        assert f"autograders/{slug}/autograder.py" in written and os.access(script, os.X_OK)
        compile(script.read_text(), str(script), "exec")


def test_the_published_folder_holds_no_reference_hidden_case_or_secret(released):
    """The test's own scan of everything written (the autograders are published on Pages)."""
    from tests.kit.test_release import _hidden_names, _public_text

    _, classroom, _ = released
    texts = {}
    for p in (p for p in classroom.rglob("*") if p.is_file()):
        if p.suffix == ".whl":  # the grader's wheel, published beside each autograder: every member read
            with zipfile.ZipFile(p) as z:
                texts |= {f"{p.name}!{m}": z.read(m).decode(errors="replace") for m in z.namelist()}
        else:
            texts[p.relative_to(classroom).as_posix()] = p.read_text()
    assert len(texts) >= 9
    public = _public_text()
    hits = []
    for ref in (p for p in (REPO_ROOT / "reference").rglob("*.py") if "__pycache__" not in p.parts):
        body = ref.read_text()
        needles = [body.strip()] + [ln.strip() for ln in body.splitlines() if len(ln.strip()) >= 30 and ln.strip() not in public]
        hits += [f"{f}: {ref.name}" for n in needles for f, t in texts.items() if n in t]
    hidden = [n for names in _hidden_names().values() for n in names]
    assert hidden
    hits += [f"{f}: hidden case {n}" for n in hidden for f, t in texts.items() if n in t]
    hits += [f"{f}: the secret" for f, t in texts.items() if SECRET in t]
    assert not hits, hits


def test_release_refuses_an_autograder_that_would_publish_a_hidden_case(released, tmp_path):
    kit, _, _ = released
    planted = copy.copy(kit)
    planted.root = tmp_path / "kit"
    shutil.copytree(kit.root, planted.root)
    from tests.kit.test_release import _hidden_names

    hidden = next(n for names in _hidden_names().values() for n in names)
    (planted.root / "assignments" / "vector_add" / "notes.py").write_text(f"# {hidden}\n")
    classroom = tmp_path / "cs101"
    with pytest.raises(release.ReleaseError, match=f"would publish private material:\n  autograders/.*hidden case {re.escape(repr(hidden))}"):
        config.write_classroom(planted, classroom)
    assert not classroom.exists() or not any(classroom.rglob("*"))  # nothing written


@pytest.mark.parametrize("labels, match", [
    ([f"l{i}" for i in range(11)], "at most 10 runner labels"), (["gpu; rm -rf /"], "a runner label is")])
def test_runs_on_labels_are_checked(labels, match):
    with pytest.raises(release.ReleaseError, match=match):
        config.check_runs_on(labels)
    assert config.check_runs_on(None) == ["ubuntu-latest"]


def test_a_malformed_assignments_json_is_one_clear_message(released, tmp_path):
    kit = released[0]
    for text, match in [("{not json", "is not valid JSON"), ('{"assignments": 3}', "expected a list"),
                        ("[1, 2]", "expected a list"), ("[" * 100000, "is not valid JSON")]:
        classroom = tmp_path / f"c{len(text)}" / "cs101"
        classroom.mkdir(parents=True)
        (classroom / "assignments.json").write_text(text)
        with pytest.raises(release.ReleaseError, match=match):
            config.write_classroom(kit, classroom)
        assert not (classroom / "autograders").exists()


def test_an_old_bare_list_becomes_the_v1_object_and_a_rewrite_changes_nothing(released, tmp_path):
    kit = released[0]
    classroom = tmp_path / "cs101"
    classroom.mkdir()
    (classroom / "assignments.json").write_text(json.dumps([ESSAY]))  # what an earlier grader wrote
    config.write_classroom(kit, classroom, None, {"vector_add": DEADLINE})
    first = json.loads((classroom / "assignments.json").read_text())
    assert rules.assignments_problems(first) == [] and first["assignments"][0] == ESSAY
    config.write_classroom(kit, classroom, None, {"vector_add": DEADLINE})
    assert json.loads((classroom / "assignments.json").read_text()) == first
    (classroom / "assignments.json").write_text(json.dumps({"schema": "classroom50/assignments/v9", "assignments": []}))
    with pytest.raises(release.ReleaseError, match="is not 'classroom50/assignments/v1'"):
        config.write_classroom(kit, classroom)


@pytest.mark.parametrize("change, reason", [
    (lambda d: d.pop("schema"), "schema is None"),
    (lambda d: d.update(extra=1), "unknown top-level key"),
    (lambda d: d["assignments"][0].pop("autograder"), "autograder is missing"),
    (lambda d: d["assignments"][0].update(slug="Vector_Add"), "is not a short name"),
    (lambda d: d["assignments"][0].update(due="2026-12-01"), "not an RFC 3339"),
    (lambda d: d["assignments"][0].update(mode="group"), "needs max_group_size"),
    (lambda d: d["assignments"][0].update(runtime={"runs-on": [], "x": 1}), "runtime has the unknown key 'x'"),
    (lambda d: d["assignments"][0].update(runtime={"runs-on": []}), "list of 1 to 10 labels"),
    (lambda d: d["assignments"][0].update(release_assets=["result.json"]), "release asset"),
    (lambda d: d["assignments"][0].update(release_assets=["a/r.html", "b/r.html"]), "not unique"),
    (lambda d: d["assignments"][0].update(due_meta={"input": "x"}), "due_meta"),
])
def test_the_assignments_rules_refuse_each_broken_rule(change, reason):
    good = {"schema": "classroom50/assignments/v1", "assignments": [
        {"slug": "vector-add", "name": "Vector addition", "mode": "individual", "autograder": "default",
         "runtime": {"runs-on": ["self-hosted", "gpu"]}, "release_assets": [".grader/report.html"],
         "due": "2026-12-02T04:59:00Z", "due_meta": {"input": "x", "offset": "-05:00", "source": "explicit-offset"}}, ESSAY]}
    assert rules.assignments_problems(good) == []
    assert rules.assignments_problems(good["assignments"]) == ["not an object (a bare list is not v1)"]
    bad = copy.deepcopy(good)
    change(bad)
    assert any(reason in p for p in rules.assignments_problems(bad)), rules.assignments_problems(bad)


def test_release_cli_runs_on_needs_classroom50(tmp_path, cli):
    run = cli("--out", tmp_path / "k", "--runs-on", "gpu", command="release")
    assert run.returncode == 2 and "--runs-on goes with --classroom50" in run.stderr and not (tmp_path / "k").exists()


def _load_autograder(path: Path):
    module_spec = importlib.util.spec_from_file_location("autograder_under_test", path)
    module = importlib.util.module_from_spec(module_spec)
    module_spec.loader.exec_module(module)
    return module


def test_the_autograder_refuses_a_grader_wheel_the_course_did_not_release(released, tmp_path, monkeypatch, capsys):
    """The wheel published beside the autograder is used, so an allowed_files pattern that drops
    grader-dist/ (or a student's own wheel there) changes nothing; with neither copy the released
    one, our failure says why where the runner leaves it: an annotation and the job summary."""
    kit, classroom, _ = released
    folder = classroom / "autograders" / "vector-add"
    grader_py = _load_autograder(folder / "autograder.py")
    checkout = tmp_path / "checkout"
    shutil.copytree(kit.root, checkout)
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    released_wheel = (checkout / grader_py.REQUIREMENT).read_bytes()
    assert (folder / Path(grader_py.REQUIREMENT).name).read_bytes() == released_wheel  # published beside it
    shutil.rmtree(checkout / "grader-dist")  # what allowed_files without grader-dist/ leaves
    assert grader_py.verified_wheel(checkout, scratch).read_bytes() == released_wheel
    alone = tmp_path / "alone"  # an autograder published without its wheel: the checkout's copy, checked
    alone.mkdir()
    shutil.copy(folder / "autograder.py", alone)
    grader_py = _load_autograder(alone / "autograder.py")
    (checkout / "grader-dist").mkdir()
    (checkout / grader_py.REQUIREMENT).write_bytes(released_wheel)
    assert grader_py.verified_wheel(checkout, scratch).read_bytes() == released_wheel
    (checkout / grader_py.REQUIREMENT).write_bytes(b"PK a wheel of the student's own")
    output, summary = tmp_path / "output", tmp_path / "summary.md"
    monkeypatch.setenv("GITHUB_OUTPUT", str(output))
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(summary))
    with pytest.raises(SystemExit) as stopped:
        grader_py.verified_wheel(checkout, scratch)
    assert stopped.value.code == 2
    lines = output.read_text().splitlines()
    assert lines[0] == "status=error" and lines[1].startswith("summary=autograder: the grader's wheel") and len(lines) == 2
    assert "::error title=The grader could not run::the grader's wheel" in capsys.readouterr().out
    assert "is neither beside this autograder nor in the repository" in summary.read_text()
    assert "not a grade of your work" in summary.read_text()


@pytest.mark.parametrize("code, said", [(0, False), (2, False), (1, True), (-9, True)])
def test_the_autograder_explains_a_check_that_stopped_unexpectedly(released, tmp_path, monkeypatch, capsys, code, said):
    """Exit 0 and 2 are the check's own (2 has said why); anything else (a traceback, a kill) is
    explained by the autograder where the runner leaves it, and is still exit 2."""
    _, classroom, _ = released
    grader_py = _load_autograder(classroom / "autograders" / "vector-add" / "autograder.py")
    summary = tmp_path / "summary.md"
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(summary))
    monkeypatch.setenv("GITHUB_OUTPUT", str(tmp_path / "output"))
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(grader_py, "has_grader", lambda python, scratch: True)
    monkeypatch.setattr(grader_py.subprocess, "run", lambda *a, **k: SimpleNamespace(returncode=code))
    with pytest.raises(SystemExit) as stopped:
        grader_py.main()
    assert stopped.value.code == (0 if code == 0 else 2)
    assert summary.exists() == said
    if said:
        assert f"the grader stopped unexpectedly (exit {code})" in summary.read_text()
        assert "::error title=The grader could not run::the grader stopped unexpectedly" in capsys.readouterr().out


@pytest.mark.slow
def test_the_generated_autograder_grades_a_fake_checkout(released, tmp_path):
    """`python3 autograder.py` in a checkout of the kit with the runner's environment: a valid
    result.json, graded with the course's specs, not the checkout's, and never the `grader`
    package a student put in their repository."""
    kit, classroom, _ = released
    checkout = tmp_path / "cs101-vector-add-alice"
    shutil.copytree(kit.root, checkout)
    shutil.copy(FIXTURES / "good" / "kernels" / "vector_add.py", checkout / "kernels" / "vector_add.py")
    marker = tmp_path / "fake-grader-ran"
    (checkout / "grader").mkdir()  # a grader of the student's own, that would write 100%
    (checkout / "grader" / "__init__.py").write_text(f"open({str(marker)!r}, 'w').write('ran')\n__version__ = '0.1.0'\n")
    spec = checkout / "assignments" / "vector_add" / "spec.py"  # and an easier spec
    spec.write_text(spec.read_text() + "\nraise SystemExit('the checkout spec was used')\n")
    (checkout / ".grader").symlink_to(tmp_path)  # the report goes to the checkout, not through a link
    env = dict(os.environ, **runner_env(tmp_path), GITHUB_WORKSPACE=str(checkout), PYTHONPATH=str(REPO_ROOT), COLUMNS="200")
    env.pop("GRADER_COURSE", None)
    proc = subprocess.run([sys.executable, str(classroom / "autograders" / "vector-add" / "autograder.py")], cwd=checkout,
                          env=env, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    data = json.loads((checkout / "result.json").read_text())
    assert validate(data, env) == [] and rules.result_problems(data, env["CLASSROOM"], env["ASSIGNMENT"]) == [], data
    # out of the CPU's share of the released spec's 10 points (the kit's default [ci] score): perfect work is 4 / 4
    assert (data["score"], data["max-score"]) == (4, 4)
    assert outputs(env)["status"] == "success"
    assert not marker.exists()
    assert (checkout / ".grader" / "report.html").is_file() and not (checkout / ".grader").is_symlink()
    assert "report.html" in (checkout / "release-body.md").read_text()


# -- a hosted runner that refuses user namespaces (Ubuntu 24.04's AppArmor) -------------------------

USERNS = "kernel.apparmor_restrict_unprivileged_userns"


def apparmor_runner(folder: Path, sudo: bool) -> tuple[str, Path]:
    """A PATH on which the sandbox's namespaces cannot be made, as on GitHub's ubuntu-24.04 runners
    (AppArmor refuses unprivileged user namespaces; emulated as the other tests of a weaker
    sandbox do it, by a PATH without `unshare`), until `sysctl -w
    kernel.apparmor_restrict_unprivileged_userns=0` has run; `sudo -n` runs its command (`sudo`:
    the hosted runner's passwordless sudo) or asks for a password. Returns the PATH and the file
    where every sudo and sysctl call is written."""
    from tests.sandbox.test_isolation import path_without_unshare

    folder.mkdir(parents=True, exist_ok=True)
    calls, real = folder / "calls.txt", shutil.which("unshare")
    assert real, "this test needs util-linux's unshare"
    scripts = {
        "sudo": (f'echo "sudo $*" >> "{calls}"\n[ "$1" = "-n" ] && shift\nexec "$@"\n' if sudo else
                 f'echo "sudo $*" >> "{calls}"\necho "sudo: a password is required" >&2\nexit 1\n'),
        "sysctl": f'echo "sysctl $*" >> "{calls}"\n'
                  f'if [ "$1" = "-w" ] && [ "$2" = "{USERNS}=0" ]; then ln -sf "{real}" "{folder / "unshare"}"; '
                  f'echo "{USERNS} = 0"; fi\n',
    }
    for name, body in scripts.items():
        (folder / name).write_text("#!/bin/sh\n" + body)
        (folder / name).chmod(0o755)
    calls.touch()
    return path_without_unshare(folder), calls


def commands_read(log: str) -> list[str]:
    """The lines of `log` the runner reads as workflow commands: none between `::stop-commands::TOKEN`
    and `::TOKEN::`."""
    read, token = [], None
    for line in log.splitlines():
        if token is not None:
            token = None if line == f"::{token}::" else token
        elif line.startswith("::stop-commands::"):
            token = line[len("::stop-commands::"):]
        else:
            read.append(line)
    return read


def _hosted_checkout(kit_root: Path, tmp_path: Path, sudo: bool, hosted: bool = True) -> tuple[Path, dict, Path]:
    checkout = tmp_path / "cs101-vector-add-alice"
    shutil.copytree(kit_root, checkout)  # the kit as released: the starter at its module path
    path, calls = apparmor_runner(tmp_path / "bin", sudo)
    env = dict(os.environ, **runner_env(tmp_path), GITHUB_WORKSPACE=str(checkout), PYTHONPATH=str(REPO_ROOT),
               COLUMNS="200", PATH=path, RUNNER_ENVIRONMENT="github-hosted" if hosted else "self-hosted",
               RUNNER_TEMP=str(tmp_path), GRADER_CACHE_DIR=str(tmp_path / "cache"))  # a fresh runner: nothing warm
    env.pop("GRADER_COURSE", None)
    return checkout, env, calls


@pytest.mark.slow
def test_on_a_hosted_runner_the_autograder_lets_the_sandbox_use_namespaces_and_grades(released, tmp_path):
    """Classroom 50 on `ubuntu-latest`: user namespaces refused until the sysctl is lifted, which
    the autograder does (sudo -n, as the kit's own workflow does); the starter is then graded
    under its runner (0 points, status failure, released), its one-line cause told once in the
    release body instead of a line per failing case."""
    kit, classroom, _ = released
    checkout, env, calls = _hosted_checkout(kit.root, tmp_path, sudo=True)
    graded = rules.run_autograder(classroom / "autograders" / "vector-add" / "autograder.py", checkout, env)
    assert graded.status == "failure" and graded.result is not None, graded.summary + graded.log[-4000:]
    assert f"sudo -n sysctl -w {USERNS}=0" in calls.read_text().splitlines()
    assert f"set {USERNS}=0" in graded.log and "Weaker sandbox" not in graded.log
    assert graded.result["score"] == 0 and validate(graded.result, env) == []
    body = html.unescape(graded.body)  # Markdown: every sign an entity
    failing = body[body.index("### Failing checks"):]
    # the starter's one-line cause first, then the twenty NaN failures as one diagnosis, not one line each
    assert failing.split("\n")[2].startswith("- **vector_add: the kernel stores nothing yet"), failing
    assert body.count("stores nothing") == 1 and body.count("every element is NaN") == 1, body
    assert body.count("reproduce:") == 1, body
    assert (checkout / ".grader" / "report.html").is_file()


@pytest.mark.parametrize("hosted", [True, False], ids=["hosted-without-sudo", "self-hosted"])
def test_where_namespaces_stay_refused_the_grade_is_an_error_that_says_why(released, tmp_path, hosted):
    """Where the restriction cannot be lifted (no passwordless sudo), or must not be (a
    self-hosted runner is the course's machine: nothing of it is changed), the check never grades
    with a weaker sandbox: the runner records an error and releases nothing, and the annotation
    and the job summary, which it leaves alone, say what to set."""
    kit, classroom, _ = released
    checkout, env, calls = _hosted_checkout(kit.root, tmp_path, sudo=False, hosted=hosted)
    graded = rules.run_autograder(classroom / "autograders" / "vector-add" / "autograder.py", checkout, env)
    assert graded.status == "error" and graded.summary.endswith("autograder exited 2"), graded.log[-4000:]
    assert ("sudo -n sysctl" in calls.read_text()) == hosted  # a self-hosted runner's settings are left alone
    # the first screen: an annotation the runner reads (outside any stop-commands block) whose first sentence
    # says whose fault it is, the staff's fix within the 300 characters Classroom 50 keeps, no push again
    errors = [line for line in commands_read(graded.log) if line.startswith("::error ")]
    assert len(errors) == 1, graded.log
    title, message = errors[0][len("::error title="):].split("::", 1)
    assert title == "The runner stopped this check (not your code)" and len(message) <= 300, errors
    assert message.startswith("The runner, not your code, stopped this check.") and USERNS in message, message
    assert "Do not push again" in message and message.rstrip().endswith("tell the staff."), message
    assert "as root" not in message.replace("self-hosted: set it to 0 once, as root", ""), message
    if hosted:  # sudo's own reason shown, not hidden
        assert "sudo: a password is required" in graded.log
    summary = html.unescape(Path(env["GITHUB_STEP_SUMMARY"]).read_text())  # Markdown: every sign an entity
    assert "the runner stopped this check, not your code" in summary and USERNS in summary
    assert "Do not push again" in summary and "Push again" not in summary
    assert "cannot be built as asked" in summary  # the grader's finding, after the fix
    assert not (checkout / "result.json").exists() or graded.result is None  # nothing of ours released


@pytest.mark.slow
@pytest.mark.skipif(not os.environ.get("CLASSROOM50_RUNNER"), reason="CLASSROOM50_RUNNER names no copy of Classroom 50's "
                    "runner.py (cli/gh-teacher/skeleton/dotgithub/scripts/runner.py of foundation50/classroom50)")
@pytest.mark.parametrize("sudo", [True, False], ids=["sudo", "no-sudo"])
def test_classroom50s_own_runner_grades_on_a_hosted_runner_that_refuses_namespaces(released, tmp_path, sudo):
    """Classroom 50's own runner.py (a copy named by CLASSROOM50_RUNNER), as its grade step runs it:
    the assignment's bundle fetched from the Pages site (here a file:// one, as publish-pages
    packs it), its autograder run in the student's checkout, result.json validated, the release
    body and outputs its own when ours are missing. Namespaces refused until the sysctl is lifted:
    with sudo the starter is graded (failure, 0 points), without it the runner's error."""
    import tarfile

    kit, classroom, _ = released
    checkout, env, calls = _hosted_checkout(kit.root, tmp_path, sudo=sudo)
    subprocess.run(["git", "init", "-q", str(checkout)], check=True)
    subprocess.run(["git", "-C", str(checkout), "-c", "user.name=a", "-c", "user.email=a@b", "add", "-A"], check=True)
    subprocess.run(["git", "-C", str(checkout), "-c", "user.name=a", "-c", "user.email=a@b", "commit", "-qm", "s"],
                   check=True)
    sha = subprocess.run(["git", "-C", str(checkout), "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
    pages = tmp_path / "pages"
    (pages / "cs101" / "autograders").mkdir(parents=True)
    with tarfile.open(pages / "cs101" / "autograders" / "vector-add.tar.gz", "w:gz") as tar:
        tar.add(classroom / "autograders" / "vector-add", arcname="vector-add")
    env.update(PAGES_BASE_URL=pages.as_uri(), GITHUB_SHA=sha, GITHUB_ACTOR="alice", GITHUB_SERVER_URL="https://github.com",
               GITHUB_REPOSITORY="cs-org/cs101-vector-add-alice", MODE="individual", ALLOWED_FILES="[]",
               RELEASE_ASSETS='[".grader/report.html"]', SECRET="")
    proc = subprocess.run([sys.executable, os.environ["CLASSROOM50_RUNNER"]], cwd=checkout, env=env, capture_output=True,
                          text=True, timeout=900)
    log = proc.stdout + proc.stderr
    said = dict(line.split("=", 1) for line in Path(env["GITHUB_OUTPUT"]).read_text().splitlines() if "=" in line)
    result = json.loads((checkout / "result.json").read_text())
    if sudo:
        assert proc.returncode == 0 and said["status"] == "failure", log[-4000:]
        assert result["score"] == 0 and result["max-score"] == 10 and result["tests"][0]["passed"] is False, result
        assert "stores nothing" in (checkout / "release-body.md").read_text()
        assert said.get("release-assets") == "report.html", said
    else:
        assert said["status"] == "error" and "autograder exited 2" in said["summary"], log[-4000:]
        assert result["tests"] == [] and USERNS in html.unescape(Path(env["GITHUB_STEP_SUMMARY"]).read_text())


# -- the class on the TA's side --------------------------------------------------------------------

def test_roster_of_usernames_or_a_csv_export(tmp_path):
    users = tmp_path / "users.txt"
    users.write_text("# cs101\nAlice\nbob-2\n\n")
    entries = c50.load_roster(users, "cs-org", "CS101", "Vector-Add")
    assert [(e.student, e.repo, e.github_username) for e in entries] == [
        ("Alice", "https://github.com/cs-org/cs101-vector-add-alice", "Alice"),
        ("bob-2", "https://github.com/cs-org/cs101-vector-add-bob-2", "bob-2")]
    export = tmp_path / "roster.csv"
    export.write_text("email,username,name\na@uni.edu,alice,Alice A\nc@uni.edu,,Carol\n")
    entries = c50.load_roster(export, "file:///srv/org/", "cs101", "softmax")
    assert (entries[0].student, entries[0].repo, entries[0].name) == ("a@uni.edu", "file:///srv/org/cs101-softmax-alice", "Alice A")
    assert entries[1].repo is None and "no GitHub username" in entries[1].problem


@pytest.mark.parametrize("text, match", [
    ("", "the file is empty"), ("alice\n../../etc\n", r"line 2: '\.\./\.\./etc' is not a GitHub username"),
    ("-x\n", "is not a GitHub username"), ("email,name\na@b,A\n", "needs a username column"),
    ("alice\nalice\n", "appears twice"), ("username\n", "a header but no student"),
    ("username\nalice,extra\n", "2 fields, but the header has 1"), ("al\x1bice\n", r"'al\\\\x1bice' is not a GitHub username"),
])
def test_a_malformed_roster_is_one_message(tmp_path, text, match):
    path = tmp_path / "users.txt"
    path.write_text(text)
    with pytest.raises(RosterError, match=match):
        c50.load_roster(path, "org", "cs101", "softmax")


def test_classroom_and_slug_are_names(tmp_path):
    (tmp_path / "u").write_text("alice\n")
    for classroom, slug in (("../x", "a"), ("cs", "a/b"), ("cs", "")):
        with pytest.raises(RosterError, match="letters, digits"):
            c50.load_roster(tmp_path / "u", "org", classroom, slug)
    with pytest.raises(RosterError, match="needs --org"):
        c50.load_roster(tmp_path / "u", "", "cs", "a")


def _result(owner: str, assignment: str, score, when: str, top=10) -> dict:
    return {**GOOD, "owner": owner, "assignment": assignment, "score": score, "max-score": top, "datetime": when,
            "submission": f"submit/{when}"}


def test_scores_keep_the_latest_per_student_and_assignment(tmp_path):
    path = tmp_path / "scores.json"
    path.write_text(json.dumps([_result("alice", "vector-add", 3, "2026-11-20T00:00:00Z"),
                                _result("Alice", "vector-add", 7, "2026-11-21T00:00:00Z"),
                                _result("bob", "softmax", 2, "2026-11-21T00:00:00Z")]))
    records = c50.load_scores(path)
    assert [(r["owner"], r["assignment"], r["score"]) for r in records] == [("Alice", "vector-add", 7), ("bob", "softmax", 2)]
    by_user = tmp_path / "by-user.json"
    by_user.write_text(json.dumps({"carol": {k: v for k, v in _result("x", "softmax", 1, "2026-11-21T00:00:00Z").items()
                                             if k != "owner"}}))
    assert c50.load_scores(by_user)[0]["owner"] == "carol"
    cells = c50.score_cells(records, {"alice": "a@uni.edu"}, ["vector_add", "softmax"])
    assert cells == {("a@uni.edu", "vector_add"): "Classroom 50: 7 / 10 (submit/2026-11-21T00:00:00Z)"}
    # course.toml counts vector_add for 20: the runner's score beside it in the gradebook's points
    from grader.batch.course import CourseConfig
    from fractions import Fraction

    scaled = c50.score_cells(records, {"alice": "a@uni.edu"}, ["vector_add"], CourseConfig(points={"vector_add": Fraction(20)}))
    assert scaled == {("a@uni.edu", "vector_add"): "Classroom 50: 7 / 10 = 14 / 20 in this course (submit/2026-11-21T00:00:00Z)"}
    # a kit released with those points reports out of 20 already: shown as it is, not scaled twice
    ours = [dict(r, score=14, **{"max-score": 20}) for r in records]
    assert c50.score_cells(ours, {"alice": "a@uni.edu"}, ["vector_add"], CourseConfig(points={"vector_add": Fraction(20)})) \
        == {("a@uni.edu", "vector_add"): "Classroom 50: 14 / 20 (submit/2026-11-21T00:00:00Z)"}


@pytest.mark.parametrize("text, match", [
    ("{oops", "not valid JSON"), ("[" * 200000 + "]" * 200000, "not valid JSON"), ("3", "or a list of results"),
    (json.dumps([_result("alice", "a", 2.5, "t")]), r"score is 2\.5, not a non-negative integer"),
    (json.dumps([_result("alice", "a", True, "t")]), "score is True"),
    (json.dumps([_result("alice", "a", -1, "t")]), "score is -1"),
    (json.dumps([_result("alice", "a", 11, "t")]), "score 11 is above max-score 10"),
    (json.dumps([_result("al/ice", "a", 1, "t")]), "is not a GitHub username"),
    (json.dumps([{"score": 1}]), "'owner' is missing"), (json.dumps(["x"]), "entry 1: not an object"),
])
def test_a_malformed_scores_file_is_one_message(tmp_path, text, match):
    path = tmp_path / "scores.json"
    path.write_text(text)
    with pytest.raises(c50.ScoresError, match=match):
        c50.load_scores(path)


def _scores_v1(*entries: tuple[str, str, list[dict]]) -> dict:
    """Classroom 50's scores.json: each submission a result.json less its `assignment` (the bucket's key)."""
    buckets: dict = {}
    for slug, owner, subs in entries:
        bucket = buckets.setdefault(slug, {"type": "individual", "entries": []})
        bucket["entries"].append({"owner": owner, "submissions": [{k: v for k, v in r.items() if k != "assignment"}
                                                                  for r in subs], "override": False})
    return {"schema": "classroom50/scores/v1", "assignments": buckets}


def test_classroom50s_own_scores_json_is_read(tmp_path):
    newer = {**_result("alice", "vector-add", 7, "2026-11-21T00:00:00Z"), "late": True, "graded_at": "2026-11-21T00:01:00Z"}
    data = _scores_v1(("vector-add", "alice", [newer, _result("alice", "vector-add", 3, "2026-11-20T00:00:00Z")]),
                      ("softmax", "bob", [_result("bob", "softmax", 2, "2026-11-21T00:00:00Z")]))
    assert rules.scores_problems(data) == [], rules.scores_problems(data)  # what Classroom 50's collection writes
    path = tmp_path / "scores.json"
    path.write_text(json.dumps(data))
    records = c50.load_scores(path)
    assert [(r["owner"], r["assignment"], r["score"]) for r in records] == [("alice", "vector-add", 7), ("bob", "softmax", 2)]
    cells = c50.score_cells(records, {"alice": "a@uni.edu"}, ["vector_add", "softmax"])
    assert cells == {("a@uni.edu", "vector_add"): "Classroom 50: 7 / 10 (submit/2026-11-21T00:00:00Z, late)"}
    path.write_text(json.dumps({"schema": "classroom50/scores/v1", "assignments": {}}))  # nothing collected yet
    assert c50.load_scores(path) == []


@pytest.mark.parametrize("change, match", [
    (lambda d: d.update(schema="classroom50/scores/v2"), "is not 'classroom50/scores/v1'"),
    (lambda d: d.update(assignments=[]), "is not an object of assignments by slug"),
    (lambda d: d["assignments"]["vector-add"].update(entries={}), r"assignment 'vector-add': not \{"),
    (lambda d: d["assignments"]["vector-add"]["entries"].append("x"), r"assignment 'vector-add', entry 2: not \{"),
    (lambda d: d["assignments"]["vector-add"]["entries"][0]["submissions"][0].update(score=2.5),
     r"entry 1, submission 1: score is 2\.5"),
    (lambda d: d["assignments"]["vector-add"]["entries"][0]["submissions"][0].pop("datetime"), "'datetime' is missing"),
])
def test_a_malformed_classroom50_scores_json_is_one_message(tmp_path, change, match):
    data = _scores_v1(("vector-add", "alice", [_result("alice", "vector-add", 7, "2026-11-21T00:00:00Z")]))
    bad = copy.deepcopy(data)
    change(bad)
    assert rules.scores_problems(bad), bad  # Classroom 50 would not have written it either
    path = tmp_path / "scores.json"
    path.write_text(json.dumps(bad))
    with pytest.raises(c50.ScoresError, match=match):
        c50.load_scores(path)


def test_fetch_a_classroom50_class_with_its_scores(tmp_path):
    """`grader fetch --classroom50`: repos found by Classroom 50's names, scores shown in the class view;
    a malformed scores file stops the fetch with one line."""
    org = tmp_path / "org"
    make_repo(org / "cs101-vector-add-alice")
    (tmp_path / "users.txt").write_text("Alice\nbob\n")
    (tmp_path / "scores.json").write_text(json.dumps(_scores_v1(("vector-add", "alice", [
        _result("alice", "vector-add", 4, "2026-11-21T00:00:00Z")]))))
    args = ["fetch", "--roster", str(tmp_path / "users.txt"), "--classroom50", "CS101", "--org", org.as_uri(),
            "-a", "vector_add", "--out", str(tmp_path / "work")]
    run = run_cli(args + ["--scores", str(tmp_path / "scores.json")], tmp_path)
    assert run.returncode == 1, run.stdout + run.stderr  # bob has no repository
    from grader.batch.classview import build_class_view
    from grader.batch.workspace import read_lock

    lock = read_lock(tmp_path / "work")
    assert [(p.student, p.status) for p in lock.students] == [("Alice", "fetched"), ("bob", "unfetched")]
    view = build_class_view(tmp_path / "reports", lock, ["vector_add"], catalogue=COURSE)
    assert view.rows[0].cells["vector_add"].ci == "Classroom 50: 4 / 10 (submit/2026-11-21T00:00:00Z)"
    assert view.rows[1].cells["vector_add"].ci == ""
    (tmp_path / "bad.json").write_text('[{"owner": "alice", "score": 1.5}]')
    run = run_cli(args + ["--scores", str(tmp_path / "bad.json")], tmp_path)
    assert run.returncode == 2 and "Traceback" not in run.stderr and "is missing or not a string" in run.stderr


def test_version_names_the_grader_torch_and_triton(tmp_path):
    run = run_cli(["--version"], tmp_path)
    lines = run.stdout.splitlines()
    assert run.returncode == 0 and lines[0] == "grader 0.1.0"
    import torch
    import triton

    assert lines[1:] == [f"torch {torch.__version__}", f"triton {triton.__version__}"]


def test_a_planted_result_link_or_folder_is_replaced_not_followed(tmp_path):
    """A result.json committed as a link to a file outside, and release-body.md as a folder:
    both removed before the check, the outside file untouched, the run's own files written."""
    repo = tmp_path / "checkout"
    run = _run(repo, "passing")
    outside = tmp_path / "outside.json"
    outside.write_text("keep me")
    (repo / "result.json").symlink_to(outside)
    (repo / "release-body.md").mkdir()
    (repo / "release-body.md" / "x").write_text("x")
    ci.remove_stale(repo)
    assert not (repo / "result.json").exists() and not (repo / "release-body.md").exists()
    (repo / "result.json").symlink_to(outside)  # planted again after the removal: replaced by the rename
    env = runner_env(tmp_path)
    assert ci.report(run, repo, "cpu", env, echo=lambda _: None) == 0
    assert outside.read_text() == "keep me" and not (repo / "result.json").is_symlink()
    assert validate(json.loads((repo / "result.json").read_text()), env) == []


def test_release_cli_writes_the_classroom_or_says_why_not(tmp_path, cli):
    classroom = tmp_path / "config" / "cs101"
    run = cli("--out", tmp_path / "kit", "-a", "vector_add", "--grader-requirement", "grader==0.1.0",
              "--classroom50", classroom, "--runs-on", "self-hosted", "--runs-on", "gpu", "--no-check", command="release")
    assert run.returncode == 0, run.stdout + run.stderr
    data = json.loads((classroom / "assignments.json").read_text())  # a new file: Classroom 50's v1 object
    assert rules.assignments_problems(data) == [] and len(data["assignments"]) == 1, data
    entry = data["assignments"][0]
    assert entry["slug"] == "vector-add" and entry["runtime"]["runs-on"] == ["self-hosted", "gpu"]
    script = (classroom / "autograders" / "vector-add" / "autograder.py").read_text()
    assert "REQUIREMENT = 'grader==0.1.0'" in script and "WHEEL_SHA256 = None" in script
    broken = tmp_path / "config" / "cs102"
    broken.mkdir()
    (broken / "assignments.json").write_text("[{")
    run = cli("--out", tmp_path / "kit2", "-a", "vector_add", "--grader-requirement", "grader==0.1.0",
              "--classroom50", broken, "--no-check", command="release")
    assert run.returncode == 2 and "is not valid JSON" in run.stderr and "Traceback" not in run.stderr
    assert not (broken / "autograders").exists()
