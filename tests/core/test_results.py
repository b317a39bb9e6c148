"""results.json in Gradescope's schema, and the scoring rules: exact shares, skipped points,
and what each severity of integrity finding costs."""

from fractions import Fraction

import pytest

from grader import spec as specs
from grader.results import AssignmentResult, Outcome, RunResult, TestResult
from grader.judge.scoring import score_assignment, split_cents
from tests.conftest import COURSE


def _result(outcomes, perf=None, name="vector_add"):
    a = AssignmentResult(name, "title", f"kernels/{name}.py:{name}()")
    for i, o in enumerate(outcomes):
        a.tests.append(TestResult(name, "correctness", f"case{i} [float32]", o, "msg", dtype="float32"))
    if perf:
        a.tests.append(TestResult(name, "performance", "perf", perf[0], "msg", details={"score_fraction": perf[1]}))
    return a


def test_shares_add_up_to_exactly_the_specs_points():
    assert split_cents(16, 3) == [534, 533, 533]  # 1600 hundredths: 533 each and one left over
    assert split_cents(10, 30) == [34] * 10 + [33] * 20  # 1000 = 30 * 33 + 10
    assert split_cents(6, 4) == [150] * 4
    assert split_cents(0, 5) == [0] * 5 and split_cents(7, 0) == [] and split_cents(5, 1) == [500]
    for points, parts in ((16, 3), (10, 30), (6.5, 7), (12, 41)):
        assert sum(split_cents(points, parts)) == round(points * 100)


def test_an_assignment_is_out_of_its_specs_total_even_where_tests_are_skipped():
    # vector_add: 6 correctness + 4 performance points; one case and the timing need a GPU
    a = _result(["passed", "passed", "skipped"], perf=("skipped", 0))
    score_assignment(COURSE.get("vector_add"), a)
    assert (a.score, a.max_score) == (4.0, 10.0)
    assert a.skipped_points == 2.0 + 4.0
    assert a.tests[2].score == 0 and a.tests[2].details.points_if_run == 2.0


def test_a_third_of_sixteen_points_shows_as_sixteen_in_the_total():
    # dropout: 10 correctness points over 3 tests (3.34 + 3.33 + 3.33), 6 for speed
    a = _result(["passed", "passed", "passed"], perf=("passed", 1.0), name="dropout")
    score_assignment(COURSE.get("dropout"), a)
    assert a.max_score == 16 and a.score == 16
    assert [t.max_score for t in a.tests] == [3.34, 3.33, 3.33, 6.0]
    run = RunResult("repo", 1, {})
    run.assignments += [a, a]
    assert run.score == 32 and run.max_score == 32
    assert Fraction(str(run.to_gradescope()["max_score"])) == 32


def test_performance_follows_the_curve_and_a_conclusive_flag_takes_everything():
    a = _result(["passed", "passed"], perf=("passed", 0.5))
    score_assignment(COURSE.get("vector_add"), a)
    assert a.score == 6 + 2
    a.tests.append(TestResult("vector_add", "integrity", "own kernel", "flagged", "torch did it", severity="conclusive"))
    score_assignment(COURSE.get("vector_add"), a)
    assert a.score == 0 and a.max_score == 10
    assert any("conclusive integrity finding" in n for n in a.notes)


def test_a_finding_without_a_severity_counts_as_conclusive():
    a = _result(["passed", "passed"], perf=("passed", 1.0))
    a.tests.append(TestResult("vector_add", "integrity", "own kernel", "flagged", "torch did it"))
    score_assignment(COURSE.get("vector_add"), a)
    assert a.score == 0


def test_a_review_finding_costs_only_what_it_concerns():
    a = _result(["passed", "passed", "passed"], perf=("passed", 1.0))
    a.tests.append(TestResult("vector_add", "integrity", "own kernel", "flagged", "no kernel in case1", severity="review",
                              details={"concerns": ["case1 [float32]"]}))
    score_assignment(COURSE.get("vector_add"), a)
    assert [t.score for t in a.tests] == [2.0, 0.0, 2.0, 4.0, 0.0]
    assert a.score == 8 and a.max_score == 10
    assert any("For a TA to review" in n and "The 2 points it concerns" in n for n in a.notes)


def test_a_flagged_timing_under_review_costs_the_speed_points_only():
    a = _result(["passed", "passed"])
    a.tests.append(TestResult("vector_add", "performance", "perf", "flagged", "returned early", severity="review",
                              details={"score_fraction": 1.0}))
    score_assignment(COURSE.get("vector_add"), a)
    assert a.score == 6 and a.max_score == 10


def test_curve_endpoints():
    perf = COURSE.get("softmax").performance
    assert perf.score_fraction(1.0) == 1.0 and perf.score_fraction(3.5) == 0.0
    assert 0 < perf.score_fraction(1.8) < 1


