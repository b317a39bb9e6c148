"""What a student reads first: one headline per assignment, and failures grouped by diagnosis.

A student who runs the untouched starter should not scroll through ten copies of the same
explanation: the headline says what state the code is in, and every distinct diagnosis is
told once, with the cases it concerns.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from grader.results import BAD_OUTCOMES, AssignmentResult, TestResult


@dataclass
class FailureGroup:
    """Tests of one assignment that failed the same way."""

    assignment: str
    outcome: str
    diagnosis: str
    tests: list[TestResult] = field(default_factory=list)

    @property
    def first(self) -> TestResult:
        return self.tests[0]

    @property
    def cases(self) -> str:
        """The cases, named once each: 'n=1, n=127 [float32, float16]'."""
        names = [t.name for t in self.tests]
        return ", ".join(names[:8]) + (f" and {len(names) - 8} more" if len(names) > 8 else "")


def diagnosis(t: TestResult) -> str:
    """A failure's cause without what is particular to its case (counts, the case's note), so
    that the same bug in ten cases is one diagnosis."""
    pattern = t.details.get("pattern")
    if pattern:
        return pattern
    return t.message


def group_failures(tests: list[TestResult]) -> list[FailureGroup]:
    """Bad outcomes grouped by (assignment, outcome, diagnosis), in the order first seen."""
    groups: dict[tuple, FailureGroup] = {}
    for t in tests:
        if t.outcome not in BAD_OUTCOMES:
            continue
        key = (t.assignment, t.outcome, diagnosis(t))
        groups.setdefault(key, FailureGroup(t.assignment, t.outcome, key[2])).tests.append(t)
    return list(groups.values())


def stores_nothing(t: TestResult) -> bool:
    """A correctness case whose output is still, every element of it, the NaN poison of
    uninitialized memory: the kernel stored nothing (or was never launched)."""
    d = t.details
    return (t.kind == "correctness" and t.outcome == "failed" and d.get("elements", 0) > 0
            and d.get("nan_elements") == d.get("elements"))


def headline(result: AssignmentResult, module_file: Path | None) -> str:
    """The assignment's first line when one cause explains everything: the starter untouched
    (nothing stored anywhere). Empty otherwise: the failures speak for themselves."""
    ran = [t for t in result.tests if t.kind == "correctness" and t.outcome != "skipped"]
    if not ran or not all(stores_nothing(t) for t in ran):
        return ""
    launched = any(t.details.get("kernels") for t in ran)
    what = "the kernel stores nothing yet" + ("" if launched else " (no Triton kernel was launched)")
    name = module_file.name if module_file is not None else "your module"
    todo = _has_todo(module_file)
    where = f"fill in the TODOs in {result.module.split(':')[0]}" if todo else f"write the kernel's tl.store in {name}"
    return (f"{what}: every output is still uninitialized memory (NaN) in all {len(ran)} cases; {where}, "
            "then run grader check again")


def _has_todo(path: Path | None) -> bool:
    try:
        return path is not None and "TODO" in path.read_text(errors="replace")
    except OSError:
        return False
