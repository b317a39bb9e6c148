"""Scoring: turn outcomes into points, after every test of an assignment is known.

Correctness points are split evenly over the planned correctness tests; a test that could
not run here (skipped) carries no points here and says what it would have been worth.
Performance points follow the spec's curve, and only with every correctness test passed.
An integrity flag takes every point of that assignment: a score must be earned.
"""

from __future__ import annotations

from grader.results import AssignmentResult
from grader.spec import Assignment


def score_assignment(spec: Assignment, result: AssignmentResult, planned: int | None = None) -> None:
    """`planned`: how many correctness tests the full run has, when only some of them ran
    (--case, --dtype): each keeps the share it has in the full run."""
    correctness = [t for t in result.tests if t.kind == "correctness"]
    count = planned if planned is not None else len(correctness)
    each = spec.correctness_points / count if count else 0.0
    for t in correctness:
        _assign(t, each, 1.0 if t.outcome == "passed" else 0.0)
    for t in result.tests:
        if t.kind == "performance":
            _assign(t, spec.performance_points, t.details.get("score_fraction", 0.0) if t.outcome == "passed" else 0.0)
    if any(t.outcome == "flagged" for t in result.tests):
        for t in result.tests:
            t.score = 0.0
        result.notes.append("An integrity check was flagged: no points for this assignment until a TA reviews it.")


def _assign(test, points: float, fraction: float) -> None:
    if test.outcome == "skipped":
        test.max_score, test.score = 0.0, 0.0
        test.details["points_if_run"] = round(points, 4)
    else:
        test.max_score = round(points, 4)
        test.score = round(points * fraction, 4)
