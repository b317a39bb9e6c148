"""The course's points in what a student's own check reports: course.toml's `[assignments.NAME]
points`, shipped by `grader release` (grader-kit.toml's `[points]`) and `grader gradescope` (the
zip's course/grader-points.toml), so that a kit's CI run, Classroom 50's result.json and
Gradescope's results.json say the grade out of the points every gradebook of the class says.

Only the points are shipped: a kit and an autograder never carry course.toml's deadlines,
extensions or late policy (CI has no deadline; the class side applies the penalty). Each value
is scaled by grader.batch.course.CourseConfig.scale and rounded as the class view rounds it
(grader.batch.classview: four decimals), so a raw score shows the same number here as in
canvas.csv and grades.csv. A file in the student's repo (a kit's grader-kit.toml) may only
change what their CI shows them, never a grade: a value that is not a positive number is left
out, and an assignment without one keeps the spec's points.
"""

from __future__ import annotations

import math
import sys
from fractions import Fraction
from pathlib import Path

from grader.batch.course import CourseConfig, exact
from grader.kit.release import POINTS_TABLE, toml_number  # grader-kit.toml's [points]: assignment = the course's points
from grader.results import AssignmentResult, cents

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

POINTS_FILE = "grader-points.toml"  # beside a Gradescope autograder's course copy: [points] alone


def points_file(points: dict[str, Fraction], names: list[str]) -> str:
    """grader-points.toml's text: course.toml's `points` of these assignments, nothing else of it
    (empty where it sets none of them)."""
    table = {n: toml_number(points[n]) for n in names if n in points}
    if not table:
        return ""
    return ("# The course's points for each assignment (course.toml's; made by `grader gradescope`):\n"
            "# what results.json reports the grade out of. No deadline or late policy is shipped.\n"
            f"[{POINTS_TABLE}]\n" + "".join(f"{n} = {v}\n" for n, v in table.items()))


def shipped_points(catalogue) -> dict[str, Fraction]:
    """The course's points a check of `catalogue` (a grader.spec.Course) reports by: a kit's
    grader-kit.toml `[points]`, else an autograder's grader-points.toml; {} where neither says any
    (then nothing is scaled). Unreadable or malformed: {} (a CI run shows the spec's points)."""
    try:
        table = (catalogue.kit_manifest() or {}).get(POINTS_TABLE)
        path = Path(catalogue.root) / POINTS_FILE
        if table is None and path.is_file() and not path.is_symlink():
            table = tomllib.loads(path.read_text(encoding="utf-8")).get(POINTS_TABLE)
    except (OSError, ValueError, UnicodeDecodeError, AttributeError, TypeError):
        return {}
    if not isinstance(table, dict):
        return {}
    return {str(k): Fraction(str(v)) for k, v in table.items()
            if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and v > 0}


def whole(a: AssignmentResult) -> float:
    """What the assignment is out of in its own points (a partial run's: the whole assignment's)."""
    return a.partial["assignment_points"] if a.partial else a.max_score


def scaled(a: AssignmentResult, value: float, points: dict[str, Fraction]) -> float:
    """`value`, in `a`'s own points, in the course's: as the class view scales and rounds a cell."""
    if a.name not in points or not whole(a):
        return value
    v, _ = CourseConfig(points=points).scale(a.name, exact(value), exact(whole(a)))
    return round(float(v), 4)


def out_of(a: AssignmentResult, points: dict[str, Fraction]) -> float:
    """The assignment's whole points in the course (course.toml's where shipped, else its own)."""
    return float(points[a.name]) if a.name in points and whole(a) else whole(a)


def total(assignments: list[AssignmentResult], value, points: dict[str, Fraction]) -> float:
    """A run's sum of `value(a)` in the course's points, added in cents as the class view adds a row."""
    return sum(cents(scaled(a, value(a), points)) for a in assignments) / 100


def gradebook(assignments: list[AssignmentResult], points: dict[str, Fraction]) -> dict | None:
    """Each assignment's grade in the course's points, in the shape of a class's course grades
    (grader.batch.grades.CourseGrade.to_json, which RunResult.to_gradescope and the report read),
    with no late penalty (`ci`: CI applies none); None where nothing is scaled."""
    if not any(a.name in points for a in assignments):
        return None
    book = {}
    for a in assignments:
        score = scaled(a, a.score, points)
        lacks = [*(["partial run"] if a.partial else []), *(["CPU only"] if a.gpu_points_not_graded else [])]
        book[a.name] = {"student": "", "assignment": a.name, "status": "graded", "points": score,
                        "out_of": out_of(a, points), "late_penalty": 0.0, "final": score, "lacks": lacks,
                        "held": False, "ci": True}
    return book
