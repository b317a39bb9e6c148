"""`grader check --ci github`: the job summary, the annotations and GitHub Classroom's payload.

The payload is checked against the fields the Classroom reporter reads (classroom-resources'
autograding-command-grader format: version 1, status, max_score, tests[] with name, status,
score, message, test_code, filename, line_no, duration) and against the reporter's arithmetic:
it adds every test's score, over the payload's max_score.
"""

from __future__ import annotations

import base64
import html
import json
import re

import pytest

from tests.conftest import run_cli
from grader.kit import github as ci
from grader.results import AssignmentResult, RunResult, TestResult

TRACEBACK = """Traceback (most recent call last):
  File "/usr/lib/python3.11/site-packages/grader/worker.py", line 201, in run
    result = fn(**inputs)
  File "/tmp/grader-x1/vector_add/repo/kernels/vector_add.py", line 19, in vector_add
    add_kernel[grid](x, y, out, n)
  File "/tmp/grader-x1/vector_add/repo/kernels/vector_add.py", line 11, in add_kernel
    x = tl.load(x_ptr + offsets)
grader.worker.memcheck.OutOfBounds: out-of-bounds load
"""
REPORTER_FIELDS = {"name", "status", "score", "message", "test_code", "filename", "line_no", "duration"}


def _run(tmp_path) -> RunResult:
    (tmp_path / "kernels").mkdir(exist_ok=True)
    (tmp_path / "kernels" / "vector_add.py").write_text("# the student's module\n")
    run = RunResult(str(tmp_path), 7, {})
    a = AssignmentResult("vector_add", "Vector addition", "kernels/vector_add.py:vector_add()")
    a.tests += [
        TestResult("vector_add", "correctness", "n=1 [float32]", "passed", "ok", max_score=1.5, score=1.5),
        TestResult("vector_add", "correctness", "n=129 [float32]", "failed", "out-of-bounds load", max_score=1.5,
                   traceback=TRACEBACK, reproducer="grader check . -a vector_add --case 'n=129' --dtype float32 --seed 7"),
        TestResult("vector_add", "correctness", "n=1 [bfloat16]", "skipped", "needs a GPU", max_score=1.5,
                   details={"points_if_run": 1.5}),  # as grader.judge.scoring leaves it: its share, none earned here
        TestResult("vector_add", "correctness", "n=2 [float16]", "timeout", "took too long", max_score=1.5),
        TestResult("vector_add", "integrity", "uses its own Triton kernel", "passed", "add_kernel"),
    ]
    b = AssignmentResult("softmax", "Row-wise softmax", "kernels/softmax.py:softmax()")
    b.tests += [
        TestResult("softmax", "correctness", "1x1 [float32]", "error", "raised", max_score=2.0),
        TestResult("softmax", "correctness", "2x2 [float32]", "crashed", "died", max_score=2.0),
        TestResult("softmax", "integrity", "uses its own Triton kernel", "flagged", "torch did it"),
        TestResult("softmax", "correctness", "3x3 [float32]", "infra_error", "ours", max_score=2.0),
    ]
    run.assignments += [a, b]
    return run


def test_classroom_payload_has_the_reporters_fields_and_maps_outcomes(tmp_path):
    payload = ci.classroom_payload(_run(tmp_path), tmp_path)
    assert payload["version"] == 1
    assert payload["status"] == "error"  # an infra_error is ours, not a failure of the student
    names = [t["name"] for t in payload["tests"]]
    assert "vector_add: n=1 [bfloat16]" not in names and len(names) == 8  # skipped: left out
    for t in payload["tests"]:
        assert REPORTER_FIELDS <= set(t), t
    status = {t["name"]: t["status"] for t in payload["tests"]}
    assert status == {
        "vector_add: n=1 [float32]": "pass", "vector_add: n=129 [float32]": "fail", "vector_add: n=2 [float16]": "fail",
        "vector_add: uses its own Triton kernel": "pass", "softmax: 1x1 [float32]": "fail", "softmax: 2x2 [float32]": "fail",
        "softmax: uses its own Triton kernel": "fail", "softmax: 3x3 [float32]": "error"}
    # out of the same total as the summary: by default what this runner can grade (12 less the skipped 1.5);
    # on the whole basis the skipped 1.5 is in it, earning nothing here
    assert sum(t["score"] for t in payload["tests"]) == 1.5 and payload["max_score"] == 10.5
    assert ci.classroom_payload(_run(tmp_path), tmp_path, "whole")["max_score"] == 12.0
    failing = next(t for t in payload["tests"] if t["name"] == "vector_add: n=129 [float32]")
    assert (failing["filename"], failing["line_no"]) == ("kernels/vector_add.py", 11)  # the deepest frame of their file
    assert "--case 'n=129'" in failing["message"] and failing["test_code"].startswith("grader check")


