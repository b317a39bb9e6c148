"""The bounds check that GPU runs replay in the CPU interpreter (runs here: it never needs a GPU)."""

import pytest

from grader import spec as specs
from grader.judge.context import GradingContext
from grader.judge.grade import _bounds_check
from grader.submission import open_submission


def _check(submission, tmp_path, fixture):
    sub = open_submission(submission(fixture))
    sub.private_copy(tmp_path / "work" / "repo")
    spec = specs.get("vector_add")
    return _bounds_check(spec, GradingContext("cuda", seed=4), sub.target(spec), tmp_path / "work", 60)


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
