"""The assignment spec model, and the catalogue that loads `assignments/<name>/spec.py`.

A spec is plain trusted Python (GPU MODE style): an input generator, a float64 reference,
the torch baseline in the working dtype, named edge cases, tolerances, points and the
performance target. Only the grading process loads specs; the worker never sees them.
"""

from __future__ import annotations

import importlib.util
import random
import sys
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable

import torch

DTYPES: dict[str, torch.dtype] = {
    "float32": torch.float32,
    "float16": torch.float16,
    "bfloat16": torch.bfloat16,
}

KIT_MANIFEST = "grader-kit.toml"  # marks a student kit (grader release): public specs, no secret
SECRET_FILE = "assignments/course-secret.txt"  # the course's secret (never released; out of the workers' sight)


def _find_course() -> Path:
    """$GRADER_COURSE; else the folder this package sits in when it holds assignments/ (a TA's
    checkout); else the student kit around the working directory (the grader installed from a
    wheel has no course of its own). A course found first always wins, so a kit's public specs
    inside a submission never replace the TA's."""
    from grader.settings import current

    course = current().course
    if course is not None:
        return course
    home = Path(__file__).resolve().parent.parent
    if (home / "assignments").is_dir():
        return home
    for folder in (Path.cwd(), *Path.cwd().parents):
        if (folder / KIT_MANIFEST).is_file():
            return folder
    return home


# The course folder holds assignments/ and (for TAs only) reference/, hidden.py files and the secret.
# Found when first needed, not at import (GRADER_COURSE may be set after); a test or a tool may set it.
COURSE_ROOT: Path | None = None


def course_root() -> Path:
    global COURSE_ROOT
    if COURSE_ROOT is None:
        COURSE_ROOT = _find_course()
    return COURSE_ROOT


def course_secret() -> str | None:
    """The secret the graded random shapes come from: $GRADER_COURSE_SECRET or
    COURSE_ROOT/assignments/course-secret.txt.
    None in a student kit: there the random shapes come from the run's (public, printed) seed alone."""
    from grader.settings import current

    value = current().course_secret
    if value is None and (course_root() / SECRET_FILE).is_file():
        try:
            value = (course_root() / SECRET_FILE).read_text().strip()
        except (OSError, UnicodeDecodeError) as exc:
            raise CourseSecretError(f"the course secret {course_root() / SECRET_FILE} cannot be read "
                                    f"({exc.strerror if isinstance(exc, OSError) else 'not text'}): run as a user "
                                    "who can read it, or set GRADER_COURSE_SECRET") from None
    return value or None


class CourseSecretError(ValueError):
    """The course has a secret this user cannot read: said in one line before anything runs."""


def kit_manifest() -> dict:
    """COURSE_ROOT/grader-kit.toml where the course is a student kit, else {}."""
    path = course_root() / KIT_MANIFEST
    if not path.is_file():
        return {}
    if sys.version_info >= (3, 11):
        import tomllib
    else:  # Python 3.10
        import tomli as tomllib
    return tomllib.loads(path.read_text())


def aten_ops(*names: str) -> frozenset[str]:
    """Every overload of these aten ops, named as the worker's op recorder names them
    ("aten::rand", "aten::rand.generator", ...): for a spec's forbidden_ops."""
    return frozenset(f"aten::{n}" + ("" if o == "default" else f".{o}")
                     for n in names if hasattr(torch.ops.aten, n) for o in getattr(torch.ops.aten, n).overloads())


@dataclass(frozen=True)
class Case:
    """One input shape, named so that a student can re-run exactly it (`--case NAME`)."""

    name: str
    params: dict
    why: str = ""  # what this edge case is there to catch, shown in the report
    hidden: bool = False  # run at grading only: kept in assignments/<name>/hidden.py, never released


@dataclass(frozen=True)
class Tolerance:
    """Error model: the student's error may be at most `k` times torch's own error in the
    same dtype (the FlashAttention test rule), plus a floor of atol + rtol*|ref| per dtype."""

    k: float = 2.0
    atol: dict[str, float] = field(
        default_factory=lambda: {"float32": 1e-6, "float16": 1e-3, "bfloat16": 8e-3}
    )
    rtol: dict[str, float] = field(
        default_factory=lambda: {"float32": 1e-5, "float16": 1e-3, "bfloat16": 1e-2}
    )


@dataclass(frozen=True)
class Performance:
    """How speed is scored: the student's median time over the reference kernel's median
    time on one large case. Full points at or under `full_at`, none at or over `zero_at`,
    linear in log(ratio) between (so 2x slower costs the same wherever it happens).

    `bytes_moved` and `flops` are the least memory traffic and arithmetic any correct kernel
    must do at the scoring size: with the grading GPU's measured copy bandwidth and GEMM peak
    they set the floor no honest time can beat (grader.judge.perf), and the % of roofline reported.
    `score_on` chooses the clock: "gpu" (the kernel's GPU time) or "wall" (each call's time by
    the host's clock, the wrapper's Python and launches included, for an assignment where host
    overhead is part of the task).

    `against` names what the student's time is divided by: "reference" (the reference kernel's
    time) or "faster" (in each round, the faster of the reference kernel and the vendor baseline,
    the spec's `baseline`): for an assignment whose vendor kernel (cuDNN, SDPA) stays ahead of the
    reference on the scoring case, so that full points never go to code slower than what a GPU
    user already has."""

    case: Case
    dtype: str
    bytes_moved: Callable[[dict, torch.dtype], int]
    full_at: float = 1.10
    zero_at: float = 3.0
    flops: Callable[[dict, torch.dtype], int] | None = None
    score_on: str = "gpu"
    against: str = "reference"

    def __post_init__(self) -> None:
        if self.score_on not in ("gpu", "wall"):
            raise ValueError(f"Performance.score_on must be 'gpu' or 'wall', not {self.score_on!r}")
        if self.against not in ("reference", "faster"):
            raise ValueError(f"Performance.against must be 'reference' or 'faster', not {self.against!r}")

    def score_fraction(self, ratio: float) -> float:
        import math

        if ratio <= self.full_at:
            return 1.0
        if ratio >= self.zero_at:
            return 0.0
        return 1.0 - math.log(ratio / self.full_at) / math.log(self.zero_at / self.full_at)


