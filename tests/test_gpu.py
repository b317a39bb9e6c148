"""On a GPU: verdicts, performance figures, and timing cheats that must earn no speed credit.

Skipped, with the reason, where no CUDA GPU is visible (see conftest)."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.gpu


def test_good_submission_passes_on_the_gpu_with_speed_figures(submission, cli):
    run = cli(submission("good"), "--seed", "3", "--device", "cuda", "-a", "vector_add", "-a", "softmax")
    assert run.returncode == 0, run.stdout + run.stderr
    assert {t["outcome"] for t in run.results["tests"]} == {"passed"}, [t["output"] for t in run.results["tests"] if t["outcome"] != "passed"]
    for assignment in ("vector_add", "softmax"):
        perf = [t for t in run.tests_of(assignment) if t["tags"][1] == "performance"][0]
        figures = perf["extra_data"]["details"]["figures"]
        assert set(figures) == {"student", "reference", "torch"}
        assert all(f["gbps"] > 0 and 0 < f["roofline_pct"] < 120 for f in figures.values())
        lo, hi = perf["extra_data"]["details"]["ratio_interval"]
        assert lo <= perf["extra_data"]["details"]["ratio_to_reference"] <= hi
    assert run.results["extra_data"]["environment"]["roofline"]["copy_gbps"] > 500
    assert "<svg" in run.report


def test_buggy_submission_fails_on_the_gpu_too(submission, cli):
    run = cli(submission("row_stride"), "--seed", "3", "--device", "cuda", "-a", "softmax", "--case", "sliced-97x300")
    assert run.returncode == 1
    for dtype in ("float32", "float16", "bfloat16"):
        t = run.test("softmax", f"sliced-97x300 [{dtype}]")
        assert t["outcome"] == "failed" and "row 0 is right" in t["output"]


def test_ten_percent_slower_is_measured_slower(submission, cli):
    run = cli(submission("gpu/slow10"), "--seed", "3", "--device", "cuda", "--case", "n=1", "--case", "1x1", "--dtype", "float32")
    for assignment in ("vector_add", "softmax"):
        perf = [t for t in run.tests_of(assignment) if t["tags"][1] == "performance"][0]
        assert perf["outcome"] == "passed", perf["output"]
        assert perf["extra_data"]["details"]["ratio_interval"][0] > 1.0, perf["output"]


CHEATS = {
    "cheat_side_stream": "by the grader's clock",
    "cheat_thread": "",  # caught by the clock, by wrong timed outputs, or already by correctness: whichever the race gives
    "cheat_cache": "wrong results on input set",
    "cheat_first_n": "wrong results on",
    "cheat_patch_elapsed": "torch.cuda.Event.elapsed_time",
    "cheat_patch_sync": "torch.cuda.synchronize",
    "cheat_vendor_large": "aten::add.Tensor ran inside vector_add()",
}


@pytest.mark.parametrize("fixture", sorted(CHEATS))
def test_timing_cheats_are_flagged_with_evidence(submission, cli, fixture):
    run = cli(submission(f"gpu/{fixture}"), "--seed", "3", "--device", "cuda", "-a", "vector_add", "--case", "n=1048577")
    perf = [t for t in run.tests_of("vector_add") if t["tags"][1] == "performance"][0]
    if fixture == "cheat_thread" and perf["outcome"] == "failed":
        # the thread had not written the result when the correctness call returned it
        wrong = [t for t in run.tests_of("vector_add") if t["tags"][1] == "correctness" and t["outcome"] == "failed"]
        assert wrong and "not timed" in perf["output"], perf["output"]
    else:
        assert perf["outcome"] == "flagged", perf["output"]
        assert "no speed credit" in perf["output"] and CHEATS[fixture] in perf["output"]
    assert perf["score"] == 0 and run.results["score"] == 0
    assert run.returncode == 1


def test_missing_mask_is_caught_on_a_gpu_run_by_the_interpreter_bounds_check(submission, cli):
    run = cli(submission("missing_mask"), "--seed", "3", "--device", "cuda", "-a", "vector_add", "--case", "n=1048577", "--dtype", "float32")
    check = next(t for t in run.tests_of("vector_add") if t["name"].startswith("vector_add: memory safety"))
    assert check["outcome"] == "failed" and "out-of-bounds load" in check["output"]
    assert 'kernels/vector_add.py", line 11' in check["output"]
    perf = next(t for t in run.tests_of("vector_add") if t["tags"][1] == "performance")
    assert perf["score"] == 0 and "not timed" in perf["output"]
    assert run.returncode == 1
