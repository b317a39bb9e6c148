"""The timing verdict's exact figures, words and outcome, and the exact findings of the timed loop
(no GPU needed): every number a TA or a student reads is worked out here by hand from made-up
timings, so a wrong rounding, a swapped quartile or a lost word shows."""

from __future__ import annotations

import pytest

from grader.judge import perf
from grader.judge.perf import Finding, Timings, UntrustedRecords, _conduct, _verdict, call_times, ratio_estimate
from grader.payloads import FindingNote
from grader.protocol import TimeReply
from grader.results import Severity, TestResult

# seven rounds of one call each, in no order; sorted, the quartiles (statistics' "exclusive"
# method: positions 2, 4 and 6 of 7) are the 2nd, 4th and 6th values
REFERENCE = [0.5000123, 0.1000123, 0.7000123, 0.4000123, 0.2000123, 0.6000123, 0.3000123]
STUDENT = [2 * x for x in REFERENCE]  # twice the reference's time in every round
TORCH = [0.3] * 7


class _Case:
    name, params = "n=big", {"n": 1}


class _Perf:
    """800 MB moved and 4e11 FLOPs at float32 (4-byte elements: the sizes follow the dtype, as a
    real spec's do); the curve records what it is asked and gives 0.4567."""

    case = _Case
    dtype, full_at, zero_at, score_on = "float32", 1.5, 2.5, "gpu"
    asked: list[float] = []

    @staticmethod
    def bytes_moved(params, dt):
        return 200_000_000 * dt.itemsize

    @staticmethod
    def flops(params, dt):
        return 100_000_000_000 * dt.itemsize

    @classmethod
    def score_fraction(cls, ratio):
        cls.asked.append(ratio)
        return 0.4567


class _Spec:
    performance = _Perf


class _Opts:
    # copy: 8e8 B / 1900 GB/s = 0.42105263 ms; GEMM: 4e11 / 2000 TFLOP/s = 0.2 ms: memory-bound
    roofline = {"gpu": "test GPU", "copy_gbps": 1900.0, "gemm_tflops": {"float32": 2000.0, "float16": 1.0}}


def _timings(series: dict[str, list[float]]) -> Timings:
    t = Timings()
    for c, ms in series.items():
        t.times[c] = [[x] for x in ms]
        t.event_ms[c] = {"student": [0.81, 0.8123456, 0.82], "reference": [0.41, 0.4], "torch": [0.3]}[c]
        t.host_ms[c] = [[h] * 2 for h in {"student": [1.0000123] * 7, "reference": [0.25] * 7, "torch": [0.31] * 7}[c]]
        t.first_call_ms[c] = {"student": 123.456, "reference": 7.0, "torch": 5.0}[c]
    return t


def _test(outcome, message, **kw):
    return TestResult("a", "performance", "performance", outcome, message, **kw)


def test_a_scored_timing_reports_every_figure_rounded_as_documented(monkeypatch):
    seen = []

    def estimate(student, reference):
        seen.append((student, reference))
        return 2.00004, 1.91234, 2.10987

    monkeypatch.setattr(perf, "ratio_estimate", estimate)
    _Perf.asked.clear()
    t = _timings({"student": STUDENT, "reference": REFERENCE, "torch": TORCH})
    v = _verdict(_Spec, _Opts.roofline, t, 7, [], True, _test)
    # the ratio is taken on the GPU times (the spec scores on "gpu"), round by round
    assert seen == [([[x] for x in STUDENT], [[x] for x in REFERENCE])] and _Perf.asked == [2.00004]
    assert v.outcome == "passed" and v.severity == ""
    # student: median 0.8000246 ms; 8e8 B in it: 999.97 GB/s; 4e11 FLOPs: 499.98 TFLOP/s; the
    # floor 0.42105263 ms is 52.63% of it; the host's median 1.0000123 ms; torch's 0.3 ms: 2.6667x
    assert v.message == ("2.000x the reference kernel's GPU time (95% interval 1.912-2.110, 7 rounds): 46% of the points "
                         "(full at <= 1.5x, none at >= 2.5x); 0.8000 ms per call on the GPU; 1.000 ms per call by the "
                         "host's clock; 1000 GB/s (53% of what the measured copy bandwidth allows); 2.67x torch's time")
    assert v.details.to_json() == {
        "figures": {
            "student": {"median_ms": 0.80002, "q1_ms": 0.40002, "q3_ms": 1.20002, "event_median_ms": 0.81235,
                        "host_median_ms": 1.00001, "gbps": 1000.0, "roofline_pct": 52.6, "first_call_ms": 123.46,
                        "tflops": 500.0},
            "reference": {"median_ms": 0.40001, "q1_ms": 0.20001, "q3_ms": 0.60001, "event_median_ms": 0.405,
                          "host_median_ms": 0.25, "gbps": 1999.9, "roofline_pct": 105.3, "first_call_ms": 7.0,
                          "tflops": 1000.0},
            "torch": {"median_ms": 0.3, "q1_ms": 0.3, "q3_ms": 0.3, "event_median_ms": 0.3, "host_median_ms": 0.31,
                      "gbps": 2666.7, "roofline_pct": 140.4, "first_call_ms": 5.0, "tflops": 1333.3},
        },
        "bytes": 800_000_000, "copy_gbps": 1900.0, "gpu": "test GPU", "rounds": 7, "samples": 7, "score_on": "gpu",
        "floor_ms": 0.42105, "roofline_kind": "copy bandwidth", "evidence": [], "findings": [],
        "flops": 400_000_000_000, "gemm_tflops": 2000.0,
        "ratio_to_torch": 2.667, "ratio_to_reference": 2.0, "ratio_interval": [1.9123, 2.1099], "score_fraction": 0.457,
    }


