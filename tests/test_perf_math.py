"""The timing verdict's arithmetic, on made-up timings (no GPU needed)."""

from grader.perf import Timings, _check_clock, ratio_estimate


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


def test_clock_check_flags_work_hidden_from_the_events():
    reps = 30
    honest = Timings(times={"student": [[1.0] * reps], "reference": [[1.0] * reps]},
                     outer_ms={"student": [reps * 1.06], "reference": [reps * 1.05]})
    assert _check_clock(honest, reps, True) == []
    hidden = Timings(times={"student": [[0.02] * reps], "reference": [[1.0] * reps]},
                     outer_ms={"student": [reps * 1.1], "reference": [reps * 1.05]})
    evidence = _check_clock(hidden, reps, True)
    assert evidence and "by the grader's clock" in evidence[0]
