"""The assignment spec model, and the course folder (`Course`) whose catalogue loads
`assignments/<name>/spec.py`.

A spec is plain trusted Python (GPU MODE style): an input generator, the float64 truth,
the torch baseline in the working dtype, named edge cases, tolerances, points and the
performance target. Only the grading process loads specs; the worker never sees them.

A command finds its course once, from its settings (`Course.find`), and hands it down: a
grading session owns it (grader.judge.session); nothing keeps a course in a module global, so
two courses (a test's, a kit's) never see each other's specs.
"""

from __future__ import annotations

import errno
import importlib.util
import random
import sys
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterator

import torch

from grader.settings import KIT_MANIFEST

if TYPE_CHECKING:
    from grader.settings import Settings

DTYPES: dict[str, torch.dtype] = {
    "float32": torch.float32,
    "float16": torch.float16,
    "bfloat16": torch.bfloat16,
}

SECRET_FILE = "assignments/course-secret.txt"  # the course's secret (never released; out of the workers' sight)


class CourseSecretError(ValueError):
    """The course has a secret this user cannot read: said in one line before anything runs."""


class Course:
    """The course folder a command grades with: assignments/ (the catalogue, each spec.py loaded
    once, on first use) and, for TAs only, reference/, the hidden.py files and the secret the
    graded random shapes come from. Each assignment it loads knows its course (`Assignment.course`).
    Not grader.batch.course.CourseConfig, a class's course.toml (deadlines, points, roster policy)."""

    def __init__(self, root: Path, secret: str | None = None) -> None:
        """`secret`: $GRADER_COURSE_SECRET, which replaces the course's own file."""
        self.root = Path(root)
        self._secret = secret
        self._catalogue: dict[str, Assignment] | None = None

    @classmethod
    def find(cls, settings: "Settings") -> "Course":
        """The course `settings` name or imply (`Settings.course_folder`), with their secret if they give one."""
        return cls(settings.course_folder(), settings.course_secret)

    @property
    def reference(self) -> Path:
        """The instructor's reference kernels (a TA's course only)."""
        return self.root / "reference"

    def secret(self) -> str | None:
        """The secret the graded random shapes come from: $GRADER_COURSE_SECRET or assignments/course-secret.txt.
        None in a student kit: there the random shapes come from the run's (public, printed) seed alone."""
        value = self._secret
        path = self.root / SECRET_FILE
        if value is None and path.is_file():
            try:
                value = path.read_text().strip()
            except (OSError, UnicodeDecodeError) as exc:
                raise CourseSecretError(f"the course secret {path} cannot be read "
                                        f"({exc.strerror if isinstance(exc, OSError) else 'not text'}): run as a user "
                                        "who can read it, or set GRADER_COURSE_SECRET") from None
        return value or None

    def kit_manifest(self) -> dict:
        """grader-kit.toml where the course is a student kit, else {}."""
        path = self.root / KIT_MANIFEST
        if not path.is_file():
            return {}
        if sys.version_info >= (3, 11):
            import tomllib
        else:  # Python 3.10
            import tomli as tomllib
        return tomllib.loads(path.read_text())

    def catalogue(self) -> dict[str, Assignment]:
        """Every assignment under assignments/, by name, loaded once."""
        if self._catalogue is None:
            folders = sorted(p.parent for p in (self.root / "assignments").glob("*/spec.py"))
            self._catalogue = _load_all(folders, self)
        return self._catalogue

    def load_each(self) -> tuple[dict[str, Assignment], dict[Path, list[str]]]:
        """Every assignment that loads, by name, and every file that does not with its rules:
        a course check says them all, where the catalogue refuses the course at the first."""
        withheld = self.kit_manifest().get("assignments", {})
        loaded: dict[str, Assignment] = {}
        broken: dict[Path, list[str]] = {}
        for folder in sorted(p.parent for p in (self.root / "assignments").glob("*/spec.py")):
            try:
                hidden = int(withheld.get(folder.name, {}).get("hidden_cases", 0))
                loaded[folder.name] = _load_spec(folder, self, hidden)
            except SpecError as exc:
                broken.update(exc.broken)
        return loaded, broken

    def get(self, name: str) -> Assignment:
        try:
            return self.catalogue()[name]
        except KeyError:
            known = ", ".join(self.catalogue()) or "none"
            raise UnknownAssignment(f"unknown assignment {name!r} (known: {known})") from None


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
    # the float64 truth: the exact answer (a tensor, or a tuple of them), called on inputs upcast to
    # float64; None where `check` judges. ("reference" is the instructor's Triton kernel, reference/.)
    truth: Callable[..., Any] | None
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
    # `truth`: it gets every call's arguments, every call's result tensor and the dtype, and
    # returns a grader.judge.verdict.Verdict whose message tells the student what to fix.
    check: Callable[[list[dict], list, str], Any] | None = None
    output_names: tuple[str, ...] = ()  # names of a tuple result's parts (dx, dw, db), for messages
    withheld_cases: int = 0  # hidden cases this copy of the course lacks (a student kit): counted, run at grading
    # the course that loaded it (its secret, reference/)
    course: Course | None = field(default=None, repr=False, compare=False)

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

    @property
    def shapes_secret(self) -> str | None:
        """The secret its graded random shapes come from: its course's (None in a student kit, or
        for a spec no course loaded)."""
        return self.course.secret() if self.course is not None else None

    def reference_module(self, folder: Path | None = None) -> Path:
        """<folder>/<name>.py: the reference kernel, in the course's reference/ unless the
        grading context names another folder (`grader grade --reference-dir`)."""
        course = self.course.reference if self.course is not None else self.folder.parent.parent / "reference"
        return Path(folder or course) / f"{self.name}.py"


