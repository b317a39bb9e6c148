"""The timing verdict's arithmetic and decisions, on made-up timings and GPU activity records
(no GPU needed): what a side stream, a thread, an honest two-stream kernel, a slow wrapper and an
impossible time each get."""

from __future__ import annotations

import pytest

from grader.judge import activity
from grader.judge.perf import (MAX_ROUNDS, MIN_ROUNDS, ROOFLINE_MARGIN, Finding, Timings, UntrustedRecords, _conduct, _verdict,
                         call_times, floor_ms, needs_more_rounds, ratio_estimate, yardstick)
from grader.spec import Case, Performance
from grader.protocol import Time, TimeReply, decode_reply, encode
from grader.results import Severity, TestResult

US = 1_000  # ns


def test_paired_rounds_cancel_drift_between_rounds():
    # the GPU slows down 20% over the run; within a round the student is always 10% slower
    rounds = [1.0 + 0.01 * i for i in range(20)]
    student = [[1.1 * r] * 30 for r in rounds]
    reference = [[r] * 30 for r in rounds]
    mid, lo, hi = ratio_estimate(student, reference)
    assert abs(mid - 1.1) < 1e-9 and abs(hi - lo) < 1e-9


def test_interval_widens_with_noise_and_contains_the_estimate():
    import random

    rng = random.Random(1)
    student = [[1.05 * rng.uniform(0.9, 1.1) for _ in range(30)] for _ in range(10)]
    reference = [[rng.uniform(0.9, 1.1) for _ in range(30)] for _ in range(10)]
    mid, lo, hi = ratio_estimate(student, reference)
    assert lo < mid < hi and hi - lo > 0.005


# --- a synthetic timed loop: what grader.worker.timing records on the GPU -------------------------------
class Loop:
    """Builds the records and host marks of a timed loop call by call, with the harness's own
    flush and sleep where grader.worker.timing puts them. Times in ns from 0."""

    def __init__(self) -> None:
        self.t = 1_000_000
        self.records: list[list] = []
        self.marks: list[list[int]] = []
        self.settle_marks: list[list[int]] = []

    def _flush(self) -> tuple[int, int]:
        before = self.t
        self.records.append(["at::native::FillFunctor<int>", 7, before + 6 * US, before + 60 * US])
        after = before + 70 * US
        return before, after

    def timed(self, kernels: list[tuple[int, int, int]], extra_in_flush: bool = False) -> None:
        """kernels: (stream, start offset, duration) in us, offsets from the end of our sleep
        (negative: a side stream that started during the sleep)."""
        before, after = self._flush()
        if extra_in_flush:
            self.records.append(["stray_kernel", 13, before + 20 * US, before + 40 * US])
        sleep_start, sleep_end = after + 5 * US, after + 1005 * US
        self.records.append(["spin_kernel(long)", 7, sleep_start, sleep_end])
        end = sleep_end
        for stream, offset, duration in kernels:
            start = sleep_end + offset * US
            self.records.append(["add_kernel", stream, start, start + duration * US])
            end = max(end, start + duration * US)
        self.marks.append([before, after, after + 30 * US])
        self.t = end + 20 * US

    def settle(self, kernels: list[tuple[int, int, int]], joined: bool) -> None:
        """kernels: (stream, start offset, duration) from the call's start; the marker runs when
        the caller's stream is done: after the kernels if joined, else at once."""
        before, after = self._flush()
        begin = after + 10 * US
        end = begin
        for stream, offset, duration in kernels:
            start = begin + offset * US
            self.records.append(["add_kernel", stream, start, start + duration * US])
            end = max(end, start + duration * US)
        marker = (end + 2 * US) if joined else (begin + 3 * US)
        self.records.append(["spin_kernel(long)", 7, marker, marker + 2 * US])
        self.settle_marks.append([before, after, max(end, marker) + 10 * US])
        self.t = max(end, marker) + 30 * US

    def reply(self, event_ms: list[float]) -> TimeReply:
        """The worker's reply of this loop, as the grading process reads it off the wire."""
        return decode_reply(Time("student", [], {}, reps=len(event_ms)), encode(_time_reply(
            activities=self.records, marks=self.marks, settle_marks=self.settle_marks, event_ms=event_ms)))


