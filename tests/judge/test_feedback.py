"""What a student sees: verdicts that name the right cause, output that fits, points that add up.

The judge-level tests make the buggy result by hand, from first principles (what a kernel
with that bug computes), and need no worker; the CLI tests run the real command.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tests.conftest import COURSE, REPO_ROOT, has_gpu, run_cli
from grader import spec as specs
from grader.judge.feedback import group_failures, headline, points_line, run_total
from grader.judge.context import GradingContext
from grader.judge.grade import grade_assignment
from grader.judge.integrity import OwnKernelCheck
from grader.judge.session import open_session
from grader.judge.verdict import judge_call
from grader.judge.mismatch import contiguous_reading
from grader.codec import storage_of
from grader.judge.plan import make_inputs
from grader.results import AssignmentResult, TestResult
from grader.batch.roster import RosterError, load_roster
from grader.judge.scoring import score_assignment
from grader.submission import open_submission
from grader.settings import Settings

cpu_only = pytest.mark.skipif(has_gpu(), reason="these expectations are for the CPU interpreter")


def _judge(name: str, case, dtype: str, out):
    """The judge's verdict on `out(spec, inputs)`: a tensor, or a tuple for a function with several results."""
    spec = COURSE.get(name)
    inputs = make_inputs(spec, case, dtype, 0)
    saved = {f"input.{k}": storage_of(v) for k, v in inputs.items() if isinstance(v, torch.Tensor)}
    result = out(spec, inputs)
    if isinstance(result, tuple):
        saved.update({f"output.{i}": r for i, r in enumerate(result)})
        reply = {"result_type": "tuple", "outputs": [{"device": "cpu", "dtype": dtype} for _ in result]}
    else:
        saved["output"] = result
        reply = {"device": "cpu", "dtype": str(result.dtype).removeprefix("torch."), "result_type": "Tensor"}
    return judge_call(spec, case, dtype, inputs, reply, saved, "cpu")


# -- the stride hypothesis, for every assignment with a strided or transposed case ----------

def _strided_cases():
    """(assignment, case, input name) for every named case with a non-contiguous tensor input,
    in every assignment judged against a reference (not a property check)."""
    found = []
    for spec in COURSE.catalogue().values():
        if spec.check is not None or spec.calls is not None:
            continue
        for case in spec.cases:
            inputs = make_inputs(spec, case, "float32", 0)
            for name, t in inputs.items():
                if isinstance(t, torch.Tensor) and not t.is_contiguous() and contiguous_reading(t) is not None:
                    found.append(pytest.param(spec.name, case, name, id=f"{spec.name}-{case.name}-{name}"))
    return found


STRIDED = _strided_cases()


def test_every_strided_assignment_is_covered():
    # the catalogue's strided and transposed cases: vector_add, softmax, matmul_relu, conv2d at least
    assert {p.values[0] for p in STRIDED} >= {"vector_add", "softmax", "matmul_relu", "conv2d"}


@pytest.mark.parametrize("assignment,case,name", STRIDED)
def test_reading_an_input_as_contiguous_is_named_as_a_stride_bug(assignment, case, name):
    """The result a kernel computes when it reads `name` as if it were contiguous: the verdict
    must name the strides, never a mask, the grid or the last block."""
    def buggy(spec, inputs):
        args = {k: (contiguous_reading(v) if k == name else v) for k, v in inputs.items()}
        out = spec.truth(*[a.to(torch.float64) if isinstance(a, torch.Tensor) else a for a in args.values()])
        if isinstance(out, (tuple, list)):  # every part computed from the misread input
            return tuple(o.to(inputs[name].dtype) for o in out)
        return out.to(inputs[name].dtype)

    verdict = _judge(assignment, case, "float32", buggy)
    assert verdict.outcome == "failed"
    assert "stride" in verdict.details.pattern and name in verdict.details.pattern, verdict.message
    for wrong_cause in ("mask (offsets < n)", "partial block", "grid size", "row offset is off"):
        assert wrong_cause not in verdict.details.pattern, verdict.message


def test_vector_add_strided_read_is_not_blamed_on_the_mask():
    spec = COURSE.get("vector_add")
    case = next(c for c in spec.cases if c.name == "strided-n=65537")
    verdict = _judge("vector_add", case, "float32", lambda s, i: contiguous_reading(i["x"]) + i["y"])
    assert "reading x as if it were contiguous" in verdict.message and "x.stride() == (2,)" in verdict.message
    assert "check your mask" not in verdict.message