class UnknownAssignment(KeyError):
    pass


def _load_spec(folder: Path, course: Course | None = None, withheld: int = 0) -> Assignment:
    """assignments/<name>/spec.py's SPEC with its hidden cases, checked (validate): a spec that
    does not import or breaks a rule is a SpecError naming the file, never a half-loaded assignment.
    `course`: the course loading it (its secret, reference/); `withheld`: the hidden cases a kit lacks."""
    module = _run_file(folder / "spec.py", f"grader_assignment_{folder.name}")
    assignment = getattr(module, "SPEC", None)
    if not isinstance(assignment, Assignment):
        got = "defines no SPEC" if assignment is None else f"SPEC is a {type(assignment).__name__}"
        raise SpecError({folder / "spec.py": [f"{got}: it must set SPEC = Assignment(...)"]})
    if not isinstance(assignment.cases, tuple):
        got = type(assignment.cases).__name__
        raise SpecError({folder / "spec.py": [f"SPEC.cases must be a tuple of Case(...), not a {got}"]})
    hidden = _load_hidden(folder) if (folder / "hidden.py").is_file() else ()
    loaded = replace(assignment, folder=folder, cases=assignment.cases + hidden, withheld_cases=withheld,
                     course=course)
    validate(loaded)
    return loaded


def _run_file(path: Path, module_name: str):
    """The module `path` makes (a course's trusted file); one that does not import is a SpecError."""
    spec = importlib.util.spec_from_file_location(module_name, path)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(module)
    except Exception as exc:  # noqa: BLE001 - whatever it raises, the file is the one to mend
        renamed = " (the float64 answer is Assignment(truth=...) now)" if "'reference'" in str(exc) else ""
        import traceback

        lines = [f.lineno for f in traceback.extract_tb(exc.__traceback__) if Path(f.filename) == Path(path)]
        where = f" (line {lines[-1]})" if lines and not isinstance(exc, SyntaxError) else ""
        raise SpecError({path: [f"does not import: {type(exc).__name__}: {exc}{renamed}{where}"]}) from exc
    return module


def _load_hidden(folder: Path) -> tuple[Case, ...]:
    """assignments/<name>/hidden.py's CASES, marked hidden: a file of its own, so that the
    release leaves it out whole instead of editing the public spec."""
    path = folder / "hidden.py"
    cases = getattr(_run_file(path, f"grader_hidden_{folder.name}"), "CASES", ())
    if not isinstance(cases, (tuple, list)) or not all(isinstance(c, Case) for c in cases):
        raise SpecError({path: ["CASES must be a tuple of Case(...)"]})
    return tuple(replace(c, hidden=True) for c in cases)


def _load_all(folders: list[Path], course: Course | None = None) -> dict[str, Assignment]:
    """Every folder's assignment, loaded for `course`; every broken spec said at once (one
    SpecError), none dropped."""
    withheld = course.kit_manifest().get("assignments", {}) if course is not None else {}
    loaded, broken = {}, {}
    for folder in folders:
        try:
            hidden = int(withheld.get(folder.name, {}).get("hidden_cases", 0))
            loaded[folder.name] = _load_spec(folder, course, hidden)
        except SpecError as exc:
            broken.update(exc.broken)
    if broken:
        raise SpecError(broken)
    return loaded


