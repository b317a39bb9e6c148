"""results.json in Gradescope's schema, and the scoring rules."""

from grader import spec as specs
from grader.results import AssignmentResult, RunResult, TestResult
from grader.scoring import score_assignment


def _result(outcomes, perf=None):
    a = AssignmentResult("vector_add", "Vector addition", "kernels/vector_add.py:vector_add()")
    for i, o in enumerate(outcomes):
        a.tests.append(TestResult("vector_add", "correctness", f"case{i}", o, "msg", dtype="float32"))
    if perf:
        a.tests.append(TestResult("vector_add", "performance", "perf", perf[0], "msg", details={"score_fraction": perf[1]}))
    return a


def test_skipped_tests_carry_no_points_but_say_their_worth():
    a = _result(["passed", "passed", "skipped"], perf=("skipped", 0))
    score_assignment(specs.get("vector_add"), a)
    assert (a.score, a.max_score) == (4.0, 4.0)
    assert a.skipped_points == 2.0 + 4.0


def test_performance_follows_the_curve_and_a_flag_takes_everything():
    a = _result(["passed", "passed"], perf=("passed", 0.5))
    score_assignment(specs.get("vector_add"), a)
    assert a.score == 6 + 2
    a.tests.append(TestResult("vector_add", "integrity", "own kernel", "flagged", "torch did it"))
    score_assignment(specs.get("vector_add"), a)
    assert a.score == 0


def test_curve_endpoints():
    perf = specs.get("softmax").performance
    assert perf.score_fraction(1.0) == 1.0 and perf.score_fraction(3.5) == 0.0
    assert 0 < perf.score_fraction(1.8) < 1


def test_gradescope_schema():
    run = RunResult("repo", 1, {"mode": "cpu-interpreter"})
    a = _result(["passed", "failed", "skipped"])
    score_assignment(specs.get("vector_add"), a)
    run.assignments.append(a)
    data = run.to_gradescope()
    assert set(data) >= {"score", "max_score", "tests", "extra_data", "output"}
    for t in data["tests"]:
        assert {"name", "score", "max_score", "output", "outcome", "tags"} <= set(t)
        assert t["tags"][:2] == ["vector_add", "correctness"]
    assert [t.get("status") for t in data["tests"]] == ["passed", "failed", None]
    assert data["score"] == 2.0 and data["max_score"] == 4.0  # 6 points over 3 tests, one skipped
