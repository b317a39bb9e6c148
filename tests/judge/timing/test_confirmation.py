"""The grader's own clock's arithmetic on the function's calls (grader.judge.timing.confirmation;
the decision itself: tests/judge/timing/test_decision.py), the fallback's figure held for a TA's
review (grader.judge.perf._hold, grader.judge.scoring), and the compiled files taken at the launch
(grader.worker.launches)."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest

from grader.judge import perf
from grader.judge.timing import confirmation
from grader.judge.timing.confirmation import clock_ms
from grader.payloads import PerformancePayload
from grader.results import AssignmentResult, Outcome, TestResult


def test_a_gate_is_outrun_where_either_contender_took_most_of_it_to_queue_its_calls():
    assert not confirmation.gate_outran({"student": 80.0, "reference": 2.0}, 100.0)
    assert confirmation.gate_outran({"student": 95.0, "reference": 2.0}, 100.0)
    assert confirmation.gate_outran({"student": 1.0, "reference": 120.0}, 100.0)


def test_a_gate_held_exactly_its_share_is_not_outrun():
    assert not confirmation.gate_outran({"student": confirmation.GATE_OUTRAN * 100.0, "reference": 0.0}, 100.0)


def test_the_kept_round_is_ordered_by_the_difference_of_the_brackets_not_their_sum():
    rounds = [({"student": 5.0, "reference": 4.5}, False), ({"student": 3.0, "reference": 1.0}, False),
              ({"student": 9.0, "reference": 8.0}, False)]  # differences 0.5, 2.0, 1.0: the median is 1.0
    assert confirmation.kept_round(rounds)[0] == {"student": 9.0, "reference": 8.0}


def test_a_queued_burst_of_many_launches_holds_a_whole_number_of_calls_within_the_queue():
    calls = confirmation.queued_calls(60)
    assert calls == confirmation.QUEUED_LAUNCHES // (60 + confirmation.BURST_LAUNCHES) and type(calls) is int


def test_the_kept_round_is_the_median_of_the_hidden_rounds_else_of_all():
    r = [({"student": s, "reference": 1.0}, outran) for s, outran in ((9.0, True), (3.0, False), (2.0, False),
                                                                       (5.0, False))]
    assert confirmation.kept_round(r) == ({"student": 3.0, "reference": 1.0}, False)
    assert confirmation.kept_round(r[:1] + r[2:3]) == ({"student": 2.0, "reference": 1.0}, False)  # hidden first
    both = [({"student": 4.0, "reference": 1.0}, True), ({"student": 6.0, "reference": 1.0}, True)]
    assert confirmation.kept_round(both) == ({"student": 4.0, "reference": 1.0}, True)  # the lower of two
    assert confirmation.kept_round([]) == ({}, False)


def test_the_clock_is_the_references_time_plus_the_brackets_difference_per_call():
    # 100 calls: the student's bracket 30 ms longer than the reference's is 0.3 ms more per call
    assert clock_ms([0.130, 0.120], [0.100, 0.100], 100, 0.5) == pytest.approx([0.8, 0.7])


@pytest.mark.parametrize("why, words", [
    ("your kernels could not be replayed: launches on 2 streams", "caller's stream"),
    ("argument acc of k is a tensor from elsewhere (not an input, the result, or a buffer the call allocated)",
     "keep no device tensor between calls"),
    ("argument p of k is an integer that holds a device address", "not their addresses as integers"),
    ("your function's launches change from call to call: launch 0 differs", "the same kernels with the same grids"),
    ("something new", confirmation.GENERAL_CHANGE),
])
def test_a_held_figure_tells_the_student_what_to_change_to_be_replayed(why, words):
    text = confirmation.held(why, 1.013, 0.9)
    assert words in text and why in text and "1.013x" in text and "90%" in text and "held for a TA's review" in text


def test_nothing_is_asked_of_the_student_when_the_reference_could_not_be_replayed():
    text = confirmation.held("the reference could not be replayed (no GPU)", 1.0, 1.0)
    assert "to be timed by replay" not in text and "held for a TA's review" in text


def _timing(outcome="passed", fraction=0.75, held=None) -> TestResult:
    return TestResult("softmax", "performance", "perf", outcome, "1.013x", max_score=8,
                      details=PerformancePayload(score_fraction=fraction, ratio_to_reference=1.013, held=held))


def test_the_fallbacks_figure_earns_nothing_until_a_ta_clears_it_and_then_its_curves_share():
    from grader.judge.scoring import points_without_findings, score_assignment

    class Spec:
        correctness_points, performance_points = 12, 8

    verdict = _timing()
    why = "your kernels could not be replayed: launches on 2 streams"
    perf._hold(verdict, verdict.details, why, confirmation.held(why, 1.013, 0.75))
    assert verdict.outcome == Outcome.FLAGGED and verdict.severity == "review"
    assert verdict.message.startswith("no speed credit yet: held for a TA's review") and "1.013x" in verdict.message
    assert verdict.details.held and verdict.details.findings[0].severity == "review"
    result = AssignmentResult("softmax", "Softmax", "kernels/softmax.py",
                              [TestResult("softmax", "correctness", "a", "passed", max_score=12), verdict])
    score_assignment(Spec(), result)
    assert result.score == 12 and verdict.score == 0, "held: the correctness points stand, the speed points wait"
    assert points_without_findings(result) == 12 + 6, "a clearing gives the curve's 3/4 of the 8 speed points"
    flagged = _timing("flagged")  # a flag that is no hold (an accusation cleared) earns what it had: nothing recorded
    flagged.details.score_fraction = None
    assert points_without_findings(AssignmentResult("softmax", "Softmax", "k", [flagged])) == 0


def test_the_compiled_binary_recorded_is_the_one_loaded_not_the_cache_file_written_after(tmp_path):
    """A worker that copies a faster binary over its Triton cache file after the launch: the
    record holds the bytes the driver loaded, taken at the launch."""
    from grader.worker import launches

    cubin, meta = tmp_path / "k.cubin", tmp_path / "k.json"
    cubin.write_bytes(b"the slow binary that ran")
    meta.write_text(json.dumps({"name": "k"}))
    kernel = SimpleNamespace(kernel=cubin.read_bytes(), asm={"cubin": cubin.read_bytes()},
                             metadata_group={"k.cubin": str(cubin), "k.json": str(meta)}, name="k",
                             src=SimpleNamespace(signature={}, constants={}, fn=SimpleNamespace(arg_names=[])))
    fn = SimpleNamespace(fn=lambda n: None, __name__="k")
    recorder = launches.Recorder({})
    recorder.launch(fn, kernel, (4,), {"grid": (1,)})
    cubin.write_bytes(b"a faster binary copied over the cache file")  # after the launch, before the record
    meta.write_text(json.dumps({"name": "k", "shared": 0, "forged": True}))  # and its metadata: taken at the launch
    folder = tmp_path / "record"
    folder.mkdir()
    described = recorder._kernel(kernel, str(folder))
    kept = {label: (folder / digest).read_bytes() for label, digest in described["files"].items()}
    assert kept["k.cubin"] == b"the slow binary that ran" and json.loads(kept["k.json"]) == {"name": "k"}
    assert not any(Path(folder, d).read_bytes().startswith(b"a faster") for d in described["files"].values())


def test_the_binary_recorded_is_the_one_the_driver_loaded_even_if_the_file_changed_before_the_launch(tmp_path):
    """The cache file overwritten between the kernel's load and its launch: the bytes Triton loaded
    (`kernel.kernel`) are what ran, and what the record holds."""
    from grader.worker import launches

    cubin, meta = tmp_path / "k.cubin", tmp_path / "k.json"
    cubin.write_bytes(b"a faster binary copied over the cache file")
    meta.write_text(json.dumps({"name": "k"}))
    kernel = SimpleNamespace(kernel=b"the slow binary that ran",
                             metadata_group={"k.cubin": str(cubin), "k.json": str(meta)})
    assert launches._snapshot(kernel) == {"k.cubin": b"the slow binary that ran", "k.json": meta.read_bytes()}


def test_the_reference_breaking_asks_nothing_of_the_student_in_exact_words():
    assert confirmation.held("the reference could not be replayed (x)", 1.0, 1.0) == (
        "held for a TA's review (not an accusation): 1.000x the reference kernel's time, timed in your worker, not by "
        "replay (the reference could not be replayed (x)), so the grader could not verify the figure; its 100% of the "
        "speed points wait for the review")


def test_a_held_figure_names_the_clocks_failure_first_and_the_replayed_figure_after_it():
    text = confirmation.unconfirmed("the grader's own clock could not time your function's calls", 1.04, 1.0)
    assert text.startswith("held for a TA's review (not an accusation): the grader's own clock could not time")
    assert text.index("could not time") < text.index("1.040x") and "100%" in text


def test_a_queued_burst_keeps_every_launch_within_the_drivers_queue():
    assert confirmation.queued_calls(1) == confirmation.EAGER_CALLS
    assert confirmation.queued_calls(60) * (60 + confirmation.BURST_LAUNCHES) <= confirmation.QUEUED_LAUNCHES
    assert confirmation.queued_calls(10_000) == 4 and confirmation.queued_calls(0) == confirmation.EAGER_CALLS
