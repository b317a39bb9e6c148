"""grader: automated grading of Triton GPU-kernel assignments."""

__version__ = "0.1.0"