def test_gradescope_schema():
    run = RunResult("repo", 1, {"mode": "cpu-interpreter"})
    a = _result(["passed", "failed", "skipped"])
    score_assignment(COURSE.get("vector_add"), a)
    run.assignments.append(a)
    data = run.to_gradescope()
    assert set(data) >= {"score", "max_score", "tests", "extra_data", "output"}
    for t in data["tests"]:
        assert {"name", "score", "max_score", "output", "outcome", "tags"} <= set(t)
        assert t["tags"][:2] == ["vector_add", "correctness"]
    # Gradescope's status is passed or failed: a skipped check is neither, so it has none (a program
    # reading the file sees no failure), 0 of 0 points, and its output says why it did not run
    assert [t.get("status") for t in data["tests"]] == ["passed", "failed", None]
    assert [t["outcome"] for t in data["tests"]] == ["passed", "failed", "skipped"]
    assert (data["tests"][2]["score"], data["tests"][2]["max_score"]) == (0, 0) and data["tests"][1]["max_score"] == 2
    assert data["tests"][2]["output"].startswith("[skipped]") and "Worth 2 points" in data["tests"][2]["output"]
    assert data["score"] == 2.0 and data["max_score"] == 6.0  # 6 points over 3 tests: the skipped one's 2 still count in the total
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


def test_a_partial_run_keeps_each_tests_share_of_the_full_plan():
    # vector_add's 6 correctness points over 7 planned tests: 600 = 7 * 85 + 5, so 0.86 for the first
    # five and 0.85 for the last two; only the last ran and passed
    planned = [f"case{i} [float32]" for i in range(7)]
    a = AssignmentResult("vector_add", "title", "kernels/vector_add.py:vector_add()")
    a.tests.append(TestResult("vector_add", "correctness", "case6 [float32]", "passed", "msg", dtype="float32"))
    a.tests.append(TestResult("vector_add", "correctness", "extra [float32]", "passed", "msg", dtype="float32"))
    score_assignment(COURSE.get("vector_add"), a, planned=planned)
    assert [(t.score, t.max_score) for t in a.tests] == [(0.85, 0.85), (0.0, 0.0)]  # a test outside the plan has no share


def test_speed_points_only_for_a_passed_timing_and_only_its_fraction():
    for outcome in ("failed", "error", "infra_error"):
        a = _result(["passed", "passed"], perf=(outcome, 0.5))
        score_assignment(COURSE.get("vector_add"), a)
        assert (a.tests[-1].score, a.tests[-1].max_score) == (0.0, 4.0), outcome
    a = _result(["passed", "passed"])
    a.tests.append(TestResult("vector_add", "performance", "perf", "passed", "msg"))  # no fraction stated: none earned
    score_assignment(COURSE.get("vector_add"), a)
    assert (a.tests[-1].score, a.tests[-1].max_score) == (0.0, 4.0)


def test_a_conclusive_finding_names_every_finding_in_its_note():
    a = _result(["passed"], perf=("passed", 1.0))
    a.tests.append(TestResult("vector_add", "integrity", "own kernel", "flagged", "torch did it", severity="conclusive"))
    a.tests.append(TestResult("vector_add", "performance", "timers", "flagged", "patched", severity="conclusive"))
    score_assignment(COURSE.get("vector_add"), a)
    assert a.notes == ["A conclusive integrity finding (own kernel; timers): no points for this assignment until a TA reviews it."]
    assert [t.score for t in a.tests] == [0.0] * 4


def test_every_outcome_has_a_style_everywhere_it_is_shown():
    from grader.cli.common import STYLE
    from grader.kit.github import CLASSROOM_STATUS
    from grader.results import HTML_STYLE, Outcome

    assert [o.value for o in Outcome] == ["passed", "failed", "error", "timeout", "crashed", "skipped", "flagged", "infra_error"]
    assert set(STYLE) == set(HTML_STYLE) == set(Outcome)
    assert set(CLASSROOM_STATUS) == set(Outcome) - {Outcome.SKIPPED}  # Classroom is not told of a skipped check
    assert (CLASSROOM_STATUS["passed"], CLASSROOM_STATUS["flagged"], CLASSROOM_STATUS["infra_error"]) == ("pass", "fail", "error")