def test_a_timing_scored_on_the_hosts_clock_takes_the_host_times():
    class Wall(_Perf):
        score_on = "wall"

    class WallSpec:
        performance = Wall

    t = _timings({"student": STUDENT, "reference": REFERENCE, "torch": TORCH})
    v = _verdict(WallSpec, _Opts.roofline, t, 7, [], True, _test)
    # host times: 1.0000123 against 0.25 in every round: 4.0000492, the same in every resample
    assert v.details.ratio_to_reference == 4.0 and v.details.ratio_interval == [4.0, 4.0]
    assert v.message.startswith("4.000x the reference kernel's time per call by the host's clock "
                                "(95% interval 4.000-4.000, 7 rounds): 46% of the points")


def test_no_points_is_a_failure_and_a_sliver_of_points_a_pass():
    class Curve(_Perf):
        fraction = 0.0

        @classmethod
        def score_fraction(cls, ratio):
            return cls.fraction

    class CurveSpec:
        performance = Curve

    t = _timings({"student": STUDENT, "reference": REFERENCE, "torch": TORCH})
    v = _verdict(CurveSpec, _Opts.roofline, t, 7, [], True, _test)
    assert v.outcome == "failed" and v.details.score_fraction == 0.0 and "0% of the points" in v.message
    Curve.fraction = 0.001
    assert _verdict(CurveSpec, _Opts.roofline, t, 7, [], True, _test).outcome == "passed"


def test_a_compute_bound_kernel_is_measured_against_the_gemm_peak():
    class Heavy(_Perf):
        @staticmethod
        def flops(params, dt):
            return 2_000_000_000_000  # 2e12 / 2000 TFLOP/s = 1 ms, over the 0.42 ms copy floor

    class HeavySpec:
        performance = Heavy

    slow = [3 * x for x in STUDENT]  # median 2.4000738 ms: 833.31 TFLOP/s, the 1 ms floor 41.67% of it
    v = _verdict(HeavySpec, _Opts.roofline, _timings({"student": slow, "reference": REFERENCE, "torch": TORCH}), 7, [], True, _test)
    assert v.details.roofline_kind == "cuBLAS GEMM peak" and v.details.floor_ms == 1.0
    assert v.details.figures["student"].tflops == 833.3 and v.details.figures["student"].roofline_pct == 41.7
    assert "; 833 TFLOP/s (42% of what the measured cuBLAS GEMM peak allows); 8.00x torch's time" in v.message
    fast = [x / 4 for x in STUDENT]  # median 0.20000615 ms: under 1 ms / 1.15
    v = _verdict(HeavySpec, _Opts.roofline, _timings({"student": fast, "reference": REFERENCE, "torch": TORCH}), 7, [], True, _test)
    assert v.outcome == "flagged" and v.severity == "review"
    assert v.message == ("no speed credit: faster than this GPU can go: 0.2000 ms per call, where 2e+12 FLOPs at the "
                         "measured cuBLAS GEMM peak (2000.0 TFLOP/s) take at least 1.0000 ms (a 15% margin allowed): "
                         "the timing missed work")


