"""The course file, `course.toml` at the course root: the course's name, which assignments it
grades and for how many points, their deadlines, the late policy and per-student extensions.

    [course]
    name = "GPU Programming, spring 2026"

    [assignments.vector_add]
    points = 20                                  # the spec's points scaled to 20 in the gradebooks
    deadline = "2026-02-01T23:59:00-05:00"

    [late_policy]
    grace_hours = 1          # the deadline moves by this much for everyone
    penalty_per_day = 10     # percent of the points earned, per started day after the grace
    max_penalty = 50         # percent, the cap
    accept_days = 5          # commits later than deadline + grace + this are not graded (default: until the cap)

    [[extensions]]
    student = "alice"
    assignment = "vector_add"                    # optional: every assignment
    hours = 48                                   # or: until = "2026-02-04T12:00:00-05:00"

    [similarity]
    threshold = 0.6                              # the dashboard's cut for similar pairs
    common_share = 0.5                           # optional: drop fingerprints in more than half the class
    [leaderboard]
    named = ["bob"]                              # students who opted in to their name on the board
    [fetch]                                      # the largest checkout fetched (these are the defaults)
    max_checkout_mb = 1024
    max_files = 100000
    max_file_mb = 256
    max_clone_mb = 2048                          # the whole clone: every commit's objects, not only the checkout
    [gradebook]
    incomplete = "mark"                          # a grade lacking GPU-only points or of a partial run: INCOMPLETE
    [ci]
    score = "cpu-gradable"                       # what a student's CI run reports its points out of: CI_SCORES

The rule for lateness (one place, `Late.of`): the graded commit's date is compared with the
student's deadline (an extension moves it). At or before deadline + grace: on time, no
penalty. After it: `days` = the number of started 24-hour days since deadline + grace
(25 h after the deadline with 1 h of grace is exactly 24 h, so 1 day; one second more is
2 days); the penalty is min(days x penalty_per_day, max_penalty) percent of the points the
student earned on that assignment. Commit dates are set by the student's machine.
"""

from __future__ import annotations

import math
import re
import sys
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from fractions import Fraction
from pathlib import Path
from typing import TYPE_CHECKING

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

if TYPE_CHECKING:
    from grader.spec import Course as Catalogue  # the course folder (its assignments), not course.toml

COURSE_FILE = "course.toml"
# [gradebook] incomplete: what the gradebooks do with a grade that is not the assignment's whole grade
# (points only a GPU can earn were not graded, or only some cases ran: --case/--dtype):
# mark: the score is written, its column and note say what it lacks; omit: the score cell is left
# empty, the note says why; refuse: no gradebook is written, the command says why
INCOMPLETE = ("mark", "omit", "refuse")
# [ci] score: what a student's CI run (the kit's workflow, Classroom 50, Classmoji) reports its points out of
# on a runner without a GPU: cpu-gradable, the points that runner can grade (4 / 4, "of 10 at grading"), or
# whole, the assignment's (4 / 10). Written into the kit's grader-kit.toml by `grader release`; the
# gradebooks never read it
CI_SCORES = ("cpu-gradable", "whole")
DAY = timedelta(hours=24)
# the latest date a lock holds (grader.batch.workspace)
LATEST = datetime(9999, 12, 31, 23, 59, 59, tzinfo=timezone.utc)


class CourseError(Exception):
    """course.toml is unreadable or says something that cannot be applied: the message names the line."""


@dataclass(frozen=True)
class LatePolicy:
    grace: timedelta = timedelta(0)
    per_day: Fraction = Fraction(0)  # percent of the earned points, per started day
    cap: Fraction = Fraction(100)  # percent
    accept_days: int | None = None  # None: until the penalty reaches the cap

    @property
    def accept(self) -> timedelta:
        """How long after deadline + grace a commit is still graded."""
        if self.accept_days is not None:
            return self.accept_days * DAY
        if self.per_day <= 0:
            return timedelta(days=3650)
        return math.ceil(self.cap / self.per_day) * DAY

    def describe(self) -> str:
        grace = f"{_hours(self.grace):g} h of grace, then " if self.grace else ""
        return f"{grace}{_pct(self.per_day)}% of the points per started day late, at most {_pct(self.cap)}%"


