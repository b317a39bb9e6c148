"""Results: what one check run produced, and its results.json in Gradescope's format.

Gradescope's schema (score, max_score, tests[] with name, score, max_score, status, output)
is the base; each test adds `outcome` (an `Outcome`, finer than passed/failed, written as its plain string)
and `tags`, and the top level adds `extra_data` with the environment and the seed.

A result is stored and read back through one matched pair, `to_json()` and `from_json()` on each
of the dataclasses below (every field, nothing chosen by hand): a batch's records hold them, and
`grader check` writes its results.json and report from what that pair gives back, as a batch does.
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import stat
import tempfile
from dataclasses import asdict, dataclass, field, fields, is_dataclass
from enum import Enum
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from grader.payloads import CorrectnessPayload, Kind, Payload, PerformancePayload, SubmissionPayload, payload_for
from grader.safefiles import UnsafeFileError
from grader.sanitize import cut, for_terminal, one_line, strict_json, writable

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

# How much of the student's text one result keeps, whoever wrote it (the worker's message, its
# traceback, its captured output): enough for any honest failure, and a flood costs nothing.
# Cut in the middle, the cut said in place (grader.sanitize.cut).
TEXT_LIMITS = {"message": 8 << 10, "traceback": 8 << 10, "output": 8 << 10}
# and how much test output one results.json carries in all: past it, a test keeps its first line
RUN_OUTPUT_LIMIT = 256 << 10



class Outcome(str, Enum):
    """What one check came to. A member is a `str` equal to its value, so results.json, records read
    back and comparisons with plain strings are unchanged; str() and format() give the value."""

    __str__ = str.__str__  # "passed", not "Outcome.PASSED", in templates, f-strings and CSV

    def __format__(self, spec: str) -> str:
        return str.__format__(self, spec)

    PASSED = "passed"  # the check ran and the submission met it
    FAILED = "failed"  # the check ran and the submission fell short: a wrong answer, no module, no speed credit
    ERROR = "error"  # the submission raised an exception in the check
    TIMEOUT = "timeout"  # the submission did not finish within the time limit: its worker was killed
    CRASHED = "crashed"  # the submission's worker died (a signal, out of memory, a garbled reply)
    SKIPPED = "skipped"  # the check cannot run here (e.g. it needs a GPU): no points, and no fault
    FLAGGED = "flagged"  # an integrity finding: the result was not honestly computed (see Severity)
    INFRA_ERROR = "infra_error"  # the grader or its sandbox failed, not the submission: grade it again


OUTCOMES = tuple(Outcome)
# the submission's fault: what fails a run and counts against a student
BAD_OUTCOMES = frozenset({Outcome.FAILED, Outcome.ERROR, Outcome.TIMEOUT, Outcome.CRASHED, Outcome.FLAGGED})
# the worker stopped answering: grader.judge.grade restarts it, and a report shows its last output
WORKER_FAILURES = frozenset({Outcome.TIMEOUT, Outcome.CRASHED, Outcome.INFRA_ERROR})
# colour and weight of each outcome in the HTML pages (report, class dashboard): their CSS comes from here
HTML_STYLE: dict[Outcome, tuple[str, bool]] = {
    Outcome.PASSED: ("#276749", False),
    Outcome.FAILED: ("#c53030", False),
    Outcome.ERROR: ("#c53030", False),
    Outcome.TIMEOUT: ("#6b46c1", False),
    Outcome.CRASHED: ("#6b46c1", False),
    Outcome.SKIPPED: ("#718096", False),
    Outcome.FLAGGED: ("#b7791f", True),
    Outcome.INFRA_ERROR: ("#2c5282", True),
}


def outcome_css() -> str:
    """One CSS rule per outcome, from HTML_STYLE: the templates include it rather than list colours."""
    return "\n".join(f".{o.value} {{ color: {colour};{' font-weight: bold;' if bold else ''} }}" for o,
                     (colour, bold) in HTML_STYLE.items())


class Severity(str, Enum):
    """What a `flagged` finding costs (grader.judge.scoring). An integrity finding is an accusation:
    conclusive only where the evidence leaves no honest reading. A `str`, as Outcome is."""

    def __str__(self) -> str:  # the value, not "Severity.X", in templates, f-strings and CSV
        return str(self.value)

    def __format__(self, spec: str) -> str:
        return format(str(self.value), spec)

    CONCLUSIVE = "conclusive"  # the vendor op computed the result, timers patched, outputs forged or replayed
    REVIEW = "review"  # evidence for a TA to look at: costs only the points of what it concerns


def cents(points: float) -> int:
    """Points in hundredths: scores are added up as integers, so totals are exact."""
    return round(points * 100)


_Result = TypeVar("_Result", bound="DataclassInstance")


def _to_json(result: Any, nested: tuple[str, ...] = ()) -> dict:
    """Every field of a result dataclass (nested ones included) in JSON's own types: exactly what
    json.load gives back from the stored file (an Outcome as its string, a tuple as a list, an
    object JSON cannot hold as its str(), as write_json_atomic writes it). `nested`: the fields
    that hold a list of another result dataclass, each written by its own to_json; a payload
    (grader.payloads) is written by its own to_json too."""
    data = {}
    for f in fields(result):
        value = getattr(result, f.name)
        if f.name in nested:
            value = [item.to_json() for item in value]
        elif isinstance(value, Payload):
            value = value.to_json()
        data[f.name] = value
    return json.loads(json.dumps(strict_json(_plain(data)), default=str, allow_nan=False))


def _plain(value: Any) -> Any:
    """`value` with every dataclass in it made a dict, as dataclasses.asdict does."""
    if is_dataclass(value) and not isinstance(value, type):
        return asdict(value)
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


def _from_json(cls: type[_Result], data: dict, nested: dict[str, type[Any]] | None = None) -> _Result:
    """A result dataclass from what _to_json gave. A field the data lacks takes its default (a
    record written before the field existed still loads); a key that is no field (a newer
    grader's) is left out. `nested`: the fields that hold a list of another result dataclass."""
    names = {f.name for f in fields(cls)}
    kwargs = {k: v for k, v in data.items() if k in names}
    for name, inner in (nested or {}).items():
        if name in kwargs:
            kwargs[name] = [inner.from_json(item) for item in kwargs[name] or []]
    return cls(**kwargs)


@dataclass
class TestResult:
    __test__ = False  # not a pytest test class
    assignment: str
    kind: Kind  # a plain string is accepted and made a Kind
    name: str
    outcome: Outcome  # a plain string is accepted and made an Outcome
    message: str = ""
    max_score: float = 0.0
    score: float = 0.0
    case: str | None = None
    dtype: str | None = None
    shape: str | None = None
    details: Payload = field(default_factory=Payload)  # the kind's own payload (grader.payloads); a dict is read as one
    traceback: str = ""
    output: str = ""  # the worker's captured stdout/stderr, head and tail
    reproducer: str = ""
    severity: Severity | str = ""  # a flagged outcome's Severity (a plain string made one); "": none given, conclusive
    hidden: bool = False  # a hidden case: students see it only after grading (Gradescope: after_published)

    def __post_init__(self) -> None:
        if self.outcome not in OUTCOMES:  # caught here, not in a results.json that Gradescope cannot read
            raise ValueError(f"{self.outcome!r} is not an outcome: one of {', '.join(OUTCOMES)}")
        self.outcome = Outcome(self.outcome)
        self.kind = Kind(self.kind)
        self.details = payload_for(self.kind, self.details)
        if self.severity:
            self.severity = Severity(self.severity)
        for name, limit in TEXT_LIMITS.items():  # valid and bounded before any sink sees it
            setattr(self, name, cut(writable(getattr(self, name)), limit, f"the {name}"))

    def to_json(self) -> dict:
        return _to_json(self)

    @classmethod
    def from_json(cls, data: dict) -> TestResult:
        return _from_json(cls, data)


@dataclass
class AssignmentResult:
    name: str
    title: str
    module: str
    tests: list[TestResult] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    warnings: list[dict] = field(default_factory=list)  # the static scan's findings (grader.judge.integrity), for a TA
    headline: str = ""  # one line that explains every failure at once (grader.judge.feedback), shown first
    # only some cases ran (--case/--dtype): cases_run, cases, assignment_points
    partial: dict = field(default_factory=dict)
    # a TA's decision that stands for this grade (grader.batch.reviews): its points, who, why
    review: dict = field(default_factory=dict)

    @property
    def score(self) -> float:
        """The points: a TA's decision where one stands, else the grader's verdict."""
        if self.review.get("points") is not None:
            return cents(self.review["points"]) / 100
        return self.verdict_score

    @property
    def verdict_score(self) -> float:
        """The grader's own points, the sum of the tests' (kept beside a TA's decision)."""
        return sum(cents(t.score) for t in self.tests) / 100

    @property
    def max_score(self) -> float:
        return sum(cents(t.max_score) for t in self.tests) / 100

    @property
    def skipped_points(self) -> float:
        """Points of this assignment that could not be earned here (a GPU is needed)."""
        return sum(cents(t.max_score) for t in self.tests if t.outcome == Outcome.SKIPPED) / 100

    @property
    def gpu_points_not_graded(self) -> float:
        """The skipped points a GPU could still earn: none where no module was found or the repo
        cannot be graded (that is the grade on any machine), else skipped_points."""
        if any(isinstance(t.details, SubmissionPayload) and (t.details.not_submitted or t.details.not_gradable)
               for t in self.tests):
            return 0.0
        return self.skipped_points

    def count(self, outcome: Outcome | str) -> int:
        return sum(t.outcome == outcome for t in self.tests)

    def to_json(self) -> dict:
        """What a batch's record holds of a job's result (grader.batch.jobs)."""
        return _to_json(self, ("tests",))

    @classmethod
    def from_json(cls, data: dict) -> AssignmentResult:
        return _from_json(cls, data, {"tests": TestResult})


@dataclass
class RunResult:
    submission: str
    seed: int
    environment: dict
    assignments: list[AssignmentResult] = field(default_factory=list)
    commit: str | None = None
    execution_time: float | None = None  # seconds the grading took (Gradescope's execution_time)

    @property
    def score(self) -> float:
        return sum(cents(a.score) for a in self.assignments) / 100

    @property
    def max_score(self) -> float:
        return sum(cents(a.max_score) for a in self.assignments) / 100

    @property
    def skipped_points(self) -> float:
        return sum(cents(a.skipped_points) for a in self.assignments) / 100

    @property
    def gpu_points_not_graded(self) -> float:
        return sum(cents(a.gpu_points_not_graded) for a in self.assignments) / 100

    @property
    def tests(self) -> list[TestResult]:
        return [t for a in self.assignments for t in a.tests]

    @property
    def incomplete(self) -> list[str]:
        """Why this score is not the whole grade: 'partial run' (--case/--dtype), 'CPU only' (points
        only a GPU can earn were not graded); [] for a whole grade."""
        return [*(["partial run"] if any(a.partial for a in self.assignments) else []),
                *(["CPU only"] if self.gpu_points_not_graded else [])]

    def gpu_only_line(self) -> str:
        """What a CPU-only score lacks, in one line for the student and the gradebook's reader."""
        # a partial run's max_score is only the chosen cases' share, not the total its first line names
        of = "the points of the cases that ran" if any(a.partial for a in self.assignments) else \
            f"these {self.max_score:g} points"
        return (f"CPU only: {self.gpu_points_not_graded:g} of {of} need a GPU and were not graded here, so "
                f"{self.score:g} is not the grade (it counts only the checks a CPU can run)")

    @property
    def all_passed(self) -> bool:
        return not any(t.outcome in BAD_OUTCOMES or t.outcome == Outcome.INFRA_ERROR for t in self.tests)

    def to_json(self) -> dict:
        return _to_json(self, ("assignments",))

    @classmethod
    def from_json(cls, data: dict) -> RunResult:
        return _from_json(cls, data, {"assignments": AssignmentResult})

    def in_gradebook(self, gradebook: dict | None) -> tuple[float, float] | None:
        """(final, out of): this run's grade as the course's gradebook counts it (`gradebook`: each
        assignment's grader.batch.grades.CourseGrade.to_json, course.toml's points and the late
        penalty applied), where that differs from the run's own points; None where it is the same."""
        if not gradebook:
            return None
        found = [(a, gradebook[a.name]) for a in self.assignments if isinstance(gradebook.get(a.name), dict)]

        def own(a: AssignmentResult, g: dict) -> bool:  # the gradebook counts this one as the run does
            whole = a.partial["assignment_points"] if a.partial else a.max_score
            return g.get("final") == a.score and g.get("out_of") == whole and not g.get("late_penalty")

        if not found or all(own(a, g) for a, g in found):
            return None
        graded = [g for _, g in found if g.get("points") is not None]
        points = sum(cents(g["points"]) for g in graded) / 100
        final = round(points - sum(float(g.get("late_penalty") or 0) for g in graded), 4)
        out_of = sum(cents(g["out_of"]) for _, g in found if g.get("out_of") is not None) / 100
        return final, out_of

    def to_gradescope(self, gradebook: dict | None = None) -> dict:
        """Gradescope's autograder results (its specification's fields), plus our own. `gradebook`
        (a class's, grader.batch.grades): where course.toml scales the points or a late penalty
        applies, `score` and `max_score` are the course's grade, as every gradebook has it.
        A skipped test is neither passed nor failed: Gradescope's `status` knows only those two,
        so it has none, and its score and max_score are 0 (its points are in the run's
        max_score, not earned; the output's first line and `outcome` say skipped and why)."""
        tests = []
        room = RUN_OUTPUT_LIMIT
        for ai, a in enumerate(self.assignments, 1):
            for ti, t in enumerate(a.tests, 1):
                output = _test_output(t, a.headline)
                if len(output) > room:  # the run's text is spent: this test keeps its first line
                    output = (output.split("\n", 1)[0][:500] + f"\n[the rest cut: a results file keeps at most "
                              f"{RUN_OUTPUT_LIMIT} characters of test output in all]")
                room = max(0, room - len(output))
                skipped = t.outcome == Outcome.SKIPPED
                tests.append({
                    "name": f"{t.assignment}: {t.name}",
                    "number": f"{ai}.{ti}",
                    "score": 0 if skipped else t.score,
                    "max_score": 0 if skipped else t.max_score,
                    # Gradescope's status, not an outcome; a check that did not run has neither
                    **({} if skipped else {"status": "passed" if t.outcome == Outcome.PASSED else "failed"}),
                    "visibility": "after_published" if t.hidden else "visible",
                    "output": output,
                    # a student's message or traceback is shown as it is: never Markdown, HTML or ANSI
                    "output_format": "text",
                    "outcome": t.outcome.value,
                    "tags": [t.assignment, t.kind] + ([t.dtype] if t.dtype else []) + (["hidden"] if t.hidden else []),
                    "extra_data": {k: v for k, v in t.to_json().items()
                                   if k in ("case", "dtype", "shape", "details", "reproducer", "severity")},
                })
        partial = [a for a in self.assignments if a.partial]
        whole = sum(cents(a.partial["assignment_points"] if a.partial else a.max_score) for a in self.assignments) / 100
        book = self.in_gradebook(gradebook)
        data = {
            "score": self.score if book is None else book[0],
            "max_score": self.max_score if book is None else book[1],
            # an incomplete grade (a partial run, --case/--dtype; points only a GPU can earn not graded) is
            # not the assignment's grade: said where every reader of the file looks first (Gradescope's
            # score is a number, so the mark is here and in extra_data.incomplete)
            "output": for_terminal("\n".join([
                *([_book_line(book, gradebook)] if book else []),
                f"{self.score:g} / {self.max_score:g} points" if not partial else (
                    f"{self.score:g} / {whole:g} points (partial run: only the cases chosen with --case/--dtype, of "
                    f"{', '.join(a.name for a in partial)}; not a grade)"),
                *([self.gpu_only_line()] if self.gpu_points_not_graded else []),
                # one cause explains every failure of an assignment (an untouched starter): told once, first
                *(f"{a.name}: {a.headline}" for a in self.assignments if a.headline),
                *(_review_line(a) for a in self.assignments if a.review)])),
            "output_format": "text", "test_output_format": "text",
            # the console output names hidden cases: students see it only where there are none
            "stdout_visibility": "hidden" if any(t.hidden for t in self.tests) else "visible",
            "tests": tests,
            "extra_data": {
                "submission": self.submission,
                "commit": self.commit,
                "seed": self.seed,
                "partial": bool(partial),
                "incomplete": self.incomplete,
                "environment": self.environment,
                "assignments": {
                    a.name: {"score": a.score, "max_score": a.max_score, "skipped_points": a.skipped_points,
                             "headline": a.headline, "partial": a.partial, "notes": a.notes,
                             "verdict_score": a.verdict_score, "review": a.review,
                           "integrity_warnings": a.warnings}
                    for a in self.assignments
                },
            },
        }
        if book is not None and gradebook:
            extra: dict = data["extra_data"]  # type: ignore[assignment]  # built just above, a dict
            extra["gradebook"] = {a: gradebook[a] for a in sorted(gradebook) if isinstance(gradebook[a], dict)}
        if self.execution_time is not None:
            data["execution_time"] = round(self.execution_time)
        if board := self.leaderboard():
            data["leaderboard"] = board
        return data

    def leaderboard(self) -> list[dict]:
        """Gradescope leaderboard entries where timing ran: the time over the reference kernel's
        (lower is better) and the % of the measured roofline, per assignment."""
        board = []
        for t in self.tests:
            if t.kind != "performance" or t.outcome not in (Outcome.PASSED, Outcome.FAILED):
                continue
            d = t.details
            if not isinstance(d, PerformancePayload):
                continue
            student = (d.figures or {}).get("student")
            if d.ratio_to_reference is not None:
                board.append({"name": f"{t.assignment} time / reference", "value": d.ratio_to_reference,
                              "order": "asc"})
            if student is not None:
                board.append({"name": f"{t.assignment} % of roofline", "value": student.roofline_pct, "order": "desc"})
        return board


def in_ci(gradebook: dict | None) -> bool:
    """A gradebook a student's own check made from the course's shipped points (grader.kit.points):
    course.toml's points, no late penalty (CI has no deadline), not a class's course grades."""
    return any(isinstance(g, dict) and g.get("ci") for g in (gradebook or {}).values())


def _book_line(book: tuple[float, float], gradebook: dict | None) -> str:
    if in_ci(gradebook):
        return (f"{book[0]:g} / {book[1]:g} points in the course's points (course.toml's, as its gradebooks count "
                "them; no late penalty is applied here, the course applies it at grading); the checks below count:")
    return (f"{book[0]:g} / {book[1]:g} points in the course's gradebook (course.toml's points and the late "
            f"penalty applied); the checks below count:")


def _review_line(a: AssignmentResult) -> str:
    """A TA's decision on an assignment (grader.batch.reviews), as the student reads it."""
    r = a.review
    return (f"{a.name}: reviewed by {r.get('by')} on {r.get('at')}: {r.get('words') or r.get('decision')}, {a.score:g} "
            f"/ {a.max_score:g} points (the grader's verdict: {a.verdict_score:g}). Note: {r.get('note')}")


def _test_output(t: TestResult, headline: str = "") -> str:
    """What Gradescope shows under a test, as text (output_format), control characters shown as
    escapes (grader.sanitize.for_terminal). A failure that the assignment's one cause explains (its
    headline) says that cause first, not only its own symptom (ten identical NaN failures of a starter)."""
    text = for_terminal(_output_text(t))
    if headline and t.outcome in BAD_OUTCOMES:
        text = f"Cause: {one_line(headline, 500)}\n{text}"
    return text


def _output_text(t: TestResult) -> str:
    parts = [f"[{t.outcome}{': ' + t.severity if t.outcome == Outcome.FLAGGED and t.severity else ''}] {t.message}"]
    if t.outcome == Outcome.SKIPPED and t.details.points_if_run:
        parts.append(f"Worth {t.details.points_if_run:g} points where it can run; here it earns none.")
    if t.reproducer and t.outcome != Outcome.PASSED:
        parts.append(f"Reproduce: {t.reproducer}")
    d = t.details
    if isinstance(d, CorrectnessPayload) and (small := d.smallest_failing):  # grader.judge.grade._shrink_failures
        passing = d.largest_passing
        parts.append(f"Smallest failing case found: {small.case}" + (f" ({passing.case} passes)" if passing else "")
                     + f"; reproduce it: {small.reproducer}")
    if t.traceback:
        parts.append(t.traceback)
    elif t.output and t.outcome in WORKER_FAILURES:
        parts.append("Last lines of the worker's output:\n" + "\n".join(t.output.rstrip().splitlines()[-15:]))
    return "\n".join(parts)


def write_json_atomic(data: dict, path: Path) -> None:
    """Write through a temp file and rename, so a reader never sees half a file. OSError (a full
    disk, a read-only folder, a quota) names `path` and leaves what was there as it was."""
    text = json.dumps(strict_json(data), indent=2, default=str, allow_nan=False)  # strict JSON (sanitize.strict_json)
    _write_atomic(text, path)


def write_text_atomic(text: str, path: Path) -> None:
    """write_json_atomic for text (HTML, CSV)."""
    _write_atomic(writable(text), path)


def _write_atomic(text: str, path: Path) -> None:
    tmp = None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())  # on disk before the rename: a crash leaves the old file or the new one
        os.replace(tmp, path)
    except OSError as exc:
        if tmp is not None:
            try:
                os.unlink(tmp)
            except OSError:
                pass
        if exc.filename is None or exc.filename == tmp:
            raise OSError(exc.errno, exc.strerror, str(path)) from exc
        raise


class FileLock:
    """An exclusive flock on a file, across processes: one writer at a time of what the atomic
    writes above replace (a student's files in a class folder, the review log)."""

    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path

    def __enter__(self):
        # a link or a FIFO planted as the lock is refused, never followed nor waited on
        self.fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, 0o644)
        if not stat.S_ISREG(os.fstat(self.fd).st_mode):
            os.close(self.fd)
            raise UnsafeFileError(errno.EINVAL,
                                  f"{self.path.name} in {self.path.parent} is not a plain file: refused as a lock")
        fcntl.flock(self.fd, fcntl.LOCK_EX)
        return self

    def __exit__(self, *exc):
        os.close(self.fd)
