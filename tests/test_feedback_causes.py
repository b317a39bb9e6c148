"""Feedback that names a failure's true cause and shows its smallest case.

Each cause has a buggy fixture (tests/fixtures/<name>/, overlaid on `good`) run through the real
CLI in the interpreter, or a result made by hand from what a kernel with that bug computes.
"""

from __future__ import annotations

import pytest
import torch

from conftest import has_gpu
from grader import spec as specs

cpu_only = pytest.mark.skipif(has_gpu(), reason="these expectations are for the CPU interpreter")


# -- a module without its function, a module that does not import: one result each ----------

@cpu_only
@pytest.mark.slow
def test_a_missing_function_is_one_not_submitted_result_worth_its_points(submission, cli):
    run = cli(submission("layernorm_no_backward"), "-a", "layernorm_backward", "-a", "layernorm", "--case", "one-row-1x1024",
              "--seed", "3")
    assert run.returncode == 1, run.stdout + run.stderr
    shown = [t for t in run.tests_of("layernorm_backward") if t["status"] != "skipped" and "GPU" not in t["name"]]
    assert [t["name"] for t in shown] == ["layernorm_backward: not submitted"], shown
    (test,) = shown
    assert "kernels/layernorm.py defines no function layer_norm_backward()" in test["output"]
    spec = specs.get("layernorm_backward")
    planned = len(spec.dtypes) * (len(spec.cases) + 3)
    # the one case that ran (of the full run's), float32 and float16 here: its share of the points, nothing earned
    assert test["score"] == 0 and test["max_score"] > 0
    assert run.stdout.count("defines no function") <= 2, run.stdout  # its line, and once in what went wrong: not once per case
    # the forward pass in the same module is graded as usual
    assert run.test("layernorm", "one-row-1x1024 [float32]")["status"] == "passed"
    assert planned > 1


def test_a_missing_function_over_a_whole_run_is_worth_every_point(submission, tmp_path):
    from grader.judge.context import GradingContext
    from grader.judge.grade import grade_assignment
    from grader.submission import open_submission

    spec = specs.get("layernorm_backward")
    sub = open_submission(submission("layernorm_no_backward"))
    result = grade_assignment(sub, spec, GradingContext("cpu", 1), tmp_path / "work")
    bad = [t for t in result.tests if t.outcome != "skipped"]
    assert [t.name for t in bad] == ["not submitted"]  # not 24 errors, one per case
    assert bad[0].details["missing_function"] == "layer_norm_backward"
    assert result.max_score == spec.max_points and result.score == 0


@cpu_only
@pytest.mark.slow
def test_a_module_that_does_not_import_is_one_error_with_the_students_lines(submission, cli):
    run = cli(submission("import_name_error"), "-a", "softmax", "--seed", "3", "--dtype", "float32")
    assert run.returncode == 1, run.stdout + run.stderr
    shown = [t for t in run.tests_of("softmax") if t["status"] != "skipped" and "GPU" not in t["name"]]
    assert [t["name"] for t in shown] == ["softmax: import"], [t["name"] for t in shown]
    out = shown[0]["output"]
    assert "importing kernels/softmax.py failed" in out and "NameError" in out and "BLOKC_SIZE" in out
    assert 'File "kernels/softmax.py", line 7' in out  # the student's line, not the worker's frames
    assert "grader/worker" not in out and "importlib" not in out
    assert run.stdout.count("NameError") <= 3, run.stdout  # its line, what went wrong and its traceback: not once per case