@dataclass(frozen=True)
class Assignment:
    name: str
    title: str
    function: str  # the name the student's module exports
    module: str  # default path of the student's module, relative to the repo root
    signature: str
    make_inputs: Callable[[dict, torch.dtype, torch.Generator], dict[str, torch.Tensor]]
    # float64 truth (a tensor, or a tuple of them), called on upcast inputs; None where `check` judges
    reference: Callable[..., Any] | None
    # torch in the working dtype: the error model's yardstick and the vendor timing
    baseline: Callable[..., torch.Tensor]
    cases: tuple[Case, ...]
    random_cases: Callable[[random.Random], list[Case]]
    correctness_points: float
    performance: Performance | None = None
    performance_points: float = 0.0
    # more (case, dtype) pairs that benchmarks/references.py measures the reference on (the
    # catalogue's bar names bf16 too, and attention without the causal mask): not graded
    benchmark_cases: tuple[tuple[Case, str], ...] = ()
    dtypes: tuple[str, ...] = ("float32", "float16", "bfloat16")
    tolerance: Tolerance = Tolerance()
    forbidden_ops: frozenset[str] = frozenset()  # aten ops that mean "called torch instead of a kernel"
    call_timeout_s: float = 60.0  # one call in the worker, compile included
    import_timeout_s: float = 60.0
    # The assignment's own words for a mismatch (grader.judge.mismatch.Mismatch -> str or None),
    # tried before the judge's generic ones: it can test the assignment's typical bugs.
    explain: Callable[..., str | None] | None = None
    folder: Path = Path(".")
    # A case may call the student's function more than once (e.g. dropout: the same seed twice,
    # then another seed): `calls` makes each call's arguments from the case's inputs.
    calls: Callable[[dict], list[dict]] | None = None
    # Where no exact oracle exists, a trusted property check replaces the comparison with
    # `reference`: it gets every call's arguments, every call's result tensor and the dtype, and
    # returns a grader.judge.verdict.Verdict whose message tells the student what to fix.
    check: Callable[[list[dict], list, str], Any] | None = None
    output_names: tuple[str, ...] = ()  # names of a tuple result's parts (dx, dw, db), for messages
    withheld_cases: int = 0  # hidden cases this copy of the course lacks (a student kit): counted, run at grading

    @property
    def public_cases(self) -> tuple[Case, ...]:
        return tuple(c for c in self.cases if not c.hidden)

    @property
    def hidden_count(self) -> int:
        """Hidden named cases, here or withheld (a kit knows only their number)."""
        return sum(c.hidden for c in self.cases) + self.withheld_cases

    @property
    def max_points(self) -> float:
        return self.correctness_points + self.performance_points

    def reference_module(self, folder: Path | None = None) -> Path:
        """<folder>/<name>.py: the reference kernel, in the course's reference/ unless the
        grading context names another folder (`grader grade --reference-dir`)."""
        return Path(folder or course_root() / "reference") / f"{self.name}.py"


class UnknownAssignment(KeyError):
    pass


def _load_spec(folder: Path) -> Assignment:
    module_name = f"grader_assignment_{folder.name}"
    spec = importlib.util.spec_from_file_location(module_name, folder / "spec.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assignment: Assignment = module.SPEC
    hidden = _load_hidden(folder) if (folder / "hidden.py").is_file() else ()
    withheld = kit_manifest().get("assignments", {}).get(folder.name, {}).get("hidden_cases", 0)
    return replace(assignment, folder=folder, cases=assignment.cases + hidden, withheld_cases=int(withheld))


def _load_hidden(folder: Path) -> tuple[Case, ...]:
    """assignments/<name>/hidden.py's CASES, marked hidden: a file of its own, so that the
    release leaves it out whole instead of editing the public spec."""
    spec = importlib.util.spec_from_file_location(f"grader_hidden_{folder.name}", folder / "hidden.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    cases = tuple(getattr(module, "CASES", ()))
    if not all(isinstance(c, Case) for c in cases):
        raise TypeError(f"{folder / 'hidden.py'}: CASES must be a tuple of grader.spec.Case")
    return tuple(replace(c, hidden=True) for c in cases)


_CATALOGUE: dict[str, Assignment] | None = None


def catalogue() -> dict[str, Assignment]:
    """Every assignment under COURSE_ROOT/assignments, by name, loaded once."""
    global _CATALOGUE
    if _CATALOGUE is None:
        folders = sorted(p.parent for p in (course_root() / "assignments").glob("*/spec.py"))
        _CATALOGUE = {f.name: _load_spec(f) for f in folders}
    return _CATALOGUE


def get(name: str) -> Assignment:
    try:
        return catalogue()[name]
    except KeyError:
        known = ", ".join(catalogue()) or "none"
        raise UnknownAssignment(f"unknown assignment {name!r} (known: {known})") from None