def test_a_real_tail_bug_on_a_strided_input_is_still_a_tail_bug():
    # the other direction: strides read right, the last element never stored; the hypothesis must not fire
    spec = COURSE.get("vector_add")
    case = next(c for c in spec.cases if c.name == "strided-n=65537")

    def tail_missing(s, i):
        out = i["x"] + i["y"]
        out[65536:] = float("nan")
        return out

    verdict = _judge("vector_add", case, "float32", tail_missing)
    assert "only elements from index 65536 on are wrong" in verdict.message
    assert "contiguous" not in verdict.message


# -- NaN and inf are counted ---------------------------------------------------------------

def test_an_all_nan_output_says_how_many_elements_are_nan():
    spec = COURSE.get("vector_add")
    case = next(c for c in spec.cases if c.name == "n=127")
    verdict = _judge("vector_add", case, "float32", lambda s, i: torch.full_like(i["x"], float("nan")))
    assert verdict.details.nan_elements == 127 and verdict.details.bad_elements == 127
    assert "127 elements are NaN" in verdict.message


def test_a_few_nan_and_inf_elements_are_counted_apart():
    spec = COURSE.get("vector_add")
    case = next(c for c in spec.cases if c.name == "n=129")

    def some_bad(s, i):
        out = i["x"] + i["y"]
        out[[3, 50, 100]] = float("nan")
        out[7] = float("inf")
        return out

    verdict = _judge("vector_add", case, "float32", some_bad)
    assert verdict.details.nan_elements == 3 and verdict.details.inf_elements == 1
    assert "3 elements are NaN, 1 is infinite" in verdict.message
    # right elements elsewhere: no NaN words for an honest result
    honest = _judge("vector_add", case, "float32", lambda s, i: i["x"] + i["y"])
    assert honest.outcome == "passed" and honest.details.nan_elements is None


# -- the integrity check does not vouch for nothing -----------------------------------------

def _planned(name="vector_add"):
    from grader.judge.plan import plan_calls

    return plan_calls(COURSE.get(name), 1, True)[0]


def test_no_kernel_launched_is_not_a_pass():
    check = OwnKernelCheck(COURSE.get("vector_add"))
    check.observe(_planned(), {"launches": {}, "ops": []}, passed=False)
    result = check.test()
    assert result.outcome != "passed"
    assert "no Triton kernel was launched" in result.message


def test_a_launched_kernel_still_passes():
    check = OwnKernelCheck(COURSE.get("vector_add"))
    check.observe(_planned(), {"launches": {"add_kernel": 1}, "ops": []}, passed=True)
    assert check.test().outcome == "passed"


# -- the starter: one headline, one diagnosis for all its cases -----------------------------

def _nan_test(case: str, dtype: str) -> TestResult:
    pattern = "every element is NaN, the poison that fills uninitialized memory: the output was never written"
    return TestResult("vector_add", "correctness", f"{case} [{dtype}]", "failed", f"10 of 10 elements wrong; {pattern}",
                      case=case, dtype=dtype, details={"elements": 10, "nan_elements": 10, "unwritten_elements": 10, "bad_elements": 10,
                                                       "pattern": pattern, "kernels": {}})


def test_starter_headline_names_the_file_and_its_todos(tmp_path):
    module = tmp_path / "kernels" / "vector_add.py"
    module.parent.mkdir()
    module.write_text((REPO_ROOT / "assignments" / "vector_add" / "starter" / "kernels" / "vector_add.py").read_text())
    result = AssignmentResult("vector_add", "Vector addition", "kernels/vector_add.py:vector_add()",
                              [_nan_test(c, d) for c in ("n=1", "n=127", "n=128") for d in ("float32", "float16")])
    words = headline(result, module)
    assert words.startswith("the kernel stores nothing yet")
    assert "fill in the TODOs in kernels/vector_add.py" in words
    groups = group_failures(result.tests)
    assert len(groups) == 1 and len(groups[0].tests) == 6
    assert groups[0].cases == "n=1, n=127, n=128 (float32, float16)"


def _oob_test(case: str, dtype: str, lanes: int, program: int, line: int = 11) -> TestResult:
    message = (f"out-of-bounds load in program ({program}, 0, 0): {lanes} of 1024 lanes fall outside the tensor "
               "(the first lies 1 element(s) past the end of x_ptr); mask this load (e.g. mask=offsets < n)")
    trace = (f'  File "kernels/vector_add.py", line 19, in vector_add\n    File "kernels/vector_add.py", line {line}, '
             f"in add_kernel\n  OutOfBounds: {message}")
    return TestResult("vector_add", "correctness", f"{case} [{dtype}]", "failed", message, case=case, dtype=dtype,
                      traceback=trace)