def test_an_impossible_memory_bound_time_names_the_bytes_and_the_bandwidth():
    fast = [x / 4 for x in STUDENT]  # median 0.20000615 ms, under 0.42105 ms / 1.15 = 0.36613 ms
    v = _verdict(_Spec, _Opts.roofline, _timings({"student": fast, "reference": REFERENCE, "torch": TORCH}), 7, [], True, _test)
    text = ("faster than this GPU can go: 0.2000 ms per call, where 8e+08 bytes at the measured copy bandwidth "
            "(1900 GB/s) take at least 0.4211 ms (a 15% margin allowed): the timing missed work")
    assert v.outcome == "flagged" and v.severity == "review" and v.message == "no speed credit: " + text
    assert v.details.evidence == [text] and v.details.findings == [FindingNote(severity="review", text=text)]
    # just above the margin (0.36613 ms): not flagged
    ok = [x * 0.36614 / 0.8000246 for x in STUDENT]
    assert _verdict(_Spec, _Opts.roofline, _timings({"student": ok, "reference": REFERENCE, "torch": TORCH}), 7, [], True,
                    _test).outcome == "passed"


def test_every_finding_is_listed_and_the_worst_sets_the_severity():
    t = _timings({"student": STUDENT, "reference": REFERENCE, "torch": TORCH})
    review, conclusive = Finding(Severity.REVIEW, "late work"), Finding(Severity.CONCLUSIVE, "timers patched")
    v = _verdict(_Spec, _Opts.roofline, t, 7, [review, conclusive], True, _test)
    assert (v.outcome, v.severity, v.message) == ("flagged", "conclusive", "no speed credit: late work; timers patched")
    assert v.details.evidence == ["late work", "timers patched"]
    assert [f.to_json() for f in v.details.findings] == [{"severity": "review", "text": "late work"},
                                                         {"severity": "conclusive", "text": "timers patched"}]
    assert v.details.score_fraction is None  # a flagged timing is not scored
    assert _verdict(_Spec, _Opts.roofline, t, 7, [review], True, _test).severity == "review"


def test_without_the_reference_the_figures_are_shown_and_nothing_is_scored():
    t = _timings({"student": STUDENT, "torch": TORCH})
    t.host_ms["student"] = [[] for _ in STUDENT]  # no host clock recorded
    v = _verdict(_Spec, _Opts.roofline, t, 7, [], False, _test)
    assert v.outcome == "skipped"
    assert v.message == ("0.8000 ms per call on the GPU; 1000 GB/s (53% of what the measured copy bandwidth allows); "
                         "2.67x torch's time; the reference kernel is not part of this install, so no points are computed here")
    assert v.details.figures["student"].host_median_ms is None and v.details.ratio_to_reference is None


def test_a_launch_bound_scoring_size_is_not_scored():
    tiny = [0.04] * 7  # the student's 0.5 ms is above the floor: nothing is flagged
    t = _timings({"student": [0.5] * 7, "reference": tiny, "torch": TORCH})
    v = _verdict(_Spec, _Opts.roofline, t, 7, [], True, _test)
    assert (v.outcome, v.message) == ("infra_error", "the scoring size is launch-bound (0.040 ms): not scored")
    assert v.details.figures["reference"].median_ms == 0.04
    t = _timings({"student": [0.5] * 7, "reference": [0.05] * 7, "torch": TORCH})  # at MIN_SCORED_MS: scored
    assert _verdict(_Spec, _Opts.roofline, t, 7, [], True, _test).outcome == "passed"


def test_without_flops_or_a_measured_peak_only_the_bandwidth_is_reported():
    class NoFlops(_Perf):
        flops = None

    class Spec:
        performance = NoFlops

    class Opts:
        roofline = {"gpu": "test GPU", "copy_gbps": 1900.0}  # no GEMM probe ran

    v = _verdict(Spec, Opts.roofline, _timings({"student": STUDENT, "reference": REFERENCE, "torch": TORCH}), 7, [], True, _test)
    stored = v.details.to_json()
    assert v.outcome == "passed" and "tflops" not in stored["figures"]["student"]
    assert "flops" not in stored and "gemm_tflops" not in stored and v.details.floor_ms == 0.42105

    class Opts2:
        roofline = {"gpu": "test GPU", "copy_gbps": 1900.0}

    v = _verdict(_Spec, Opts2.roofline, _timings({"student": STUDENT, "reference": REFERENCE, "torch": TORCH}), 7, [], True, _test)
    assert v.details.to_json()["gemm_tflops"] is None and v.details.roofline_kind == "copy bandwidth"  # written: null