def test_payload_status_is_fail_or_pass_without_infra_errors(tmp_path):
    run = _run(tmp_path)
    run.assignments[1].tests.pop()
    assert ci.classroom_payload(run, tmp_path)["status"] == "fail"
    run.assignments = run.assignments[:1]
    run.assignments[0].tests = [t for t in run.assignments[0].tests if t.outcome in ("passed", "skipped")]
    assert ci.classroom_payload(run, tmp_path)["status"] == "pass"


def test_annotations_point_at_the_students_line_only(tmp_path):
    lines = ci.annotations(_run(tmp_path), tmp_path, tmp_path)
    assert len(lines) == 1
    assert re.fullmatch(r"::error file=kernels/vector_add\.py,line=11,title=vector_add n=129 \[float32\]%3A failed::"
                        r"out-of-bounds load", lines[0]), lines[0]
    # a frame in a file the repo does not have (the grader's own) is no annotation
    run = _run(tmp_path)
    (tmp_path / "kernels" / "vector_add.py").unlink()
    assert ci.annotations(run, tmp_path, tmp_path) == []


def test_workflow_command_escaping():
    from grader.sanitize import for_annotation

    assert for_annotation("a%b\nc") == "a%25b%0Ac"
    assert for_annotation("x: y, z", property=True) == "x%3A y%2C z"


def test_enabled_by_flag_or_github_actions():
    assert ci.enabled("github", {}) and ci.enabled(None, {"GITHUB_ACTIONS": "true"})
    assert not ci.enabled(None, {}) and not ci.enabled("none", {"GITHUB_ACTIONS": "true"})


def test_summary_names_score_failures_gpu_points_and_hidden_cases(tmp_path):
    text = html.unescape(ci.step_summary(_run(tmp_path), "cpu", {"vector_add": 2, "softmax": 0}, "whole"))
    assert text.startswith("## Triton kernels: 1.5 / 12 points\n")
    assert "**1.5 of these points need a GPU**" in text and "after the deadline" in text
    assert "| vector_add (<code>kernels/vector_add.py:vector_add()</code>) | 1.5 / 6 | 2 | 2 | 1 (1.5 pts, GPU) | 2 |" in text
    # by default out of what this runner can grade, the whole said beside it
    here = html.unescape(ci.step_summary(_run(tmp_path), "cpu", {"vector_add": 2, "softmax": 0}))
    assert here.startswith("## Triton kernels: 1.5 / 10.5 points gradable here\n")
    assert "**12 points at grading**: 1.5 more need a GPU" in here
    assert "| vector_add (<code>kernels/vector_add.py:vector_add()</code>) | 1.5 / 4.5 | 2 | 2 | 1 (1.5 pts, GPU) | 2 |" in here
    assert "reproduce: `grader check . -a vector_add --case 'n=129' --dtype float32 --seed 7`" in text
    assert "Hidden cases are not run here" in text


class _Kit:
    """A course as a kit's check sees it: its grader-kit.toml's [ci] score, no hidden case."""

    def __init__(self, score: str | None) -> None:
        self.manifest = {"ci": {"score": score}} if score is not None else {}

    def kit_manifest(self) -> dict:
        return self.manifest

    def get(self, name):
        return type("Spec", (), {"hidden_count": 0})()


@pytest.mark.parametrize("score, total, notice", [
    (None, "4 / 4 points gradable here", "4 / 4 points gradable here (of 10 at grading: 6 need a GPU, graded on the "
     "course's GPU after the deadline)"),
    ("bogus", "4 / 4 points gradable here", None),  # a value the grader does not know: the default
    ("whole", "4 / 10 points", "4 / 10 points (6 of them need a GPU: graded on the course's GPU after the deadline)")])
def test_every_output_of_a_run_says_the_same_total_in_clean_numbers(tmp_path, score, total, notice):
    """The summary's title, the Points notice and the `result` output agree, out of what the kit's
    [ci] score says (the points this runner can grade by default, the whole with "whole": those
    that need a GPU in the total, earning nothing here), and no score carries a float's tail: ten
    cases of 0.4 are 4, not 4.000000000000001."""
    run = RunResult(str(tmp_path), 7, {})
    a = AssignmentResult("vector_add", "Vector addition", "kernels/vector_add.py:vector_add()")
    a.tests += [TestResult("vector_add", "correctness", f"n={i} [float32]", "passed", "ok", max_score=0.4, score=0.4)
                for i in range(10)]
    a.tests += [TestResult("vector_add", "correctness", f"n={i} [bfloat16]", "skipped", "needs a GPU", max_score=0.6,
                           details={"points_if_run": 0.6}) for i in range(10)]
    run.assignments.append(a)
    said: list[str] = []
    output, summary = tmp_path / "output", tmp_path / "summary.md"
    ci.report_github(run, tmp_path, "cpu", {"GITHUB_OUTPUT": str(output), "GITHUB_STEP_SUMMARY": str(summary)},
                     echo=said.append, catalogue=_Kit(score))
    payload = _decode(output)
    assert payload["max_score"] == (10 if score == "whole" else 4) and all(t["score"] == 0.4 for t in payload["tests"])
    assert summary.read_text().startswith(f"## Triton kernels: {total}\n")
    assert said[-1] == f"::notice title=Points::{notice or said[-1].split('::')[-1]}"
    assert said[-1].startswith(f"::notice title=Points::{total}")