def _time_reply(**fields) -> TimeReply:
    return TimeReply(**{**dict(event_ms=[], marks=[], settle_marks=[], host_ms=[], activities=None, activity_error=None,
                               first_call_ms=0.0, launches=0, tampered=[], output_numel=None), **fields})


def honest_loop(calls=5, duration=500) -> Loop:
    loop = Loop()
    for _ in range(calls):
        loop.timed([(7, 1, duration)])
    for _ in range(3):
        loop.settle([(7, 0, duration)], joined=True)
    return loop


def test_an_honest_single_stream_kernel_is_timed_by_its_own_gpu_work():
    loop = honest_loop()
    times, events, reading = call_times(loop.reply([0.503] * 5))
    assert times == pytest.approx([0.5] * 5)  # the kernel alone: our flush and sleep left out
    assert events == [0.503] * 5  # kept as a cross-check
    assert not reading.unfinished and not reading.strays and not reading.problems


def test_a_slow_wrappers_host_gaps_between_launches_are_not_gpu_time():
    loop = Loop()
    for _ in range(3):  # two kernels of 200 us, the second launched 2 ms later (Python in between)
        loop.timed([(7, 1, 200), (7, 2000, 200)])
    times, _, _ = call_times(loop.reply([2.4] * 3))
    assert times == pytest.approx([0.4] * 3)


def test_a_side_stream_without_a_wait_is_timed_where_it_ran_and_caught_returning_early():
    loop = Loop()
    for _ in range(5):  # launched during our sleep on another stream: the events see nothing
        loop.timed([(13, -700, 500)])
    for _ in range(3):
        loop.settle([(13, 0, 500)], joined=False)
    times, _, reading = call_times(loop.reply([0.002] * 5))
    assert times == pytest.approx([0.5] * 5)  # not 0.002 ms: the work is counted
    assert len(reading.unfinished) == 3 and "add_kernel ran 0.497 ms past the return" in reading.unfinished[0]


def test_an_honest_kernel_split_over_two_joined_streams_is_timed_whole_and_not_flagged():
    loop = Loop()
    for _ in range(5):
        loop.timed([(13, -300, 400), (17, -250, 450)])  # both start during the sleep, joined before the end event
    for _ in range(3):
        loop.settle([(13, 0, 400), (17, 5, 450)], joined=True)
    times, _, reading = call_times(loop.reply([0.2] * 5))
    assert times == pytest.approx([0.5] * 5)  # the two overlap: from the first start (-300 us) to the last end (-250 + 450 us)
    assert reading.unfinished == [] and reading.strays == []


def test_work_between_calls_is_a_stray_and_a_background_threads_late_work_outlives_the_return():
    loop = Loop()
    loop.timed([(7, 1, 500)], extra_in_flush=True)
    for _ in range(2):
        loop.timed([(7, 1, 500)])
    loop.settle([(13, 20, 500)], joined=False)  # a thread launches after the call returned
    _, _, reading = call_times(loop.reply([0.5] * 3))
    assert reading.strays == ["stray_kernel ran while no call of yours was running (before timed call 1)"]
    assert reading.unfinished and "past the return of settle call 1" in reading.unfinished[0]


def test_records_that_do_not_fit_the_loop_are_not_trusted():
    loop = honest_loop(calls=2)
    del loop.records[0]  # the first flush missing: the marks and the records disagree
    with pytest.raises(UntrustedRecords, match="timed call 1: the L2 flush is missing"):
        call_times(loop.reply([0.5] * 2))
    with pytest.raises(UntrustedRecords, match="could not be collected"):
        call_times(_time_reply(activities=None, activity_error="CUPTI_ERROR_NOT_INITIALIZED"))
    loop = honest_loop(calls=2)
    loop.records = [r for r in loop.records if "spin" not in r[0]]
    with pytest.raises(UntrustedRecords, match="launch shadow is missing"):
        call_times(loop.reply([0.5] * 2))


def test_a_call_that_ran_nothing_on_the_gpu_has_no_busy_time():
    loop = Loop()
    loop.timed([])
    times, _, reading = call_times(loop.reply([0.001]))
    assert times == [0.0] and reading.kernels == [0]