@dataclass(frozen=True)
class Late:
    """How late one graded commit is, and what it costs (percent of the points earned).
    `dated` False: the commit's date could not be read (grader.batch.workspace.CommitDate); it
    counts as later than any deadline, so the policy's most applies."""

    deadline: datetime
    submitted: datetime
    hours: float  # after the deadline (negative: early)
    days: int  # started days charged, after the grace
    percent: Fraction
    dated: bool = True

    @classmethod
    def of(cls, submitted: datetime, deadline: datetime, policy: LatePolicy | None, dated: bool = True) -> "Late":
        if not dated:
            submitted = LATEST
        after = submitted - deadline
        hours = after.total_seconds() / 3600
        if policy is None or after <= policy.grace:
            return cls(deadline, submitted, hours, 0, Fraction(0), dated)
        days = math.ceil((after - policy.grace) / DAY)
        return cls(deadline, submitted, hours, days, min(days * policy.per_day, policy.cap), dated)

    @property
    def late(self) -> bool:
        return self.hours > 0

    def penalty(self, earned: Fraction) -> Fraction:
        return earned * self.percent / 100

    def explain(self, policy: LatePolicy | None) -> str:
        """The student's own words for it, as the report shows them."""
        if not self.late:
            return ""
        if self.dated:
            head = (f"Your graded commit is dated {self.submitted.isoformat()}, {self.hours:.1f} h after your deadline "
                    f"{self.deadline.isoformat()}")
        else:
            head = (f"The date of your graded commit cannot be read: it counts as later than your deadline "
                    f"{self.deadline.isoformat()}")
        if policy is None:
            return head + " (this course sets no late policy: no penalty)."
        if not self.days:
            return head + f", within the {_hours(policy.grace):g} h grace period: no penalty."
        days = (f"That is {self.days} started day(s) after the grace" if self.dated
                else "That is past every day the policy counts")
        return (head + f". Late policy: {policy.describe()}. {days}: "
                f"{_pct(self.percent)}% of the points you earn on this assignment are deducted in the gradebook. "
                "(Commit dates are set by your own machine; the pinned commit is what counts.)")


@dataclass(frozen=True)
class Extension:
    student: str
    assignment: str | None  # None: every assignment
    hours: float | None = None
    until: datetime | None = None


@dataclass(frozen=True)
class FetchLimits:
    """How large one student's checkout may be ([fetch] in course.toml), checked from the commit's
    objects before anything is written: a repo small on the wire can hold a gigabyte-sized blob.
    The defaults are far above any course's kernels; a repo over one is not graded, and says why."""

    checkout_bytes: int = 1 << 30  # max_checkout_mb = 1024
    files: int = 100_000  # max_files
    file_bytes: int = 256 << 20  # max_file_mb = 256
    clone_bytes: int = 2 << 30  # max_clone_mb = 2048: the whole history fetched (a blob deleted at the head too)
    class_bytes: int = 64 << 30  # max_class_mb = 65536: every student's clone and checkout together


@dataclass
class CourseConfig:
    """course.toml: how a class is graded (its points, deadlines, extensions, late policy,
    gradebooks and fetch limits), not the course folder whose assignments it names (grader.spec.Course)."""

    path: Path | None = None
    name: str = ""
    points: dict[str, Fraction] = field(default_factory=dict)
    deadlines: dict[str, datetime] = field(default_factory=dict)
    order: list[str] = field(default_factory=list)  # the assignments this course grades
    policy: LatePolicy | None = None
    extensions: list[Extension] = field(default_factory=list)
    similarity_threshold: float | None = None
    similarity_common_share: float | None = None  # MOSS's -m, as a share of the class (off: None)
    named: frozenset[str] = frozenset()  # opted in to their name on the leaderboard
    fetch: FetchLimits = FetchLimits()  # [fetch]: the largest checkout `grader fetch` writes
    incomplete: str = "mark"  # [gradebook]: one of INCOMPLETE
    ci_score: str = CI_SCORES[0]  # [ci] score: one of CI_SCORES

    def deadline_for(self, student: str, assignment: str, base: datetime | None = None) -> datetime | None:
        """The student's deadline: `base` (the command line's) or the course's, moved by an
        extension for this student (one naming the assignment wins over one for all)."""
        deadline = base or self.deadlines.get(assignment)
        mine = [e for e in self.extensions if e.student == student and e.assignment in (assignment, None)]
        mine.sort(key=lambda e: e.assignment is None)
        if not mine:
            return deadline
        e = mine[0]
        if e.until is not None:
            return e.until
        if deadline is None:
            return None
        return deadline + timedelta(hours=e.hours or 0)

    def cutoff(self, deadline: datetime) -> datetime:
        """The last commit date still graded for this deadline."""
        return deadline if self.policy is None else deadline + self.policy.grace + self.policy.accept

    def scale(self, assignment: str, score: Fraction, max_score: Fraction) -> tuple[Fraction, Fraction]:
        """A score in the course's points for the assignment (the spec's where none are set)."""
        points = self.points.get(assignment)
        if points is None or not max_score:
            return score, max_score
        return score * points / max_score, points


