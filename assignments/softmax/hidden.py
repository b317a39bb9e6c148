"""softmax's hidden cases: graded, never released to students (grader release leaves this file out)."""

from grader.spec import Case

CASES = (
    Case("5x16385", {"rows": 5, "cols": 16385}, "one column past 16384: a row spills into a second block"),
    Case("sliced-33x2049", {"rows": 33, "cols": 2049, "layout": "sliced"}, "a sliced view with rows one past a power of two"),
)