def test_one_bug_in_many_cases_is_one_group_and_another_line_is_its_own():
    """The lane counts and program ids of a missing mask differ from case to case: one group, every case
    and dtype in it. The same words at another line of the kernel (the other load) are another change."""
    tests = [_oob_test(c, d, lanes, prog) for c, lanes, prog in (("n=1", 1023, 0), ("n=1023", 1, 0), ("n=4095", 1, 3))
             for d in ("float32", "float16")]
    tests.append(_oob_test("n=129", "float32", 895, 0, line=12))
    groups = group_failures(tests)
    assert [len(g.tests) for g in groups] == [6, 1]
    assert groups[0].cases == "n=1, n=1023, n=4095 (float32, float16)"
    assert "mask this load" in groups[0].diagnosis
    # a different fix on the same line is a different block too
    other = _oob_test("n=7", "float32", 3, 0)
    other.message = "ValueError: shapes differ"
    assert len(group_failures([*tests, other])) == 3


def test_starter_headline_of_one_check_says_the_check(tmp_path):
    """A replayed failure (--case/--dtype) is one check: "in the one check it ran", not "in all 1 checks"."""
    result = AssignmentResult("vector_add", "Vector addition", "kernels/vector_add.py:vector_add()",
                              [_nan_test("n=1", "float32")])
    words = headline(result, None)
    assert "(NaN) in the one check it ran;" in words and "all 1" not in words
    result.tests.append(_nan_test("n=1", "float16"))
    assert "(NaN) in all 2 checks;" in headline(result, None)


def test_no_headline_when_one_case_is_right(tmp_path):
    ok = TestResult("vector_add", "correctness", "n=129 [float32]", "passed", "fine", case="n=129", dtype="float32")
    result = AssignmentResult("vector_add", "t", "m", [_nan_test("n=1", "float32"), ok])
    assert headline(result, None) == ""


# -- a partial run's points ------------------------------------------------------------------

def test_a_partial_run_shows_its_share_out_of_the_assignments_total():
    spec = COURSE.get("vector_add")  # 6 correctness points, here over a full run of 39 tests
    planned = ["n=127 [float16]"] + [f"other-{i} [float32]" for i in range(38)]
    result = AssignmentResult("vector_add", "Vector addition", "m",
                              [TestResult("vector_add", "correctness", "n=127 [float16]", "passed", "", case="n=127", dtype="float16")])
    score_assignment(spec, result, planned=planned)
    # 600 hundredths over 39 tests: 15 each and 15 left over, so the first 15 (this one among them) get 16
    assert result.score == 0.16 and result.max_score == 0.16
    result.partial = {"cases_run": 1, "cases": len(planned), "assignment_points": spec.max_points}
    line = points_line(result)
    # the share the cases that ran can earn, out of the same total the line starts with (never "worth 0.16" beside "/ 10")
    assert line == "0.16 / 10 points (partial run: 1 of 39 cases ran, which can earn 0.16 of the 10 here)"
    assert run_total([result]) == 10


def test_a_partial_cpu_run_counts_only_the_points_it_can_earn_there():
    """The speed check is skipped on a CPU: its 4 points are not among what the run can earn there."""
    result = AssignmentResult("vector_add", "Vector addition", "m", [
        TestResult("vector_add", "correctness", "n=1 [float32]", "passed", "", case="n=1", dtype="float32",
                   score=0.29, max_score=0.29),
        TestResult("vector_add", "performance", "speed", "skipped", "needs a GPU", max_score=4)])
    result.partial = {"cases_run": 1, "cases": 21, "assignment_points": 10}
    assert points_line(result) == ("0.29 / 10 points (partial run: 1 of 21 cases ran, which can earn 0.29 of the 10 "
                                   "here; 4 more need a GPU)")


