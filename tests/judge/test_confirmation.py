"""The replay's figure against the grader's own clock on the function's calls
(grader.judge.confirmation), the fallback's figure held for a TA's review (grader.judge.perf._hold,
grader.judge.scoring), and the compiled files taken at the launch (grader.worker.launches)."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest

from grader.judge import confirmation, perf
from grader.judge.confirmation import FAST_MARGIN, LAUNCH_SLACK_MS, SLOW_MARGIN, clock_ms, decide
from grader.payloads import PerformancePayload
from grader.results import AssignmentResult, Outcome, TestResult


def test_the_clock_is_the_references_time_plus_the_brackets_difference_per_call():
    # 100 calls: the student's bracket 30 ms longer than the reference's is 0.3 ms more per call
    assert clock_ms([0.130, 0.120], [0.100, 0.100], 100, 0.5) == pytest.approx([0.8, 0.7])


@pytest.mark.parametrize("clock, verdict", [
    (1.0, "agrees"),
    (1.0 * (1 - FAST_MARGIN) - LAUNCH_SLACK_MS + 1e-6, "agrees"),  # at the edge: honest spread
    (1.0 * (1 - FAST_MARGIN) - LAUNCH_SLACK_MS - 1e-3, "faster"),
    (1.0 * (1 + SLOW_MARGIN) + LAUNCH_SLACK_MS - 1e-6, "agrees"),
    (1.0 * (1 + SLOW_MARGIN) + LAUNCH_SLACK_MS + 1e-3, "slower"),
    (3.94, "slower"),  # issue #51: a 4x kernel whose record was rewritten to the fast one's
    (0.25, "faster"),  # a record that names four times the work the calls do
])
def test_the_clock_and_the_replay_must_agree_within_the_margins(clock, verdict):
    got = decide([clock] * 3, 1.0, launches=1, eager="", calls=50)
    assert got.verdict == verdict, got
    assert got.conclusive == (verdict != "agrees")
    if verdict != "agrees":
        assert f"{clock:.4f} ms per call by the grader's clock over 50 calls" in got.message
        assert "1.0000 ms for the kernels your function's record names" in got.message


def test_each_launch_buys_its_slack_and_the_median_round_decides():
    # eight launches of a tiny kernel: their own cost in the burst is not called a mismatch
    assert decide([0.05 + 8 * LAUNCH_SLACK_MS * 0.9] * 3, 0.05, launches=8, eager="", calls=256).verdict == "agrees"
    assert decide([0.05 + 8 * LAUNCH_SLACK_MS * 0.9] * 3, 0.05, launches=1, eager="", calls=256).verdict == "slower"
    assert decide([9.0, 1.0, 1.01], 1.0, launches=1, eager="", calls=50).verdict == "agrees"  # one round's hiccup


def test_slower_in_an_eager_burst_is_the_host_work_scored_on_the_clock_never_an_accusation():
    got = decide([2.0] * 3, 1.0, launches=1, eager="RuntimeError: capture failed", calls=50)
    assert got.verdict == "host" and not got.conclusive and got.ratio == pytest.approx(2.0)
    assert "scored on the grader's own clock" in got.message and "RuntimeError: capture failed" in got.message
    # faster stays conclusive, eager or not (host work only lengthens a bracket), beyond the eager margin: both
    # contenders' own Python and a synchronization per call are in eager brackets (an honest wrapper: 0.73x)
    assert decide([0.4] * 3, 1.0, launches=1, eager="synchronizes", calls=50).verdict == "faster"
    assert decide([0.73] * 3, 1.0, launches=1, eager="synchronizes", calls=50).verdict == "agrees"
    assert decide([0.73] * 3, 1.0, launches=1, eager="", calls=50).verdict == "faster"  # in a graph: no such excuse


def test_the_eager_round_after_a_graph_can_show_less_work_never_more():
    assert decide([1.0] * 3, 1.0, launches=1, eager="", calls=50, eager_ms=0.4).verdict == "faster"
    got = decide([1.0] * 3, 1.0, launches=1, eager="", calls=50, eager_ms=0.4)
    assert "run eagerly" in got.message and got.clock_ms == 0.4
    assert decide([1.0] * 3, 1.0, launches=1, eager="", calls=50, eager_ms=0.6).verdict == "agrees"
    assert decide([1.0] * 3, 1.0, launches=1, eager="", calls=50, eager_ms=9.0).verdict == "agrees"  # host work


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


def test_no_figure_from_the_clock_is_unclear_and_an_eager_round_that_measured_nothing_is_ignored():
    got = decide([-1.4, -1.2, 0.1], 0.27, launches=1, eager="", calls=31)
    assert got.verdict == "unclear" and not got.conclusive and "could not be confirmed" in got.message
    assert decide([0.27] * 3, 0.27, launches=1, eager="", calls=31, eager_ms=-1.4).verdict == "agrees"
    text = confirmation.unconfirmed(got.message, 1.04, 1.0)
    assert "held for a TA's review" in text and "1.040x" in text and "100%" in text


FIGURES = "ms per call by the grader's clock over 50 calls back to back on fresh inputs, 1.0000 ms for the kernels your " \
          "function's record names, replayed"


@pytest.mark.parametrize("args, expected", [
    (([1.0] * 3, 1.0, 1, "", 50), confirmation.Agreement("agrees", 1.0, 1.0, 1.0, "")),
    (([0.5] * 3, 1.0, 2, "", 50), confirmation.Agreement(
        "faster", 0.5, 1.0, 0.5, f"your function's own calls are faster than the kernels its record names (0.5000 "
        f"{FIGURES}): the calls did less work than their record says")),
    (([2.0] * 3, 1.0, 1, "", 50), confirmation.Agreement(
        "slower", 2.0, 1.0, 2.0, f"your function's own calls are 2.00x slower than the kernels its record names (2.0000 "
        f"{FIGURES}, captured in a CUDA graph, so no host work is in it): the calls do not run what their record says")),
    (([2.0] * 3, 1.0, 1, "sync", 50), confirmation.Agreement(
        "host", 2.0, 1.0, 2.0, f"scored on the grader's own clock: 2.0000 {FIGURES}; your function could not be "
        "captured in a CUDA graph (sync), so its host work counts there")),
    (([-0.5] * 3, 1.0, 1, "", 50), confirmation.Agreement(
        "unclear", -0.5, 1.0, -0.5, "the grader's own clock could not time your function's calls (-0.5000 ms per call "
        "over 50 calls: the reference's bursts beside them took longer than its own work explains), so the replayed "
        "figure could not be confirmed")),
])
def test_each_verdict_reads_exactly(args, expected):
    assert decide(*args) == expected


def test_the_eager_figure_reads_exactly_and_zero_measures_nothing():
    assert decide([1.0] * 3, 1.0, 1, "", 50, eager_ms=0.4) == confirmation.Agreement(
        "faster", 0.4, 1.0, 0.4, "your function's own calls are faster than the kernels its record names (0.4000 ms per "
        "call by the grader's clock over 50 calls on fresh inputs, run eagerly (your Python at every call), 1.0000 ms "
        "for the kernels your function's record names, replayed): the calls did less work than their record says")
    assert decide([1.0] * 3, 1.0, 1, "", 50, eager_ms=0.0).verdict == "agrees"


def test_the_edges_and_each_launchs_slack_are_exact():
    edge = 1.0 * (1 - FAST_MARGIN) - LAUNCH_SLACK_MS * 1
    assert decide([edge] * 3, 1.0, 1, "", 50).verdict == "agrees"
    assert decide([0.745] * 3, 1.0, 2, "", 50).verdict == "agrees"  # two launches: 0.74 the edge
    assert decide([1.0] * 3, 0.0, 1, "", 50).ratio == float("inf")  # no replayed time: never a division by zero
    assert decide([1.0] * 3, 0.0, 1, "", 50, eager_ms=0.5).ratio == float("inf")


def test_the_reference_breaking_asks_nothing_of_the_student_in_exact_words():
    assert confirmation.held("the reference could not be replayed (x)", 1.0, 1.0) == (
        "held for a TA's review (not an accusation): 1.000x the reference kernel's time, timed in your worker, not by "
        "replay (the reference could not be replayed (x)), so the grader could not verify the figure; its 100% of the "
        "speed points wait for the review")


def test_ratios_are_over_the_replayed_time_and_the_eager_edge_takes_each_launchs_slack():
    assert decide([1.0] * 3, 2.0, 1, "", 50).ratio == 0.5
    assert decide([2.0] * 3, 2.0, 1, "", 50, eager_ms=0.5).ratio == 0.25
    assert decide([0.0] * 3, 1.0, 1, "", 50).verdict == "unclear"  # exactly zero measures nothing either
    # the eager edge: half the replayed time less 5 us per launch (two launches: 0.49)
    assert decide([1.0] * 3, 1.0, 2, "", 50, eager_ms=0.492).verdict == "agrees"
    assert decide([1.0] * 3, 1.0, 2, "", 50, eager_ms=0.488).verdict == "faster"


def test_an_accusation_stands_only_where_the_host_was_not_oversubscribed_and_the_reps_were_steady():
    steady = [[1.0, 1.02, 0.99]] * 4
    assert confirmation.unsteady(16, 16, steady) == ""  # as many ready as CPUs: steady
    assert confirmation.unsteady(17, 16, steady) == \
        "the host had 17 threads ready to run on its 16 CPUs while the calls were timed"
    spread = steady + [[1.0, 1.0, 1.0 * (1 + confirmation.STEADY) + 1e-3]]
    assert "took from 1.0000 to 1.2510 ms" in confirmation.unsteady(1, 16, spread)
    assert confirmation.unsteady(1, 16, steady + [[1.0, 1.0 * (1 + confirmation.STEADY) - 1e-3]]) == ""
    slower = decide([4.0] * 5, 1.0, 1, "", 7)
    held = confirmation.steadied(slower, "the host had 40 threads ready to run on its 16 CPUs")
    assert slower.verdict == "slower" and held.verdict == "unclear" and not held.conclusive
    assert held.message == ("the machine was too busy for the grader's own clock to confirm it (the host had 40 threads "
                            "ready to run on its 16 CPUs; the clock read 4.0000 ms per call against 1.0000 ms replayed)")
    assert confirmation.steadied(slower, "") is slower  # steady: the accusation stands as it was
    agrees = decide([1.0] * 5, 1.0, 1, "", 7)
    assert confirmation.steadied(agrees, "busy") is agrees  # only an accusation is withheld