# --- decisions ------------------------------------------------------------------------------------
def test_rounds_stop_only_when_the_interval_is_tight_and_clear_of_the_thresholds():
    tight = [[1.5] * 30 for _ in range(MIN_ROUNDS)]
    ref = [[1.0] * 30 for _ in range(MIN_ROUNDS)]
    assert needs_more_rounds(MIN_ROUNDS - 1, tight[:-1], ref[:-1], 1.1, 3.0, False)
    assert not needs_more_rounds(MIN_ROUNDS, tight, ref, 1.1, 3.0, False)
    # a ratio of 1.1 +- 3% straddles full_at: measure on, until the cap or the budget
    import random

    rng = random.Random(3)
    noisy = [[1.1 * rng.uniform(0.94, 1.06)] * 30 for _ in range(MIN_ROUNDS)]
    assert needs_more_rounds(MIN_ROUNDS, noisy, ref, 1.1, 3.0, False)
    assert not needs_more_rounds(MAX_ROUNDS, noisy, ref, 1.1, 3.0, False)
    assert not needs_more_rounds(MIN_ROUNDS, noisy, ref, 1.1, 3.0, True)
    assert not needs_more_rounds(MIN_ROUNDS, noisy, None, 1.1, 3.0, False)  # nothing to compare with


def test_the_floor_is_set_by_the_tighter_ceiling():
    # 3 GB at 3000 GB/s: 1 ms; 2e12 FLOPs at 1000 TFLOP/s: 2 ms
    assert floor_ms(3 * 10**9, None, 3000.0, None) == (pytest.approx(1.0), "copy bandwidth")
    assert floor_ms(3 * 10**9, 2 * 10**12, 3000.0, 1000.0) == (pytest.approx(2.0), "cuBLAS GEMM peak")
    assert floor_ms(3 * 10**9, 10**9, 3000.0, 1000.0) == (pytest.approx(1.0), "copy bandwidth")


class _Spec:
    """Just what perf._verdict reads of a spec: vector_add's scoring case, 2^28 float32."""

    class performance:
        class case:
            name, params = "n=2^28", {"n": 1 << 28}
        dtype, full_at, zero_at, score_on = "float32", 1.1, 3.0, "gpu"
        bytes_moved = staticmethod(lambda p, dt: 12 * p["n"])
        flops = staticmethod(lambda p, dt: p["n"])

        @staticmethod
        def score_fraction(r):
            return 1.0 if r <= 1.1 else 0.0


class _Opts:
    roofline = {"gpu": "test GPU", "copy_gbps": 3000.0, "gemm_tflops": {"float32": 400.0}}


def _timings(student_ms: float, reference_ms: float = 1.1, host_ms: float | None = None, rounds: int = 5,
             torch_ms: float = 1.12) -> Timings:
    t = Timings()
    for c, ms in (("student", student_ms), ("reference", reference_ms), ("torch", torch_ms)):
        t.times[c] = [[ms] * 30 for _ in range(rounds)]
        t.event_ms[c] = [ms] * 30 * rounds
        host = host_ms if host_ms is not None and c == "student" else ms + 0.02  # the wrapper's cost is the student's alone
        t.host_ms[c] = [[host] * 3 for _ in range(rounds)]
        t.first_call_ms[c] = 100.0
    return t


def _test(outcome, message, **kw):
    return TestResult("vector_add", "performance", "performance", outcome, message, **kw)


def test_a_time_faster_than_the_hardware_earns_no_credit_and_shows_the_figures():
    # 2^28 * 12 bytes = 3.22 GB at 3000 GB/s: at least 1.074 ms
    findings: list[Finding] = []
    verdict = _verdict(_Spec, _Opts.roofline, _timings(0.5), 5, findings, True, _test)
    assert verdict.outcome == "flagged" and verdict.severity == "review"
    assert "faster than this GPU can go: 0.5000 ms per call" in verdict.message and "at least 1.0737 ms" in verdict.message
    # just inside the margin: an excellent kernel, not an impossible one
    ok = _verdict(_Spec, _Opts.roofline, _timings(1.0737 / (1 + ROOFLINE_MARGIN) * 1.01), 5, [], True, _test)
    assert ok.outcome == "passed", ok.message


def test_host_overhead_is_reported_and_never_flagged():
    verdict = _verdict(_Spec, _Opts.roofline, _timings(1.12, host_ms=2.7), 5, [], True, _test)
    assert verdict.outcome == "passed" and verdict.severity == ""
    assert "2.700 ms per call by the host's clock" in verdict.message
    assert "GB/s (" in verdict.message and "TFLOP/s" not in verdict.message  # memory-bound: bandwidth is the figure
    assert verdict.details.figures["student"].host_median_ms == 2.7