def test_small_words_nan_error_points_and_the_one_line_cut():
    """NaN is named NaN (never 'max abs error 0'); a check worth no points is passed or failed, not 0/0;
    the report's one-line cause ends at a word."""
    from grader.judge.feedback import error_words, points_words
    from grader.payloads import CorrectnessPayload
    from grader.report import CAUSE_CHARS, _one_line

    nan = CorrectnessPayload(max_abs_error=0.0, max_rel_error=0.0, bad_elements=10, elements=10, nan_elements=10)
    words = error_words(nan)
    assert words == "10 of 10 elements wrong: every element is NaN (10 elements are NaN), so no error can be measured"
    some = CorrectnessPayload(max_abs_error=0.5, max_rel_error=0.25, bad_elements=4, elements=10, nan_elements=3)
    assert "3 elements are NaN; the errors below are over the finite ones" in error_words(some)
    assert "max abs error 0.5" in error_words(some)
    integrity = TestResult("vector_add", "integrity", "uses its own Triton kernel", "passed", "ok")
    assert points_words(integrity) == ""
    speed = TestResult("vector_add", "performance", "speed", "failed", "slow", score=1, max_score=4)
    assert points_words(speed) == " (1/4)"
    line = _one_line("word " * 100)
    assert len(line) <= CAUSE_CHARS and line.endswith("word\u2026"), line
    long = _one_line("x" * 500)  # one word longer than the line: cut, there is no end of a word to cut at
    assert len(long) == CAUSE_CHARS


# -- not submitted ---------------------------------------------------------------------------

def test_a_missing_module_is_one_not_submitted_result(tmp_path):
    repo = tmp_path / "repo"
    (repo / "kernels").mkdir(parents=True)
    sub = open_submission(repo)
    spec = COURSE.get("softmax")
    result = grade_assignment(open_session(GradingContext("cpu", 1), Settings()), sub, spec, tmp_path / "work")
    assert [t.name for t in result.tests if t.outcome != "skipped"] == ["not submitted"]
    (test,) = [t for t in result.tests if t.outcome != "skipped"]
    assert test.outcome == "failed" and "kernels/softmax.py is not in the submission" in test.message
    # out of the spec's whole total, nothing earned; the result is worth what the cases that run here
    # are worth (float32 and float16 of 3 dtypes, to the cent), the rest needs a GPU
    assert result.max_score == spec.max_points == 20 and result.score == 0
    assert test.max_score == pytest.approx(spec.correctness_points * 2 / 3, abs=0.01 * 40)
    assert result.skipped_points == pytest.approx(20 - test.max_score, abs=1e-9)


# -- the roster names the missing column -------------------------------------------------------

def test_roster_without_its_repo_column_names_it(tmp_path):
    roster = tmp_path / "roster.csv"
    roster.write_text("student\nalice\n")
    with pytest.raises(RosterError, match="has no repo column"):
        load_roster(roster)


# -- SyntaxError: the line and a caret --------------------------------------------------------

def test_syntax_error_traceback_shows_the_line_and_a_caret(tmp_path):
    from grader.worker.server import _student_traceback

    (tmp_path / "kernels").mkdir()
    (tmp_path / "kernels" / "broken.py").write_text("x = 1\ndef f(a)\n    return a\n")
    try:
        compile((tmp_path / "kernels" / "broken.py").read_text(), str(tmp_path / "kernels" / "broken.py"), "exec")
    except SyntaxError as exc:
        text = _student_traceback(exc, [str(tmp_path)])
    lines = text.splitlines()
    assert 'File "kernels/broken.py", line 2' in lines[0]
    assert lines[1].strip() == "def f(a)" and lines[2].strip() == "^"
    assert lines[-1].startswith("SyntaxError")
    assert str(tmp_path) not in text


# -- grader list fits ---------------------------------------------------------------------------