def _decode(output_file):
    lines = [line for line in output_file.read_text().splitlines() if line.startswith("result=")]
    assert len(lines) == 1, output_file.read_text()
    return json.loads(base64.b64decode(lines[0][len("result="):]))


@pytest.mark.slow
def test_check_in_github_actions_writes_summary_output_and_annotations(tmp_path, submission):
    """The real CLI with GITHUB_ACTIONS=true (no --ci flag) on a vector_add without a mask."""
    import os

    repo = submission("missing_mask")
    summary, output = tmp_path / "summary.md", tmp_path / "output"
    summary.write_text("earlier step\n")
    env = {"GITHUB_ACTIONS": "true", "GITHUB_STEP_SUMMARY": str(summary), "GITHUB_OUTPUT": str(output),
           "GITHUB_WORKSPACE": str(repo)}
    old = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        run = run_cli(["check", str(repo), "-a", "vector_add", "--device", "cpu", "--seed", "5", "--dtype", "float32",
                       "--json", str(tmp_path / "out" / "results.json"), "--html", str(tmp_path / "out")], tmp_path)
    finally:
        for k, v in old.items():
            os.environ.pop(k) if v is None else os.environ.__setitem__(k, v)
    assert run.returncode == 1, run.stdout + run.stderr
    payload = _decode(output)
    assert payload["version"] == 1 and payload["status"] == "fail"
    by_name = {t["name"]: t for t in payload["tests"]}
    # n=1 reads past the end without a mask: the interpreter's bounds check fails it, at the load's line
    bad = by_name["vector_add: n=1 [float32]"]
    assert bad["status"] == "fail" and bad["filename"] == "kernels/vector_add.py" and bad["line_no"] == 11, bad
    assert by_name["vector_add: n=128 [float32]"]["status"] == "fail"  # 128 of its 1024 lanes are in bounds
    assert all(t["status"] in ("pass", "fail") for t in payload["tests"])
    results = run.results
    # one total everywhere: the result output, the summary's title and the Points notice say the same, out of
    # what this runner could grade (the default [ci] score: what it skipped is left out, said beside it)
    here = round(sum(t["max_score"] for t in results["tests"] if t["outcome"] != "skipped"), 2)
    assert here < results["max_score"] and payload["max_score"] == here
    assert sum(t["score"] for t in payload["tests"]) == results["score"]
    text = html.unescape(summary.read_text())
    assert text.startswith(f"earlier step\n## Triton kernels: {results['score']:g} / {here:g} points gradable here\n")
    assert re.search(rf"^::notice title=Points::{results['score']:g} / {here:g} points gradable here "
                     rf"\(of {results['max_score']:g} at grading", run.stdout, re.M), run.stdout
    assert "### Failing checks" in text and "out-of-bounds load" in text and "reproduce: `grader check" in text
    assert "hidden case(s) of vector_add are not in this kit" not in text  # the TA's course has them here, not withheld
    # the one missing mask is one bug: one annotation, one block in the summary, the report and the terminal,
    # every case it concerns inside it (its lane counts and program ids differ from case to case)
    errors = [line for line in run.stdout.splitlines() if line.startswith("::error")]
    assert len(errors) == 1, errors
    assert re.match(r"::error file=kernels/vector_add\.py,line=11,title=vector_add \d+ checks%3A failed::"
                    r"out-of-bounds load", errors[0]), errors[0]
    failing = text.split("### Failing checks", 1)[1]
    assert len(re.findall(r"^- \*\*vector_add\*\*", failing, re.M)) == 1, failing
    assert "n=1, n=127, n=128" in failing
    assert run.report is not None and run.report.count('<div class="failure') == 1
    assert run.stdout.count("reproduce: ") == 1 and "out-of-bounds load" in run.stdout.split("What went wrong", 1)[1]


def test_a_check_that_cannot_run_still_reports(tmp_path, cli):
    """No kernel in the repo: exit 2, and in Actions the summary and Classroom's payload say why."""
    import os

    summary, output = tmp_path / "summary.md", tmp_path / "output"
    (tmp_path / "empty").mkdir()
    os.environ.update(GITHUB_STEP_SUMMARY=str(summary), GITHUB_OUTPUT=str(output))
    try:
        run = cli(tmp_path / "empty", "--ci", "github")
    finally:
        del os.environ["GITHUB_STEP_SUMMARY"], os.environ["GITHUB_OUTPUT"]
    assert run.returncode == 2 and "no assignment found" in run.stderr
    assert "the check could not run" in summary.read_text() and "no assignment found" in summary.read_text()
    payload = _decode(output)
    assert payload["status"] == "error" and payload["max_score"] == 0 and "no assignment found" in payload["tests"][0]["message"]