def test_a_spec_may_score_on_the_hosts_clock():
    class WallSpec(_Spec):
        class performance(_Spec.performance):
            score_on = "wall"

    slow_wrapper = _timings(1.12, host_ms=2.7)  # the kernel as fast as the reference, the wrapper slow
    assert _verdict(_Spec, _Opts.roofline, slow_wrapper, 5, [], True, _test).details.score_fraction == 1.0
    on_wall = _verdict(WallSpec, _Opts.roofline, slow_wrapper, 5, [], True, _test)
    assert on_wall.details.ratio_to_reference == pytest.approx(2.7 / 1.12, rel=1e-3)  # the reference's host time: 1.1 + 0.02 ms and on_wall.outcome == "failed"


def test_the_worst_finding_sets_the_severity():
    t = _timings(1.12)
    t.launches = {"student": 150}
    t.unfinished = ["add_kernel ran 0.497 ms past the return of settle call 1"]
    findings = _conduct(t, 150)
    assert [f.severity for f in findings] == [Severity.REVIEW]
    assert "returned before its GPU work was done" in findings[0].text
    review = _verdict(_Spec, _Opts.roofline, t, 5, findings, True, _test)
    assert review.outcome == "flagged" and review.severity == "review"
    t.tampered = {"torch.cuda.synchronize"}
    worst = _verdict(_Spec, _Opts.roofline, t, 5, _conduct(t, 150), True, _test)
    assert worst.severity == "conclusive" and "torch.cuda.synchronize" in worst.message


def test_an_honest_timing_has_no_findings():
    t = _timings(1.12)
    t.launches = {"student": 150}
    assert _conduct(t, 150) == []
    t.launches = {"student": 149}  # one timed call without a Triton launch
    assert [f.severity for f in _conduct(t, 150)] == [Severity.REVIEW]


def test_activity_windows_take_each_record_by_its_midpoint():
    # a record whose start is a few us early in the host's clock still lands in its own window
    loop = honest_loop(calls=1)
    loop.records[0][2] -= 8 * US  # the flush now starts 2 us before the host's `before` mark
    reading = activity.read(loop.records, loop.marks, loop.settle_marks)
    assert not reading.problems and reading.busy_ms == pytest.approx([0.5])


def test_a_call_that_did_no_gpu_work_is_impossible_not_a_crash():
    # a cached result handed back: nothing runs on the GPU, the measured time is 0
    verdict = _verdict(_Spec, _Opts.roofline, _timings(0.0), 5, [], True, _test)
    assert verdict.outcome == "flagged" and verdict.severity == "review"
    assert "faster than this GPU can go: 0.0000 ms per call" in verdict.message
    assert verdict.details.figures["student"].gbps is None


def test_the_report_shows_gpu_and_host_time_and_the_severity():
    from grader.report import render
    from grader.results import AssignmentResult, RunResult

    run = RunResult("repo", 1, {"mode": "gpu"})
    a = AssignmentResult("vector_add", "Vector addition", "kernels/vector_add.py:vector_add()")
    honest = _verdict(_Spec, _Opts.roofline, _timings(1.12, host_ms=2.7), 5, [], True, _test)
    cached = _verdict(_Spec, _Opts.roofline, _timings(0.0), 5, [], True, _test)
    a.tests += [honest, cached]
    run.assignments.append(a)
    html = render(run)
    assert "host ms per call" in html and "<td>2.7</td>" in html  # the slow wrapper's host time, beside its GPU time
    assert "GB/s" in html and "% of the copy bandwidth floor" in html
    assert "flagged (review)" in html and "faster than this GPU can go" in html


