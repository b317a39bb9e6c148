"""`grader check --profile` on the GPU, with Nsight Compute: the correct sample has no gap to
explain, and each deliberately slow fixture (tests/fixtures/gpu/profile_*) hears its real cause.
Skipped, with the reason, without a GPU, without ncu, or where the counters are open to admin
users only (the profile then says so itself: tests/judge/test_profiling.py)."""

from __future__ import annotations

import re

import pytest

from tests.conftest import has_gpu
from grader.judge import profiling

WHY_NOT = profiling.unavailable("cuda" if has_gpu() else "cpu", "sandbox")
pytestmark = [pytest.mark.skipif(bool(WHY_NOT), reason=WHY_NOT or "-"), pytest.mark.slow]


def _profiled(cli, submission, fixture: str, assignment: str):
    run = cli(submission(fixture), "-a", assignment, "--profile")
    assert run.returncode in (0, 1), run.stderr
    assert f"profile of {assignment}: your kernel takes" in run.stdout, run.stdout + run.stderr
    assert '<h3 id="profile-' + assignment + '">Profile (Nsight Compute)</h3>' in run.report
    return run.stdout


def test_the_correct_sample_has_no_gap_to_explain(cli, submission):
    """The correct sample is the reference's match within the speed score's full-points band: within
    CLOSE the profile says there is no gap; a little above it (seen on an H200: the sample's memory
    throughput 76% against the reference's 84%, the speed score 7.9 of 8), it names what differs,
    and never a gap of the size the slow fixtures below have."""
    from grader.profile.explain import CLOSE

    out = _profiled(cli, submission, "good", "softmax")
    ratio = float(re.search(r"profile of softmax: your kernel takes (\d+\.\d+)x", out).group(1))
    assert ratio < 1.25, out
    if ratio <= CLOSE:
        assert "the reference's time under the profiler: no gap to explain" in out, out
    else:
        assert re.search(r"^  - ", out, re.M), out


def test_a_softmax_that_reads_its_input_twice_is_told_the_bytes(cli, submission):
    out = _profiled(cli, submission, "gpu/profile_two_pass", "softmax")
    first = next(ln for ln in out.splitlines() if ln.startswith("  - "))
    # it reads its input twice: 1.07 GB read and 0.55 GB written against the reference's 1.05 GB in all, 1.55x
    assert re.match(r"  - your kernel moves 1\.[4-6]x the bytes the reference moves", first), out


def test_a_block_of_one_warp_is_told_blocks_per_sm(cli, submission):
    out = _profiled(cli, submission, "gpu/profile_tiny_block", "vector_add")
    first = next(ln for ln in out.splitlines() if ln.startswith("  - "))
    assert first.startswith("  - block size 32: occupancy limited by blocks per SM"), out


def test_a_warp_holding_a_whole_row_is_told_its_registers(cli, submission):
    out = _profiled(cli, submission, "gpu/profile_many_registers", "softmax")
    assert re.search(r"  - occupancy \d+%: \d+ registers per thread", out), out
