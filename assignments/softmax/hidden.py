"""softmax's hidden cases: graded, never released to students (grader release leaves this file out).

Six of them, so that 7 named + 6 hidden + 3 random cases split the 12 points into exact 0.25s."""

from grader.spec_api import Case

CASES = (
    Case("5x16385", {"rows": 5, "cols": 16385}, "one column past 16384: a row spills into a second block"),
    Case("sliced-33x2049", {"rows": 33, "cols": 2049, "layout": "sliced"}, "a sliced view with rows one past a power of two"),
    Case("1x2-pair", {"rows": 1, "cols": 2}, "one row of two"),
    Case("3x1-single-column", {"rows": 3, "cols": 1}, "one column: every result is exactly 1"),
    Case("transposed-7x33", {"rows": 7, "cols": 33, "layout": "transposed"}, "a small transposed view"),
    Case("negative-first-row-4x100", {"rows": 4, "cols": 100, "negative_row": 0}, "the first row near -30000"),
)