def test_a_decided_but_wide_interval_still_measures_on(monkeypatch):
    """The stop rule on the ratio's interval alone (the estimate given): stop once it is clear of
    both thresholds and its half-width is at most 1.5% of the ratio."""
    from grader.judge import perf

    rounds = [[1.0]] * MIN_ROUNDS

    def decide(mid, lo, hi):
        monkeypatch.setattr(perf, "ratio_estimate", lambda s, r: (mid, lo, hi))
        return needs_more_rounds(MIN_ROUNDS, rounds, rounds, 1.1, 3.0, False)

    assert decide(2.0, 1.98, 2.02) is False  # half-width 1% of 2.0: tight and clear of 1.1 and 3.0
    assert decide(2.0, 1.96, 2.04) is True  # half-width 2%: clear of both thresholds, but too wide
    assert decide(2.0, 1.9701, 2.0299) is False  # just under 1.5%
    assert decide(1.1, 1.095, 1.105) is True  # tight, but it straddles full_at
    assert decide(2.99, 2.98, 3.0) is False  # touching a threshold is not straddling it
    assert decide(1.105, 1.1, 1.11) is False  # from either side


def test_the_floor_without_a_measured_peak_or_flops_is_the_memory_floor():
    assert floor_ms(3 * 10**8, 10**15, 3000.0, None) == (pytest.approx(0.1), "copy bandwidth")  # no GEMM peak measured
    assert floor_ms(3 * 10**8, None, 3000.0, 750.0) == (pytest.approx(0.1), "copy bandwidth")  # no FLOPs stated


def test_overlapping_activities_count_once_however_they_chain():
    A = activity.Activity
    assert activity.union_ns([A("a", 1, 0, 10), A("b", 2, 5, 15), A("c", 3, 12, 20)]) == 20
    assert activity.union_ns([A("a", 1, 0, 10), A("b", 2, 10, 12), A("c", 3, 30, 31)]) == 13
    assert activity.union_ns([A("a", 1, 0, 100), A("b", 2, 5, 15)]) == 100
    assert activity.union_ns([]) == 0


# --- the records, read exactly: labels, messages and the windows' edges ------------------------------
def _marks(before: int) -> list[int]:
    """A call's host marks: `before`, `after` (1 us later) and its return."""
    return [before, before + 1000, before + 1100]


def test_every_problem_and_stray_names_its_call():
    # timed 1: no shadow; timed 2: no flush; settle 1: no marker, and a stranger in its flush window;
    # settle 2: no flush. Each is named, in order, and one call's problem does not hide the next's.
    records = [["fill", 7, 1100, 1900], ["k", 7, 2100, 2500],
               ["spin_kernel", 7, 11100, 11500], ["k", 7, 11500, 11600],
               ["fill", 7, 20100, 20500], ["intruder", 13, 20600, 20800], ["k", 7, 21100, 21200],
               ["spin_kernel", 7, 31100, 31200]]
    reading = activity.read(records, [_marks(1000), _marks(10000)], [_marks(20000), _marks(30000)])
    assert reading.problems == ["timed call 1: the launch shadow is missing from the records",
                                "timed call 2: the L2 flush is missing from the records",
                                "settle call 1: the marker is missing from the records",
                                "settle call 2: the L2 flush is missing from the records"]
    assert reading.strays == ["intruder ran while no call of yours was running (before settle call 1)"]
    assert reading.busy_ms == [pytest.approx(0.0001)] and reading.kernels == [1]  # timed call 2: k alone, 100 ns


def test_work_before_the_first_call_is_a_stray_and_no_call_reads_as_nothing():
    records = [["early", 3, 0, 100], ["fill", 7, 1100, 1900], ["spin_kernel", 7, 2100, 3000], ["k", 7, 3000, 3300]]
    reading = activity.read(records, [_marks(1000)], [])
    assert reading.strays == ["early ran before the first timed call"] and not reading.problems
    assert reading.busy_ms == [pytest.approx(0.0003)] and reading.kernels == [1]
    empty = activity.read(records, [], [])
    assert (empty.busy_ms, empty.kernels, empty.unfinished, empty.strays, empty.problems) == ([], [], [], [], [])


def test_a_record_on_a_windows_edge_goes_to_the_window_that_begins_there():
    # call A: before 1000, after 2000; call B: before 5000, after 6000. Midpoints exactly on an edge:
    # the flush at 1000 (A's `before`) is A's; a kernel at 2000 (A's `after`) is A's work; B's flush at
    # 5000 (B's `before`) is B's, not A's work.
    records = [["fill", 7, 900, 1100], ["k_edge", 7, 1990, 2010], ["spin_kernel", 7, 2020, 3000], ["k", 7, 3000, 3400],
               ["fill", 7, 4990, 5010], ["spin_kernel", 7, 6020, 7000], ["k", 7, 7000, 7100]]
    reading = activity.read(records, [[1000, 2000, 4000], [5000, 6000, 8000]], [])
    assert not reading.problems and not reading.strays
    assert reading.busy_ms == [0.00042, 0.0001]  # A: 20 + 400 ns; B: 100 ns, in ms
    assert reading.kernels == [2, 1]