def _grader(*args: str, env: dict | None = None, cwd: Path = REPO_ROOT) -> subprocess.CompletedProcess:
    env = dict(os.environ, **(env or {}), PYTHONPATH=str(REPO_ROOT))
    return subprocess.run([sys.executable, "-m", "grader", *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=300)


def test_list_piped_or_narrow_shows_full_names():
    for columns in ("80", "40"):
        run = _grader("list", env={"COLUMNS": columns})
        assert run.returncode == 0
        assert "…" not in run.stdout
        for s in COURSE.catalogue().values():
            assert f"{s.name}: {s.title}" in run.stdout and s.module in run.stdout and s.signature in run.stdout


def test_list_json():
    run = _grader("list", "--json")
    data = json.loads(run.stdout)
    assert [d["name"] for d in data] == list(COURSE.catalogue())
    first = data[0]
    spec = COURSE.get(first["name"])
    assert first["module"] == spec.module and first["correctness_points"] == spec.correctness_points
    assert first["named_cases"] == [c.name for c in spec.cases]


# -- grader.toml that names a missing file -------------------------------------------------------

def test_grader_toml_naming_a_missing_file_is_said(tmp_path):
    repo = tmp_path / "repo"
    repo.mkdir()
    (repo / "grader.toml").write_text('[assignments.softmax]\nmodule = "src/my_softmax.py"\n')
    run = _grader("check", str(repo), cwd=tmp_path)
    assert run.returncode == 2
    assert "no assignment found" in run.stderr
    assert 'grader.toml sets [assignments.softmax] module = "src/my_softmax.py"' in run.stderr
    assert "does not exist" in run.stderr


# -- end to end -------------------------------------------------------------------------------------

def _git(repo: Path, *args: str) -> str:
    env = dict(os.environ, GIT_AUTHOR_NAME="s", GIT_AUTHOR_EMAIL="s@example.edu", GIT_COMMITTER_NAME="s",
               GIT_COMMITTER_EMAIL="s@example.edu")
    return subprocess.run(["git", *args], cwd=repo, env=env, check=True, capture_output=True, text=True).stdout


@cpu_only
@pytest.mark.slow
def test_untouched_starter_says_so_first_and_leaves_the_repo_clean(tmp_path):
    repo = tmp_path / "student"
    import shutil

    shutil.copytree(REPO_ROOT / "assignments" / "vector_add" / "starter", repo)
    _git(repo, "init", "-q")
    _git(repo, "add", "-A")
    _git(repo, "commit", "-qm", "starter")
    run = _grader("check", ".", "--seed", "5", "--case", "n=1", "--case", "n=127", "--case", "n=129", cwd=repo,
                  env={"COLUMNS": "200"})
    assert run.returncode == 1, run.stdout + run.stderr
    lines = [line for line in run.stdout.splitlines()[1:] if line.strip() and not line.startswith("  [")]  # past the progress lines
    assert lines[0].startswith("vector_add: the kernel stores nothing yet"), lines[:4]
    assert "fill in the TODOs in kernels/vector_add.py" in lines[0]
    # one entry for the six identical diagnoses, which lists its cases
    wrong = run.stdout.split("What went wrong", 1)[1]
    assert wrong.count("every element is NaN") == 1
    assert "6 checks (n=1, n=127, n=129 (float32, float16))" in wrong
    assert "uses its own Triton kernel: passed" not in run.stdout
    # the results are written where git does not see them, and the command says where
    assert "results: .grader/results.json" in run.stdout
    assert _git(repo, "status", "--porcelain") == ""
    results = json.loads((repo / ".grader" / "results.json").read_text())
    assert results["extra_data"]["assignments"]["vector_add"]["headline"].startswith("the kernel stores nothing yet")
    # Gradescope's own fields say the one cause too: in the output on top, and first under each failure
    assert "vector_add: the kernel stores nothing yet" in results["output"]
    failed = [t for t in results["tests"] if t.get("status") == "failed" and t["outcome"] == "failed"]
    assert failed and all(t["output"].startswith("Cause: the kernel stores nothing yet") for t in failed)


@cpu_only
@pytest.mark.slow
def test_replaying_one_case_reports_a_partial_score(submission, cli):
    spec = COURSE.get("vector_add")
    planned = (len(spec.cases) + 3) * len(spec.dtypes)
    run = cli(submission("good"), "-a", "vector_add", "--case", "n=127", "--dtype", "float16", "--seed", "4")
    assert run.returncode == 0, run.stdout + run.stderr
    # its share of the full run: 600 hundredths over the planned tests, to the hundredth (one more for the first ones)
    share = run.results["score"]
    assert share in (spec.correctness_points * 100 // planned / 100, (spec.correctness_points * 100 // planned + 1) / 100)
    assert f"{share:g} / {spec.max_points:g} points (partial run: 1 of {planned} cases" in run.stdout
    assert "partial run" in run.report


@cpu_only
@pytest.mark.slow
@pytest.mark.parametrize("fixture,args,cause", [
    ("missing_mask", ["--case", "n=127"], "mask"),
    ("va_ignores_strides", ["--case", "strided-n=65537"], "reading x as if it were contiguous"),
    ("floor_grid", ["--case", "n=1048577"], "triton.cdiv"),
    ("writes_nothing", ["--case", "n=129"], "never written"),
])
def test_held_out_style_bugs_name_their_cause_and_draw_it(submission, cli, fixture, args, cause):
    run = cli(submission(fixture), "-a", "vector_add", "--dtype", "float32", "--seed", "9", *args)
    assert run.returncode == 1
    (bad,) = [t for t in run.tests_of("vector_add") if t["outcome"] == "failed" and "correctness" in t["tags"]]
    assert cause in bad["output"], bad["output"]
    if fixture != "missing_mask":  # the bounds check's failure has no values to draw
        assert 'class="wrongmap"' in run.report


@cpu_only
@pytest.mark.slow
def test_grade_with_nobody_fetched_exits_1(tmp_path):
    roster = tmp_path / "roster.csv"
    roster.write_text("student,repo\nalice,repos/nowhere\n")
    run = run_cli(["grade", "--roster", str(roster), "--out", "out", "--device", "cpu", "-a", "vector_add",
                   "--case", "n=1", "--dtype", "float32"], tmp_path)
    assert run.returncode == 1, run.stdout + run.stderr
    assert "nothing was graded: no student could be fetched" in run.stderr


@cpu_only
@pytest.mark.slow
def test_class_batch_shows_a_missing_module_as_not_submitted(tmp_path):
    from tests.classbuild import commit, make_class

    roster = make_class(tmp_path, {"frank": "good"})
    repo = tmp_path / "repos" / "frank"
    (repo / "kernels" / "softmax.py").unlink()
    commit(repo, "no softmax", "2025-01-11T12:00:00+00:00")
    quick = ["--device", "cpu", "-a", "vector_add", "-a", "softmax", "--case", "n=1", "--case", "1x1", "--dtype", "float32",
             "--seed", "3"]
    run = run_cli(["grade", "--roster", str(roster), "--out", "out", *quick], tmp_path)
    assert run.returncode == 0, run.stdout + run.stderr
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    (student,) = summary["students"]
    cells = student["assignments"]
    assert cells["softmax"]["outcomes"] == {"not submitted": 1}
    assert cells["softmax"]["score"] == 0 and cells["softmax"]["max_score"] > 0
    assert cells["vector_add"]["outcomes"].get("passed", 0) >= 1 and "not submitted" not in cells["vector_add"]["outcomes"]
    dashboard = (tmp_path / "out" / "index.html").read_text()
    assert '<div class="small">not submitted</div>' in dashboard and "error" not in cells["softmax"]["outcomes"]


def test_a_failures_text_is_shown_once_not_again_at_the_end_of_its_traceback():
    from grader.judge.feedback import traceback_tail

    tb = ('Traceback (most recent call last):\n  File "kernels/vector_add.py", line 22, in vector_add\n'
          "    add_kernel[grid](x, y, out, n)\nModuleNotFoundError: No module named 'triton.experimental'\n")
    t = TestResult("vector_add", "correctness", "n=1", "error",
                   "vector_add() raised: \nModuleNotFoundError: No module named 'triton.experimental'", traceback=tb)
    tail = traceback_tail(t)
    assert tail.endswith("    add_kernel[grid](x, y, out, n)") and "ModuleNotFoundError" not in tail
    t.message = "vector_add() raised: ValueError: something else"  # a traceback that says more keeps it
    assert traceback_tail(t).endswith("No module named 'triton.experimental'")


def test_piped_a_check_says_how_far_it_is_and_wraps_no_line(monkeypatch):
    """In a pipe rich draws no bar until the end and wraps at 80 columns: a check shows progress
    lines instead, and a long line (a reproducer) stays one line."""
    import io

    from grader.cli import check, common

    out = io.StringIO()
    piped = common.Console(file=out, highlight=False, emoji=False)
    assert not piped.is_terminal
    monkeypatch.setattr(check, "console", piped)
    monkeypatch.setattr(check, "PIPED_PROGRESS_EVERY", 0.0)
    with check._progress(3) as step:
        step("vector_add: n=1/float32")
        step("vector_add: n=127/float32")
    lines = out.getvalue().splitlines()
    assert lines[0].strip() == "[0/3] starting the workers" and lines[-1].strip().startswith("[2/3,")
    assert lines[-1].endswith("vector_add: n=127/float32")
    proc = subprocess.run([sys.executable, "-c", "from grader.cli.common import console; "
                           "console.print('reproduce: grader check . -a vector_add --case n=1 --dtype float32 --seed ' + '8' * 90)"],
                          capture_output=True, text=True, env={k: v for k, v in os.environ.items() if k not in ("COLUMNS", "GITHUB_ACTIONS")})
    assert len(proc.stdout.strip().splitlines()) == 1 and proc.stdout.strip().endswith("8" * 90), proc.stdout
