"""Results: what one check run produced, and its results.json in Gradescope's format.

Gradescope's schema (score, max_score, tests[] with name, score, max_score, status, output)
is the base; each test adds `outcome` (the eight outcomes below, finer than passed/failed)
and `tags`, and the top level adds `extra_data` with the environment and the seed.
"""

from __future__ import annotations

import json
import os
import tempfile
from dataclasses import asdict, dataclass, field
from pathlib import Path

OUTCOMES = ("passed", "failed", "error", "timeout", "crashed", "skipped", "flagged", "infra_error")
BAD_OUTCOMES = {"failed", "error", "timeout", "crashed", "flagged"}


@dataclass
class TestResult:
    __test__ = False  # not a pytest test class
    assignment: str
    kind: str  # correctness | performance | integrity
    name: str
    outcome: str
    message: str = ""
    max_score: float = 0.0
    score: float = 0.0
    case: str | None = None
    dtype: str | None = None
    shape: str | None = None
    details: dict = field(default_factory=dict)
    traceback: str = ""
    output: str = ""  # the worker's captured stdout/stderr, head and tail
    reproducer: str = ""

    def __post_init__(self) -> None:
        assert self.outcome in OUTCOMES, self.outcome


@dataclass
class AssignmentResult:
    name: str
    title: str
    module: str
    tests: list[TestResult] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    warnings: list[dict] = field(default_factory=list)  # the static scan's findings (grader.integrity), for a TA
    headline: str = ""  # one line that explains every failure at once (grader.feedback), shown first
    partial: dict = field(default_factory=dict)  # only some cases ran (--case/--dtype): cases_run, cases, assignment_points

    @property
    def score(self) -> float:
        return round(sum(t.score for t in self.tests), 4)

    @property
    def max_score(self) -> float:
        return round(sum(t.max_score for t in self.tests), 4)

    @property
    def skipped_points(self) -> float:
        return round(sum(t.details.get("points_if_run", 0.0) for t in self.tests if t.outcome == "skipped"), 4)

    def count(self, outcome: str) -> int:
        return sum(t.outcome == outcome for t in self.tests)


@dataclass
class RunResult:
    submission: str
    seed: int
    environment: dict
    assignments: list[AssignmentResult] = field(default_factory=list)
    commit: str | None = None

    @property
    def score(self) -> float:
        return round(sum(a.score for a in self.assignments), 4)

    @property
    def max_score(self) -> float:
        return round(sum(a.max_score for a in self.assignments), 4)

    @property
    def tests(self) -> list[TestResult]:
        return [t for a in self.assignments for t in a.tests]

    @property
    def all_passed(self) -> bool:
        return not any(t.outcome in BAD_OUTCOMES or t.outcome == "infra_error" for t in self.tests)

    def to_gradescope(self) -> dict:
        tests = []
        for t in self.tests:
            entry = {
                "name": f"{t.assignment}: {t.name}",
                "score": t.score,
                "max_score": t.max_score,
                "output": _test_output(t),
                "outcome": t.outcome,
                "tags": [t.assignment, t.kind] + ([t.dtype] if t.dtype else []),
                "extra_data": {k: v for k, v in asdict(t).items() if k in ("case", "dtype", "shape", "details", "reproducer")},
            }
            if t.outcome != "skipped":
                entry["status"] = "passed" if t.outcome == "passed" else "failed"
            tests.append(entry)
        return {
            "score": self.score,
            "max_score": self.max_score,
            "output": f"{self.score:g} / {self.max_score:g} points",
            "tests": tests,
            "extra_data": {
                "submission": self.submission,
                "commit": self.commit,
                "seed": self.seed,
                "environment": self.environment,
                "assignments": {
                    a.name: {"score": a.score, "max_score": a.max_score, "skipped_points": a.skipped_points,
                             "headline": a.headline, "partial": a.partial, "notes": a.notes,
                           "integrity_warnings": a.warnings}
                    for a in self.assignments
                },
            },
        }


def _test_output(t: TestResult) -> str:
    parts = [f"[{t.outcome}] {t.message}"]
    if t.reproducer and t.outcome != "passed":
        parts.append(f"Reproduce: {t.reproducer}")
    if t.traceback:
        parts.append(t.traceback)
    elif t.output and t.outcome in ("crashed", "timeout", "infra_error"):
        parts.append("Last lines of the worker's output:\n" + "\n".join(t.output.rstrip().splitlines()[-15:]))
    return "\n".join(parts)


def write_json_atomic(data: dict, path: Path) -> None:
    """Write through a temp file and rename, so a reader never sees half a file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    with os.fdopen(fd, "w") as f:
        json.dump(data, f, indent=2, default=str)
        f.flush()
        os.fsync(f.fileno())  # on disk before the rename: a crash leaves the old file or the new one
    os.replace(tmp, path)


def write_text_atomic(text: str, path: Path) -> None:
    """write_json_atomic for text (HTML, CSV)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    with os.fdopen(fd, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