def test_work_that_outlives_the_return_is_named_by_its_latest_activity():
    # settle 1: the marker starts at 6000 ns; a ends 1 us after it (the timestamps' grain: on time),
    # b 1.5 us and c 2 us after it (late: c is the worst of two); settle 2: one late activity
    records = [["fill", 7, 100, 900], ["spin_kernel", 7, 1100, 1500], ["k", 7, 1500, 1600],  # timed call 1
               ["fill", 7, 2100, 2900], ["a", 13, 3050, 4000 + 3000], ["b", 13, 3100, 4500 + 3000],
               ["c", 13, 3200, 5000 + 3000], ["spin_kernel", 7, 6000, 6002],
               ["fill", 7, 10100, 10900], ["d", 13, 11050, 11200 + 1_000_501], ["spin_kernel", 7, 11200, 11202]]
    reading = activity.read(records, [[0, 1000, 1600]], [[2000, 3000, 9000], [10000, 11000, 12000]])
    assert not reading.problems and not reading.strays
    assert reading.unfinished == ["c ran 0.002 ms past the return of settle call 1 (2 activities)",
                                  "d ran 1.001 ms past the return of settle call 2"]  # 1000501 ns
    assert reading.busy_ms == [pytest.approx(0.0001)] and reading.kernels == [1]  # settle calls are not timed


class _FasterSpec(_Spec):
    class performance(_Spec.performance):
        against = "faster"

        @staticmethod
        def score_fraction(r):
            return Performance(case=Case("c", {}), dtype="float32", bytes_moved=lambda p, dt: 0).score_fraction(r)


def test_a_spec_may_score_against_the_faster_of_the_reference_and_the_vendor():
    # the vendor (cuDNN, SDPA) 1.0 ms, the reference 1.3 ms, the student 1.3 ms: as fast as the
    # reference, 1.3x the vendor's time
    t = _timings(1.3, reference_ms=1.3, torch_ms=1.0)
    on_reference = _verdict(_Spec, _Opts.roofline, t, 5, [], True, _test)
    assert on_reference.details.ratio_to_reference == pytest.approx(1.0) and on_reference.details.score_fraction == 1.0
    on_faster = _verdict(_FasterSpec, _Opts.roofline, t, 5, [], True, _test)
    assert on_faster.details.ratio_to_reference == pytest.approx(1.3)
    assert 0 < on_faster.details.score_fraction < 1  # between full_at 1.1 and zero_at 3.0
    assert on_faster.details.rounds_vendor_faster == 5
    assert "the faster of the reference kernel's and torch's (torch in 5 of 5 rounds)" in on_faster.message
    # where the reference is the faster, scoring against the faster is scoring against the reference
    ahead = _timings(1.3, reference_ms=1.0, torch_ms=1.2)
    a, b = (_verdict(s, _Opts.roofline, ahead, 5, [], True, _test) for s in (_Spec, _FasterSpec))
    assert a.details.ratio_to_reference == b.details.ratio_to_reference == pytest.approx(1.3)
    assert b.details.rounds_vendor_faster == 0


def test_the_faster_yardstick_is_chosen_round_by_round():
    reference = [[1.0, 1.0], [2.0, 2.0], [1.0, 1.0]]
    vendor = [[1.5, 1.5], [1.5, 1.5], [0.9, 0.9]]
    scored = {"student": [[1.0]] * 3, "reference": reference, "torch": vendor}
    assert yardstick(_FasterSpec.performance, scored) == [reference[0], vendor[1], vendor[2]]
    assert yardstick(_Spec.performance, scored) == reference  # the default: the reference alone
    assert yardstick(_FasterSpec.performance, {"student": [[1.0]], "torch": vendor}) is None  # no reference: nothing scored


def test_a_spec_names_what_it_is_scored_against():
    with pytest.raises(ValueError, match="against must be 'reference' or 'faster'"):
        Performance(case=Case("c", {}), dtype="float16", bytes_moved=lambda p, dt: 0, against="cudnn")