def test_an_outcome_is_written_and_read_back_as_its_plain_string():
    import json

    t = TestResult("vector_add", "correctness", "n=1 [float32]", Outcome.TIMEOUT, "killed")
    assert (str(t.outcome), f"{t.outcome}", f"[{t.outcome}]") == ("timeout", "timeout", "[timeout]")
    text = json.dumps(t.to_json())
    assert '"outcome": "timeout"' in text  # results.json's schema: the bare string
    back = TestResult.from_json(json.loads(text))  # how batch records are read back
    assert back == t and back.outcome is Outcome.TIMEOUT and back.outcome == "timeout"
    assert TestResult("a", "correctness", "n", "flagged").outcome is Outcome.FLAGGED
    run = RunResult("sub", 1, {}, [AssignmentResult("vector_add", "t", "m", [t])])
    assert json.loads(json.dumps(run.to_gradescope()))["tests"][0]["outcome"] == "timeout"
    assert type(run.to_gradescope()["tests"][0]["outcome"]) is str
    with pytest.raises(ValueError, match="'passd' is not an outcome: one of passed, failed, error"):
        TestResult("a", "correctness", "n", "passd")


def test_the_pages_colour_each_outcome_from_one_table():
    from grader.results import outcome_css

    css = outcome_css()
    # the colours the report and the class dashboard have always used
    for rule in (".passed { color: #276749; }", ".failed { color: #c53030; }", ".error { color: #c53030; }",
                 ".timeout { color: #6b46c1; }", ".crashed { color: #6b46c1; }", ".skipped { color: #718096; }",
                 ".flagged { color: #b7791f; font-weight: bold; }", ".infra_error { color: #2c5282; font-weight: bold; }"):
        assert rule in css.splitlines()


# -- the one matched pair: to_json / from_json ------------------------------------------------------

# a value unlike any default for each field type of the result dataclasses; a field of a type not
# here fails the round trip below until it gets one (and with it, its serialisation is tested)
SAMPLES = {
    "str": lambda name: f"<{name}> «ü»",
    "str | None": lambda name: f"<{name}>",
    "float": lambda name: 2.25,
    "float | None": lambda name: 41.5,
    "int": lambda name: 7,
    "bool": lambda name: True,
    "dict": lambda name: {"figures": {"student": {"median_ms": 0.5}}, "interval": [0.9, 1.1], "none": None, "n": 3},
    "list[str]": lambda name: [f"<{name}> one", f"<{name}> two"],
    "list[dict]": lambda name: [{"file": "kernels/x.py", "line": 9, "code": "os._exit(3)", "what": "ends the worker process"}],
    "Outcome": lambda name: "flagged",  # a plain string is made an Outcome, and must come back as one
    "Kind": lambda name: "performance",  # likewise a Kind; the payload below is that kind's
    "Severity | str": lambda name: "review",  # likewise a Severity
    # a dict is read as the kind's payload (grader.payloads), a key no field names kept as it came
    "Payload": lambda name: {"figures": {"student": {"median_ms": 0.5, "host_median_ms": None, "gbps": None,
                                                     "roofline_pct": None}},
                             "ratio_interval": [0.9, 1.1], "flops": 3, "gemm_tflops": None, "later_key": {"n": 3}},
    "list[TestResult]": lambda name: [_sample(TestResult), _sample(TestResult)],
    "list[AssignmentResult]": lambda name: [_sample(AssignmentResult)],
}


def _sample(cls):
    """An instance with every field set, each to a value unlike its default."""
    import dataclasses

    values = {}
    for f in dataclasses.fields(cls):
        if f.type not in SAMPLES:
            pytest.fail(f"{cls.__name__}.{f.name}: no sample value for the type {f.type!r}: add one to SAMPLES "
                        "(and make to_json/from_json carry it)")
        values[f.name] = SAMPLES[f.type](f.name)
        default = f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default
        assert values[f.name] != default, f"{cls.__name__}.{f.name}: the sample equals the default, so a loss could not show"
    return cls(**values)


def _assert_same_fields(back, original, where: str) -> None:
    """Field by field, from the dataclass's own field list, nested results included."""
    import dataclasses

    assert type(back) is type(original), where
    for f in dataclasses.fields(original):
        mine, theirs = getattr(back, f.name), getattr(original, f.name)
        if isinstance(theirs, list) and theirs and dataclasses.is_dataclass(theirs[0]):
            assert len(mine) == len(theirs), f"{where}.{f.name}"
            for i, (m, t) in enumerate(zip(mine, theirs)):
                _assert_same_fields(m, t, f"{where}.{f.name}[{i}]")
        else:
            assert mine == theirs, f"{where}.{f.name}: {mine!r} came back for {theirs!r}"
            assert type(mine) is type(theirs), f"{where}.{f.name}: {type(mine).__name__} came back for {type(theirs).__name__}"


@pytest.mark.parametrize("cls", [TestResult, AssignmentResult, RunResult])
def test_every_field_of_every_result_comes_back_from_its_stored_form(cls):
    import dataclasses
    import json

    original = _sample(cls)
    data = original.to_json()
    assert list(data) == [f.name for f in dataclasses.fields(cls)]  # every field written, under its own name
    stored = json.loads(json.dumps(data))  # as a record on disk holds it
    assert stored == data  # to_json gives JSON's own types already: what is read back is what was written
    back = cls.from_json(stored)
    _assert_same_fields(back, original, cls.__name__)
    assert back == original
    assert back.to_json() == data