def find_course(path: Path | None, catalogue: "Catalogue") -> CourseConfig:
    """`path`, or course.toml in the course folder (`catalogue`, a grader.spec.Course: the
    assignments it may name) if there is one, else an empty course."""
    if path is not None:
        if not Path(path).is_file():
            raise CourseError(f"{path}: no such course file")
        return load_course(Path(path), catalogue)
    default = catalogue.root / COURSE_FILE
    return load_course(default, catalogue) if default.is_file() else CourseConfig()


def load_course(path: Path, catalogue: "Catalogue") -> CourseConfig:
    """course.toml at `path`, its assignments checked against `catalogue` (the course folder, a
    grader.spec.Course)."""
    text = Path(path).read_text()
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        m = re.search(r"\(at line (\d+), column (\d+)\)", str(exc))
        where = f", line {m.group(1)}" if m else ""
        raise CourseError(f"{path}{where}: not valid TOML: {exc}") from None
    return _Reader(Path(path), text, catalogue).course(data)


class _Reader:
    """Validates the parsed file; every error names the file and the line it is about."""

    TOP = {"course", "assignments", "late_policy", "extensions", "similarity", "leaderboard", "fetch", "gradebook",
           "ci"}

    def __init__(self, path: Path, text: str, catalogue: "Catalogue") -> None:
        self.path, self.lines = path, text.splitlines()
        self.catalogue = catalogue  # the course folder's assignments, which the file may name

    def fail(self, message: str, table: str = "", key: str = "", nth: int = 0) -> None:
        raise CourseError(f"{self.path}, line {self.line_of(table, key, nth)}: {message}")

    def line_of(self, table: str, key: str, nth: int = 0) -> int:
        """The line of `key = ...` inside [table] (the nth [[table]] of an array), or the
        table's header line."""
        current, header, seen = "", 0, -1
        for i, raw in enumerate(self.lines, 1):
            line = raw.split("#", 1)[0].strip()
            m = re.match(r"^\[\[?\s*([^\]]+?)\s*\]\]?$", line)
            if m:
                current = m.group(1).replace('"', "")
                if current == table:
                    seen += 1
                    header = header if seen > nth else i
                continue
            here = current == table and seen == nth
            if key and here and re.match(rf'^"?{re.escape(key)}"?\s*=', line):
                return i
            if not table and key and current == "" and re.match(rf'^"?{re.escape(key)}"?\s*=', line):
                return i
        return header or 1

    def course(self, data: dict) -> CourseConfig:
        for key in data:
            if key not in self.TOP:
                self.fail(f"unknown table [{key}] (known: {', '.join(sorted(self.TOP))})", key, key)
        c = CourseConfig(self.path)
        meta = self.table(data, "course")
        self.known_keys(meta, "course", {"name"})
        self.known_keys(self.table(data, "leaderboard"), "leaderboard", {"named"})
        c.name = str(meta.get("name", ""))
        known = self.catalogue.catalogue()
        for name, entry in self.table(data, "assignments").items():
            where = f"assignments.{name}"
            if name not in known:
                self.fail(f"unknown assignment {name!r} (known: {', '.join(known)})", where)
            if not isinstance(entry, dict):
                self.fail(f"[assignments.{name}] must be a table", "assignments", name)
            for key, value in entry.items():
                if key == "points":
                    if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
                        self.fail(f"points must be a positive number, not {value!r}", where, key)
                    c.points[name] = Fraction(str(value))
                elif key == "deadline":
                    c.deadlines[name] = self.date(value, where, key)
                else:
                    self.fail(f"unknown key {key!r} in [assignments.{name}] (known: points, deadline)", where, key)
            c.order.append(name)
        if "late_policy" in data:
            c.policy = self.policy(self.table(data, "late_policy"))
        extensions = data.get("extensions", [])
        if not isinstance(extensions, list):
            self.fail("extensions must be an array of tables: [[extensions]]", "extensions")
        for nth, entry in enumerate(extensions):
            c.extensions.append(self.extension(entry, nth))
        sim = self.table(data, "similarity")
        if "threshold" in sim:
            t = sim["threshold"]
            if isinstance(t, bool) or not isinstance(t, (int, float)) or not 0 < t <= 1:
                self.fail(f"threshold must be a number in (0, 1], not {t!r}", "similarity", "threshold")
            c.similarity_threshold = float(t)
        if "common_share" in sim:
            m = sim["common_share"]
            if isinstance(m, bool) or not isinstance(m, (int, float)) or not 0 < m <= 1:
                self.fail(f"common_share must be a number in (0, 1], not {m!r}", "similarity", "common_share")
            c.similarity_common_share = float(m)
        unknown = set(sim) - {"threshold", "common_share"}
        if unknown:
            self.fail(f"unknown key {sorted(unknown)[0]!r} in [similarity] (known: threshold, common_share)",
                      "similarity",
                      sorted(unknown)[0])
        named = self.table(data, "leaderboard").get("named", [])
        if not isinstance(named, list) or not all(isinstance(n, str) for n in named):
            self.fail("named must be a list of student names", "leaderboard", "named")
        c.named = frozenset(named)
        c.fetch = self.fetch_limits(self.table(data, "fetch"))
        book = self.table(data, "gradebook")
        self.known_keys(book, "gradebook", {"incomplete"})
        c.incomplete = book.get("incomplete", "mark")
        if c.incomplete not in INCOMPLETE:
            self.fail(f"incomplete must be one of {', '.join(repr(x) for x in INCOMPLETE)}, not {c.incomplete!r}",
                      "gradebook", "incomplete")
        ci = self.table(data, "ci")
        self.known_keys(ci, "ci", {"score"})
        c.ci_score = ci.get("score", CI_SCORES[0])
        if c.ci_score not in CI_SCORES:
            self.fail(f"score must be one of {', '.join(repr(x) for x in CI_SCORES)}, not {c.ci_score!r}",
                      "ci", "score")
        return c

    def fetch_limits(self, t: dict) -> FetchLimits:
        self.known_keys(t, "fetch", {"max_checkout_mb", "max_files", "max_file_mb", "max_clone_mb", "max_class_mb"})
        d = FetchLimits()
        return FetchLimits(checkout_bytes=int(self.number(t, "max_checkout_mb", d.checkout_bytes >> 20, "fetch",
                                                          low=1) * (1 << 20)),
                           files=int(self.number(t, "max_files", d.files, "fetch", low=1)),
                           file_bytes=int(self.number(t, "max_file_mb", d.file_bytes >> 20, "fetch",
                                                      low=1) * (1 << 20)),
                           clone_bytes=int(self.number(t, "max_clone_mb", d.clone_bytes >> 20, "fetch",
                                                       low=1) * (1 << 20)),
                           class_bytes=int(self.number(t, "max_class_mb", d.class_bytes >> 20, "fetch",
                                                       low=1) * (1 << 20)))

    def known_keys(self, table: dict, name: str, known: set[str]) -> None:
        for key in table:
            if key not in known:
                self.fail(f"unknown key {key!r} in [{name}] (known: {', '.join(sorted(known))})", name, key)

    def table(self, data: dict, name: str) -> dict:
        value = data.get(name, {})
        if not isinstance(value, dict):
            self.fail(f"{name} must be a table: [{name}]", "", name)
        return value

    def date(self, value, table: str, key: str, nth: int = 0) -> datetime:
        if isinstance(value, datetime):
            when = value
        elif isinstance(value, str):
            try:
                when = datetime.fromisoformat(value.strip().replace("Z", "+00:00"))
            except ValueError:
                self.fail(f"{key} {value!r} is not an ISO 8601 date and time, e.g. 2026-02-01T23:59:00-05:00", table,
                          key, nth)
        else:
            self.fail(f"{key} must be a date and time, not {value!r}", table, key, nth)
        if when.tzinfo is None:
            self.fail(f"{key} {value} has no time zone: add one, e.g. -05:00 or Z", table, key, nth)
        return when

    def number(self, table: dict, key: str, default, where: str, low: float = 0, high: float | None = None,
               nth: int = 0) -> Fraction:
        value = table.get(key, default)
        if (isinstance(value, bool) or not isinstance(value, (int, float)) or value < low
                or (high is not None and value > high)):
            bound = f"between {low:g} and {high:g}" if high is not None else f"at least {low:g}"
            self.fail(f"{key} must be a number {bound}, not {value!r}", where, key, nth)
        return Fraction(str(value))

    def policy(self, t: dict) -> LatePolicy:
        known = {"grace_hours", "penalty_per_day", "max_penalty", "accept_days"}
        for key in t:
            if key not in known:
                self.fail(f"unknown key {key!r} in [late_policy] (known: {', '.join(sorted(known))})", "late_policy",
                          key)
        accept = t.get("accept_days")
        if accept is not None and (isinstance(accept, bool) or not isinstance(accept, int) or accept < 0):
            self.fail(f"accept_days must be a whole number of days, not {accept!r}", "late_policy", "accept_days")
        return LatePolicy(timedelta(hours=float(self.number(t, "grace_hours", 0, "late_policy"))),
                          self.number(t, "penalty_per_day", 0, "late_policy", 0, 100),
                          self.number(t, "max_penalty", 100, "late_policy", 0, 100), accept)

    def extension(self, e, nth: int) -> Extension:
        if not isinstance(e, dict) or not isinstance(e.get("student"), str):
            self.fail("each [[extensions]] needs student = \"NAME\"", "extensions", "", nth)
        unknown = set(e) - {"student", "assignment", "hours", "days", "until"}
        if unknown:
            self.fail(f"unknown key {sorted(unknown)[0]!r} in [[extensions]] (known: student, assignment, hours, days, "
                      f"until)",
                      "extensions", sorted(unknown)[0], nth)
        a = e.get("assignment")
        if a is not None and a not in self.catalogue.catalogue():
            self.fail(f"extension for {e['student']}: unknown assignment {a!r}", "extensions", "assignment", nth)
        given = [k for k in ("hours", "days", "until") if k in e]
        if len(given) != 1:
            self.fail(f"extension for {e['student']}: give exactly one of hours, days or until", "extensions",
                      "student", nth)
        if "until" in e:
            return Extension(e["student"], a, until=self.date(e["until"], "extensions", "until", nth))
        k = given[0]
        amount = float(self.number(e, k, 0, "extensions", 0, nth=nth))
        return Extension(e["student"], a, hours=amount * (24 if k == "days" else 1))


