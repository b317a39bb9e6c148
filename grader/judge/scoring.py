"""Scoring: turn outcomes into points, after every test of an assignment is known.

Points are kept in hundredths (integers), so that the shares of an assignment add up to exactly
the number its spec gives: correctness points are split over the planned correctness tests by
largest remainder (16 points over 3 tests: 5.34, 5.33, 5.33), never 5.333 each and 15.999 in
all. A test that could not run here (skipped) keeps its share as its maximum and earns nothing
here: an assignment is always out of its spec's total, and the report says which points need
a GPU. Performance points follow the spec's curve, and only with every correctness test passed.

Integrity findings cost what they taint (grader.results.Severity):
- conclusive (the vendor op computed the result, the timers were patched, outputs forged or
  replayed): every point of the assignment, until a TA reviews it;
- review (evidence a TA must look at, not proof): the points of the tests it concerns only.
"""

from __future__ import annotations

from grader.payloads import IntegrityPayload, PerformancePayload
from grader.results import AssignmentResult, Outcome, Severity, TestResult, cents
from grader.spec import Assignment


def split_cents(points: float, parts: int) -> list[int]:
    """`points` in hundredths, split over `parts` shares that differ by at most one hundredth and
    add up to exactly round(points * 100); the larger shares come first."""
    if parts <= 0:
        return []
    base, extra = divmod(cents(points), parts)
    return [base + (1 if i < extra else 0) for i in range(parts)]


def score_assignment(spec: Assignment, result: AssignmentResult, planned: list[str] | None = None) -> None:
    """`planned`: the names of the full run's correctness tests, in order, when only some of them
    ran (--case, --dtype): each test that ran keeps the share it has in the full run."""
    correctness = [t for t in result.tests if t.kind == "correctness"]
    names = planned if planned is not None else [t.name for t in correctness]
    shares = dict(zip(names, split_cents(spec.correctness_points, len(names))))
    for t in correctness:
        _assign(t, shares.get(t.name, 0), 1.0 if t.outcome == Outcome.PASSED else 0.0)
    for t in result.tests:
        if t.kind == "performance":
            _assign(t, cents(spec.performance_points), _fraction(t) if t.outcome == Outcome.PASSED else 0.0)
    flagged = [t for t in result.tests if t.outcome == Outcome.FLAGGED]
    conclusive = [t for t in flagged if t.severity != Severity.REVIEW]
    if conclusive:
        for t in result.tests:
            t.score = 0.0
        result.notes.append("A conclusive integrity finding (" + "; ".join(t.name for t in conclusive)
                            + "): no points for this assignment until a TA reviews it.")
        return
    for finding in flagged:
        concerned = set(finding.details.concerns or ()) if isinstance(finding.details, IntegrityPayload) else set()
        lost = 0
        for t in result.tests:
            if t is finding or t.name in concerned:
                lost += cents(t.max_score)
                t.score = 0.0
        result.notes.append(f"For a TA to review: {finding.name} ({finding.message}). "
                            f"The {lost / 100:g} points it concerns are withheld until then; the rest of the "
                            f"assignment counts.")


def points_without_findings(result: AssignmentResult) -> float:
    """The assignment's points as if no integrity finding stood: what a TA's clearing of its flags
    restores (grader.batch.reviews). Each test earns what score_assignment gave it before a
    finding took it: a passed correctness test its share, a passed timing test its curve's, and so
    does a timing held for review (a figure the grader could not verify: grader.judge.perf._hold)."""
    total = 0
    for t in result.tests:
        if t.kind == "performance" and (t.outcome == Outcome.PASSED or _held(t)):
            total += round(cents(t.max_score) * _fraction(t))
        elif t.outcome != Outcome.PASSED:
            total += cents(t.score)
        else:
            total += cents(t.max_score)
    return total / 100


def _held(test: TestResult) -> bool:
    """A timing whose figure waits for a TA's review, with its curve's share recorded."""
    return test.outcome == Outcome.FLAGGED and isinstance(test.details, PerformancePayload) \
        and bool(test.details.held)


def _fraction(test: TestResult) -> float:
    """The share of a timing test's points its curve gave (none recorded: none)."""
    d = test.details
    return (d.score_fraction or 0.0) if isinstance(d, PerformancePayload) else 0.0


def _assign(test: TestResult, share: int, fraction: float) -> None:
    test.max_score = share / 100
    if test.outcome == Outcome.SKIPPED:
        test.score = 0.0
        test.details.points_if_run = share / 100
    else:
        test.score = round(share * fraction) / 100
