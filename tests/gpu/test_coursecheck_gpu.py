"""On a GPU, `grader course check` times each reference beside torch's baseline: the shipped
course's vector_add reference is no slower than torch's add (a slower one would be named with its
file and line, exit 1: tests/kit/test_coursecheck.py drives that with a fake clock)."""

from __future__ import annotations

import re

import pytest

from tests.conftest import run_cli

pytestmark = pytest.mark.gpu


def test_the_shipped_vector_add_reference_is_not_slower_than_torchs_baseline(tmp_path):
    run = run_cli(["course", "check", "--device", "cuda", "-a", "vector_add"], tmp_path)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "the references timed on the GPU" in run.stdout, run.stdout
    timed = re.search(r"vector_add: reference takes (\d+\.\d+) ms, torch's baseline (\d+\.\d+) ms \((\d+\.\d+)x\) "
                      r"on n=2\^28 \[float32\]", run.stdout)
    assert timed, run.stdout
    reference_ms, baseline_ms, ratio = map(float, timed.groups())
    assert 0 < reference_ms and 0 < baseline_ms and ratio <= 1.10  # 2^28 floats: far from a launch's cost
    assert "the speed of the references was not checked" not in run.stdout
    assert "slower bar" not in run.stderr
