"""vector_add's hidden cases: graded, never released to students (grader release leaves this file out).

Six of them, so that 7 named + 6 hidden + 3 random cases split the 6 points into exact 0.125s."""

from grader.spec_api import Case

CASES = (
    Case("n=4095", {"n": 4095}, "one short of a multiple of every block size up to 4096"),
    Case("strided-n=3001-stride=3", {"n": 3001, "stride": 3}, "x is a view with stride 3, and an odd length"),
    Case("n=2-pair", {"n": 2}, "two elements: one program, nearly all masked"),
    Case("n=1023-below-1024", {"n": 1023}, "one short of a common block size"),
    Case("n=65535-odd-tail", {"n": 65535}, "many blocks and a tail of one short of a block"),
    Case("strided-n=7-stride=4", {"n": 7, "stride": 4}, "a short view with stride 4"),
)