def test_a_size_with_nothing_to_move_and_no_gpu_work_says_so():
    class Empty(_Perf):
        flops = None

        @staticmethod
        def bytes_moved(params, dt):
            return 0

    class Spec:
        performance = Empty

    t = _timings({"student": [0.0] * 7, "torch": TORCH})
    v = _verdict(Spec, _Opts.roofline, t, 7, [], False, _test)
    assert v.outcome == "skipped" and v.details.floor_ms == 0.0
    assert v.message.startswith("0.0000 ms per call on the GPU; 1.000 ms per call by the host's clock; "
                                "no GPU work recorded; 0.00x torch's time;")
    student = v.details.figures["student"]
    assert student.gbps is None and student.roofline_pct is None


def test_a_student_median_below_one_ms_still_gets_its_rates():
    t = _timings({"student": [0.5] * 7, "reference": [0.5] * 7, "torch": [0.5] * 7})
    student = _verdict(_Spec, _Opts.roofline, t, 7, [], True, _test).details.figures["student"]
    # 8e8 B in 0.5 ms: 1600 GB/s; 4e11 FLOPs: 800 TFLOP/s; the floor 0.42105 ms is 84.2% of it
    assert (student.gbps, student.tflops, student.roofline_pct) == (1600.0, 800.0, 84.2)


def test_rates_are_rounded_to_a_tenth_from_their_exact_value():
    # 1000050001 bytes and 1000050001000 FLOPs in 1 ms: 1000.050001 GB/s and TFLOP/s, just above the
    # half-tenth: both round up to 1000.1
    class Odd(_Perf):
        @staticmethod
        def bytes_moved(params, dt):
            return 1_000_050_001

        @staticmethod
        def flops(params, dt):
            return 1_000_050_001_000

    class Spec:
        performance = Odd

    t = _timings({"student": [1.0] * 7, "reference": [1.0] * 7, "torch": TORCH})
    student = _verdict(Spec, _Opts.roofline, t, 7, [], True, _test).details.figures["student"]
    assert (student.gbps, student.tflops) == (1000.1, 1000.1)

    # 10000500000001 FLOPs in 10 ms: 1000.0500000001 TFLOP/s, a ten-billionth above the half-tenth
    class Finer(Odd):
        @staticmethod
        def flops(params, dt):
            return 10_000_500_000_001

    class FinerSpec:
        performance = Finer

    t = _timings({"student": [10.0] * 7, "reference": [10.0] * 7, "torch": TORCH})
    assert _verdict(FinerSpec, _Opts.roofline, t, 7, [], True, _test).details.figures["student"].tflops == 1000.1


# --- the timed loop's own findings ----------------------------------------------------------------
def _loop(**kw) -> Timings:
    t = Timings()
    t.launches = {"student": 10}
    for k, v in kw.items():
        setattr(t, k, v)
    return t


def test_each_conduct_finding_reads_exactly():
    tampered = _conduct(_loop(tampered={"torch.cuda.synchronize", "torch.cuda.Event.elapsed_time"}), 10)
    assert tampered == [Finding(Severity.CONCLUSIVE, "the timing functions were replaced during the run: "
                                "torch.cuda.Event.elapsed_time, torch.cuda.synchronize")]
    advice = ("; a caller would read an unfinished result (make the caller's stream wait for yours: "
              "torch.cuda.current_stream().wait_stream(s))")
    assert _conduct(_loop(unfinished=["k ran late"]), 10) == [
        Finding(Severity.REVIEW, "your function returned before its GPU work was done: k ran late" + advice)]
    assert _conduct(_loop(unfinished=["k1", "k2"]), 10) == [
        Finding(Severity.REVIEW, "your function returned before its GPU work was done: k1 (and 1 more calls)" + advice)]
    assert _conduct(_loop(unfinished=["k1", "k2", "k3"]), 10) == [
        Finding(Severity.REVIEW, "your function returned before its GPU work was done: k1 (and 2 more calls)" + advice)]
    assert _conduct(_loop(strays=["s1"]), 10) == [
        Finding(Severity.REVIEW, "GPU work ran while none of your calls was running: s1")]
    assert _conduct(_loop(strays=["s1", "s2"]), 10) == [
        Finding(Severity.REVIEW, "GPU work ran while none of your calls was running: s1 (and 1 more)")]
    assert _conduct(_loop(), 11) == [
        Finding(Severity.REVIEW, "only 10 Triton kernel launches in 11 timed calls: the timed work did not run in your kernel")]
    assert _conduct(_loop(), 10) == []