def test_to_json_gives_what_a_file_gives_back():
    # a tuple, a key that is no string and an object JSON cannot hold: as write_json_atomic writes them
    from pathlib import PurePosixPath

    t = TestResult("softmax", "correctness", "1x1 [float32]", "failed",
                   details={"interval": (0.5, 2.0), 3: "three", "where": PurePosixPath("/x/y")})
    assert t.to_json()["details"] == {"interval": [0.5, 2.0], "3": "three", "where": "/x/y"}
    assert TestResult.from_json(t.to_json()).outcome is Outcome.FAILED


def test_a_record_written_before_a_field_existed_still_loads():
    # a job's result as batches stored it before warnings, headline, partial, hidden and severity
    old = {"name": "vector_add", "title": "Vector addition", "module": "kernels/vector_add.py:vector_add()",
           "notes": ["a note"],
           "tests": [{"assignment": "vector_add", "kind": "correctness", "name": "n=1 [float32]", "outcome": "passed",
                      "message": "ok", "max_score": 6.0, "score": 6.0, "case": "n=1", "dtype": "float32", "shape": "x[1]",
                      "details": {}, "traceback": "", "output": "", "reproducer": "grader check ."}]}
    a = AssignmentResult.from_json(old)
    assert (a.warnings, a.headline, a.partial, a.notes) == ([], "", {}, ["a note"])
    assert (a.tests[0].hidden, a.tests[0].severity, a.tests[0].outcome) == (False, "", Outcome.PASSED)
    assert a.score == 6.0
    # a key this version does not know (a newer grader's record) is left out, not an error
    newer = dict(old, later_field=[1], tests=[dict(old["tests"][0], later_test_field="x")])
    assert AssignmentResult.from_json(newer) == a


def test_a_batch_record_keeps_the_static_scans_warnings_in_the_students_files(tmp_path):
    """The batch's own path, without a worker: a job's record (jobs.new_record) stored
    (store.store_record) and the student's results.json and report.html rebuilt from it."""
    import json

    from grader.batch.jobs import Job, new_record
    from grader.batch.store import read_records, store_record, student_run

    warning = {"file": "kernels/vector_add.py", "line": 9, "code": "os._exit(3)", "what": "ends the worker process"}
    a = AssignmentResult("vector_add", "Vector addition", "kernels/vector_add.py:vector_add()", warnings=[warning],
                         headline="one cause", partial={"cases_run": 1, "cases": 7, "assignment_points": 10})
    a.tests.append(TestResult("vector_add", "correctness", "n=1 [float32]", "crashed", "the worker died", case="n=1",
                              dtype="float32", max_score=6.0, output="last words", hidden=True))
    job = Job("alice", "alice", "vector_add", str(tmp_path / "repo"), None, "abc123", {}, str(tmp_path / "out"),
              {"seed": 3, "device": "cpu"})
    store_record(tmp_path / "out", new_record(job, "graded", result=a, environment={"mode": "cpu-interpreter"}))
    folder = tmp_path / "out" / "students" / "alice"
    run = student_run(read_records(tmp_path / "out", "alice"), ["vector_add"])
    assert run.assignments == [a]  # what was graded is what the student's files are built from
    data = json.loads((folder / "results.json").read_text())
    assert data["extra_data"]["assignments"]["vector_add"]["integrity_warnings"] == [warning]
    report = (folder / "report.html").read_text()
    assert "static scan: 1 finding(s) for a TA to review" in report and "ends the worker process" in report


def test_results_json_carries_the_course_grade_only_where_it_differs_from_the_run_s_points():
    a = AssignmentResult("vector_add", "t", "m", [TestResult("vector_add", "correctness", "c", "passed", max_score=6, score=6),
                                                  TestResult("vector_add", "performance", "p", "failed", max_score=4)])
    run = RunResult("repo", 1, {}, assignments=[a])
    same = {"vector_add": {"points": 6, "out_of": 10, "late_penalty": 0, "final": 6}}
    assert run.in_gradebook(same) is None and run.to_gradescope(same) == run.to_gradescope()
    scaled = {"vector_add": {"points": 12, "out_of": 20, "late_penalty": 1.2, "final": 10.8}}
    assert run.in_gradebook(scaled) == (10.8, 20)
    data = run.to_gradescope(scaled)
    assert (data["score"], data["max_score"]) == (10.8, 20) and data["extra_data"]["gradebook"] == scaled
    assert data["output"].startswith("10.8 / 20 points in the course's gradebook")
    assert [t["score"] for t in data["tests"]] == [6, 0]  # the checks keep the assignment's own points
