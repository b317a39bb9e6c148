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
    # Gradescope shows a test without a status whose score equals its max_score (0 == 0) as passed:
    # a skipped check has not passed, so it says failed, and its output says why it did not run
    assert [t["status"] for t in data["tests"]] == ["passed", "failed", "failed"]
    assert data["tests"][2]["output"].startswith("[skipped]") and "Worth 2 points" in data["tests"][2]["output"]
    assert data["score"] == 2.0 and data["max_score"] == 4.0  # 6 points over 3 tests, one skipped
    assert [t["number"] for t in data["tests"]] == ["1.1", "1.2", "1.3"]
    assert {t["visibility"] for t in data["tests"]} == {"visible"} and data["stdout_visibility"] == "visible"
    assert "leaderboard" not in data and "execution_time" not in data  # no timing ran; no duration known


def test_gradescope_hidden_cases_time_and_leaderboard():
    run = RunResult("repo", 1, {"mode": "gpu"}, execution_time=41.6)
    a = AssignmentResult("softmax", "Row-wise softmax", "kernels/softmax.py:softmax()")
    a.tests.append(TestResult("softmax", "correctness", "1x1 [float32]", "passed", "ok", case="1x1", dtype="float32"))
    a.tests.append(TestResult("softmax", "correctness", "5x16385 [float32]", "failed", "wrong", case="5x16385",
                              dtype="float32", hidden=True))
    a.tests.append(TestResult("softmax", "performance", "performance", "passed", "1.5x",
                              details={"ratio_to_reference": 1.5, "figures": {"student": {"roofline_pct": 61.0}}}))
    run.assignments.append(a)
    data = run.to_gradescope()
    assert [t["visibility"] for t in data["tests"]] == ["visible", "after_published", "visible"]
    assert "hidden" in data["tests"][1]["tags"]
    assert data["stdout_visibility"] == "hidden"  # the console output names the hidden cases
    assert data["execution_time"] == 42
    assert data["leaderboard"] == [{"name": "softmax time / reference", "value": 1.5, "order": "asc"},
                                   {"name": "softmax % of roofline", "value": 61.0, "order": "desc"}]