# -- the assignment contract: what every spec.py must hold, checked when it is loaded ---------------

class SpecError(ValueError):
    """A course's spec.py (or hidden.py) that does not import or breaks a rule of the contract:
    refused at load, before anything is graded, with each file and every rule it breaks."""

    def __init__(self, broken: dict[Path, list[str]]):
        self.broken = broken
        lines = "".join(f"\n  {path}: {rule}" for path, rules in broken.items() for rule in rules)
        super().__init__(f"a broken assignment spec, refused before anything ran:{lines}")


class CourseCodeError(Exception):
    """A course's own code (a spec's make_inputs, truth, baseline, random_cases, check, explain...)
    that raised while grading: the assignment is broken, not the student's code. One line names
    the file, the function that raised, its line and the case, the same in every command (exit 2);
    a batch grades no more of that assignment instead of retrying every student."""

    def __init__(self, where: str, function: str, case: str, cause: str, sees_results: bool = False):
        self.where, self.function, self.case, self.cause = where, function, case, cause
        # raised where the course's code reads a student's results (a property `check`): it may be
        # that result's doing, so a batch stops no other student's job for it
        self.sees_results = sees_results
        super().__init__(f"{where}: {function}() raised {cause}{f' on case {case}' if case else ''}: the assignment "
                         "is broken, not your code (the course staff must mend it)")


def raised_in_course(spec: Assignment, what: str, exc: BaseException, case: str = "") -> CourseCodeError:
    """`exc`, raised by `spec`'s own `what` (make_inputs, truth...), as the course's error: the
    deepest frame of the traceback in the course's files (its assignments/ folder), else the spec."""
    import traceback

    root = spec.folder.parent.resolve()
    frames = traceback.extract_tb(exc.__traceback__)
    ours = [f for f in frames if _inside(Path(f.filename), root)]
    course_root = spec.course.root if spec.course is not None else spec.folder.parent.parent
    if ours:
        frame = ours[-1]
        where = f"{_shown_path(Path(frame.filename), course_root)}:{frame.lineno}"
        function = frame.name if frame.name != "<lambda>" else what
    else:
        where, function = _shown_path(spec.folder / "spec.py", course_root), what
    cause = " ".join(f"{type(exc).__name__}: {exc}".split())[:300]
    return CourseCodeError(where, function, case, cause, sees_results=what == "check")


def _inside(path: Path, root: Path) -> bool:
    try:
        path.resolve().relative_to(root)
        return True
    except (ValueError, OSError):
        return False


def _shown_path(path: Path, root: Path) -> str:
    try:
        return str(path.resolve().relative_to(Path(root).resolve()))
    except (ValueError, OSError):
        return str(path)


@contextmanager
def course_code(spec: Assignment, what: str, case: str = "") -> Iterator[None]:
    """`with course_code(spec, "make_inputs", case):` what the course's code raises there is a
    CourseCodeError (memory or disk running out stays what it is: the machine's, not the spec's)."""
    try:
        yield
    except (MemoryError, CourseCodeError):
        raise
    except OSError as exc:
        if exc.errno in (errno.ENOSPC, errno.ENOMEM):
            raise
        raise raised_in_course(spec, what, exc, case) from exc
    except Exception as exc:  # noqa: BLE001 - whatever the course's code raises is the course's
        if type(exc).__name__ == "OutOfMemoryError":  # torch's: the machine's too
            raise
        raise raised_in_course(spec, what, exc, case) from exc


def validate(spec: Assignment) -> None:
    """Raise SpecError (the spec's file and every rule it breaks) unless `spec` keeps the contract."""
    found = problems(spec)
    if found:
        raise SpecError({spec.folder / "spec.py": found})


def problems(spec: Assignment) -> list[str]:
    """Every rule of the assignment contract that `spec` breaks, each in words that say what to mend."""
    return [p for rule in RULES for p in rule(spec)]


def _identity(spec: Assignment) -> list[str]:
    found = []
    if spec.name != spec.folder.name:
        found.append(f"SPEC.name is {spec.name!r}, but the folder is {spec.folder.name!r} (they must match)")
    if not isinstance(spec.function, str) or not spec.function.isidentifier():
        found.append(f"SPEC.function {spec.function!r} is not a Python function name")
    module = Path(spec.module) if isinstance(spec.module, str) else None
    if module is None or module.suffix != ".py" or module.is_absolute() or ".." in module.parts:
        found.append(f"SPEC.module {spec.module!r} must be a .py path inside the student's repo, relative to its root")
    return found


