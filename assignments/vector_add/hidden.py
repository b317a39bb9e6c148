"""vector_add's hidden cases: graded, never released to students (grader release leaves this file out)."""

from grader.spec import Case

CASES = (
    Case("n=4095", {"n": 4095}, "one short of a multiple of every block size up to 4096"),
    Case("strided-n=3001-stride=3", {"n": 3001, "stride": 3}, "x is a view with stride 3, and an odd length"),
)