def _pct(x: Fraction) -> str:
    return f"{float(x):g}"


def _hours(d: timedelta) -> float:
    return d.total_seconds() / 3600


def exact(x) -> Fraction:
    """A score as an exact fraction (a float is taken at its shortest decimal: 8.5 -> 17/2)."""
    if isinstance(x, Fraction):
        return x
    if isinstance(x, int):
        return Fraction(x)
    return Fraction(repr(float(x)))


def class_deadline(course: CourseConfig, names: list[str], override: datetime | None):
    """(the class's deadline, per_student) for a fetch of these assignments: `override` (the
    command line's) or the course's, which must be one deadline for all of them (one lock pins
    one commit per student). per_student(student) -> (deadline, cutoff), or None where no
    deadline applies."""
    base = override
    if base is None:
        found = {n: course.deadlines.get(n) for n in names}
        if len(set(found.values())) > 1:
            listed = ", ".join(f"{n} {d.isoformat() if d else '(none)'}" for n, d in found.items())
            raise ValueError(f"{course.path} gives these assignments different deadlines ({listed}): a lock pins one "
                             "commit per student, so fetch each deadline into its own workspace (grader fetch -a NAME "
                             "--out DIR)")
        base = next(iter(found.values()), None)
    if base is None and not any(e.until for e in course.extensions):
        return None, None

    def per_student(student: str):
        mine = [d for d in (course.deadline_for(student, n, base) for n in names) if d is not None]
        if not mine:
            return None, None
        deadline = max(mine)  # an extension of one of them extends this fetch
        return deadline, course.cutoff(deadline) if course.policy else None

    return base, per_student


def when(text: str | None) -> datetime | None:
    return datetime.fromisoformat(text) if text else None
