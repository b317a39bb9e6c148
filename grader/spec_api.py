"""What an assignment's spec.py and hidden.py use of the grader, declared in one place.

A spec file imports from this module and from no other module of the package
(tests/core/test_spec.py reads every spec file to hold it to that): the spec's model
(`Assignment`, `Case`, `Performance`, `Tolerance`, `aten_ops` for forbidden_ops), what an `explain`
hook is handed and may test as hypotheses (`Mismatch` and the readings of a wrong kernel), and what
a `check` returns (`Verdict`, with an `Outcome`). So the names a course depends on are this list:
the judge's modules may change behind it, and a rename here is a change a course must hear of.
No module of the package imports this one: it is the specs' face, above the judge.
"""

from __future__ import annotations

from grader.judge.mismatch import Mismatch, contiguous_reading, low_precision_sum, swapped_reading
from grader.judge.verdict import Verdict
from grader.results import Outcome
from grader.spec import DTYPES, Assignment, Case, Performance, Tolerance, aten_ops

__all__ = [
    # the spec: SPEC = Assignment(...), in spec.py; CASES = (Case(...), ...) in hidden.py
    "Assignment", "Case", "Performance", "Tolerance", "DTYPES", "aten_ops",
    # an explain hook's input and the readings it may test
    "Mismatch", "contiguous_reading", "swapped_reading", "low_precision_sum",
    # a property check's answer
    "Verdict", "Outcome",
]