def _cases(spec: Assignment) -> list[str]:
    found = []
    if not all(isinstance(c, Case) for c in spec.cases):
        return ["SPEC.cases must be a tuple of Case(...)"]
    if not spec.public_cases:
        found.append("SPEC.cases has no public case (students need at least one to test against)")
    names = [c.name for c in spec.cases]
    if len(set(names)) != len(names):
        twice = sorted({n for n in names if names.count(n) > 1})
        found.append(f"SPEC.cases repeats a case name (hidden.py's included): {twice}")
    unknown = [d for d in spec.dtypes if d not in DTYPES] if isinstance(spec.dtypes, tuple) else [spec.dtypes]
    if not spec.dtypes or unknown:
        found.append(f"SPEC.dtypes must be a tuple of dtypes among {list(DTYPES)} (got {spec.dtypes!r})")
    elif "float32" not in spec.dtypes:
        found.append("SPEC.dtypes lacks float32, the dtype the CPU interpreter grades")
    return found


def _points(spec: Assignment) -> list[str]:
    found = []
    if not isinstance(spec.correctness_points, (int, float)) or spec.correctness_points <= 0:
        found.append(f"SPEC.correctness_points must be above 0 (got {spec.correctness_points!r})")
    if not isinstance(spec.performance_points, (int, float)) or spec.performance_points < 0:
        found.append(f"SPEC.performance_points must be 0 or more (got {spec.performance_points!r})")
    elif (spec.performance is None) != (spec.performance_points == 0):
        found.append(f"SPEC.performance and SPEC.performance_points go together (performance="
                     f"{'set' if spec.performance else 'None'}, performance_points={spec.performance_points})")
    perf = spec.performance
    if perf is not None and not isinstance(perf, Performance):
        found.append(f"SPEC.performance must be Performance(...) or None, not a {type(perf).__name__}")
    elif perf is not None and perf.dtype not in spec.dtypes:
        found.append(f"SPEC.performance.dtype {perf.dtype!r} is not one of SPEC.dtypes {spec.dtypes!r}")
    elif perf is not None and not callable(perf.bytes_moved):
        found.append("SPEC.performance.bytes_moved must be a function (params, dtype) -> bytes")
    return found


def _functions(spec: Assignment) -> list[str]:
    found = [f"SPEC.{name} must be a function" for name in ("make_inputs", "baseline", "random_cases")
             if not callable(getattr(spec, name))]
    found += [f"SPEC.{name} must be a function or None" for name in ("truth", "check", "explain", "calls")
              if getattr(spec, name) is not None and not callable(getattr(spec, name))]
    if spec.truth is None and spec.check is None:
        found.append("SPEC.truth (the float64 answer) or SPEC.check (a property check) is needed")
    return found


def _limits(spec: Assignment) -> list[str]:
    found = []
    tol = spec.tolerance
    if not isinstance(tol, Tolerance):
        found.append(f"SPEC.tolerance must be Tolerance(...), not a {type(tol).__name__}")
    else:
        missing = [d for d in spec.dtypes if d not in tol.atol or d not in tol.rtol]
        if missing:
            found.append(f"SPEC.tolerance has no atol or rtol for {missing} (one of each per dtype in SPEC.dtypes)")
    ops = spec.forbidden_ops
    if not isinstance(ops, (set, frozenset)) or not all(isinstance(op, str) and op.startswith("aten::") for op in ops):
        found.append("SPEC.forbidden_ops must be a set of aten op names (\"aten::add.Tensor\"), as aten_ops() gives")
    for name in ("call_timeout_s", "import_timeout_s"):
        value = getattr(spec, name)
        if not isinstance(value, (int, float)) or value <= 0:
            found.append(f"SPEC.{name} must be a number of seconds above 0 (got {value!r})")
    if not isinstance(spec.output_names, tuple) or not all(isinstance(n, str) for n in spec.output_names):
        found.append("SPEC.output_names must be a tuple of names (\"dx\", \"dw\", ...)")
    return found


RULES: tuple[Callable[[Assignment], list[str]], ...] = (_identity, _cases, _points, _functions, _limits)