def test_conduct_findings_come_in_a_fixed_order():
    t = _loop(tampered={"x"}, unfinished=["u"], strays=["s"])
    assert [f.text.split(":")[0] for f in _conduct(t, 12)] == [
        "the timing functions were replaced during the run", "your function returned before its GPU work was done",
        "GPU work ran while none of your calls was running", "only 10 Triton kernel launches in 12 timed calls"]


# --- the records' verdict, as the timing reports it ------------------------------------------------
def test_untrusted_records_say_why_naming_at_most_three_problems(monkeypatch):
    from grader.judge import activity

    with pytest.raises(UntrustedRecords) as err:
        call_times(_time_reply(activities=None, activity_error="CUPTI_ERROR_X"))
    assert str(err.value) == ("the GPU activity records could not be collected (CUPTI_ERROR_X): "
                              "work on other streams could go unseen")
    reading = activity.Reading(problems=["p1", "p2", "p3", "p4"])
    monkeypatch.setattr(activity, "read", lambda *a: reading)
    with pytest.raises(UntrustedRecords) as err:
        call_times(_time_reply(activities=[]))
    assert str(err.value) == "the GPU activity records do not fit the timed loop: p1; p2; p3"


def test_call_times_passes_the_records_and_both_sets_of_marks(monkeypatch):
    from grader.judge import activity

    got = []
    reading = activity.Reading(busy_ms=[0.5])
    monkeypatch.setattr(activity, "read", lambda *a: got.append(a) or reading)
    reply = _time_reply(activities=[["k", 1, 0, 1]], marks=[[1, 2, 3]], settle_marks=[[4, 5, 6]], event_ms=[0.6])
    assert call_times(reply) == ([0.5], [0.6], reading)
    assert got == [([["k", 1, 0, 1]], [[1, 2, 3]], [[4, 5, 6]])]


def _time_reply(**fields) -> TimeReply:
    return TimeReply(**{**dict(event_ms=[], marks=[], settle_marks=[], host_ms=[], activities=None, activity_error=None,
                               first_call_ms=0.0, launches=0, tampered=[], output_numel=None), **fields})


# --- the ratio's interval ----------------------------------------------------------------------------
def test_the_interval_is_the_middle_95_percent_of_bootstrap_medians():
    # rounds with ratios 1, 2 and 3: a resample of three has median 1 when at least two draws are 1
    # (7 of 27 resamples), 3 likewise (7 of 27), else 2 (13 of 27). With 2000 draws, the 2.5% and
    # 97.5% points (the 51st and 1950th sorted medians) are 1 and 3, and the estimate is 2.
    reference = [[1.0]] * 7
    assert ratio_estimate([[1.0], [2.0], [3.0]], reference[:3]) == (2.0, 1.0, 3.0)
    # ratios 1, 2, 2, 2, 2, 2, 3: a resample of seven has median 3 only when four or more of its draws
    # are 3 (p = 1/7 each): 1.0% of resamples, about 20 of 2000; median 1 as rarely. Both ends of the
    # interval are 2: the median of whole resamples is far steadier than a single round's ratio
    rounds = [[1.0], [2.0], [2.0], [2.0], [2.0], [2.0], [3.0]]
    assert ratio_estimate(rounds, reference) == (2.0, 2.0, 2.0)


def test_the_interval_follows_the_seed_given_and_only_it():
    # 41 distinct ratios: the interval's ends depend on the resamples drawn, so the same seed must
    # give the same interval every time (a report can be reproduced)
    for n in (31, 41, 51):
        student = [[1.0 + 0.01 * i] for i in range(n)]
        reference = [[1.0]] * n
        assert ratio_estimate(student, reference, seed=5) == ratio_estimate(student, reference, seed=5)
        assert ratio_estimate(student, reference) == ratio_estimate(student, reference, seed=0)
