"""The class view: every student x assignment from the records on disk, as a dashboard
(index.html), the gradebook exports and a machine-readable summary.

It is rebuilt whole from OUT/students/*/jobs/*.json after every batch (and after a regrade of
one student), so it always shows what is stored, and regrading one student rewrites only
that student's files and these class-level ones.

One student never stops the class: each stage (the records, late penalties, the speed view,
similarity) takes each student in turn, and what one student's data breaks is that student's
row (`Row.problems`, in the note column, the gradebooks' note and summary.json); a stage that
fails as a whole is a line of `ClassView.errors`, and every other output is still written.
"""

from __future__ import annotations

import json
import math
import os
from collections import Counter
from dataclasses import asdict, dataclass, field
from fractions import Fraction
from pathlib import Path

from jinja2 import Environment, PackageLoader, select_autoescape

from grader.batch import reviews
from grader.batch.course import LATEST, CourseConfig, Late, exact, when
from grader.batch.record import RecordError
from grader.batch.store import (
    LATE_NOTES,
    MAX_NOTES,
    failed_path,
    read_record,
    read_records,
    rewrite_student,
    student_dir,
)
from grader.payloads import SubmissionPayload
from grader.results import (
    BAD_OUTCOMES,
    AssignmentResult,
    Outcome,
    cents,
    outcome_css,
    write_json_atomic,
    write_text_atomic,
)
from grader.safefiles import read_plain

_ENV = Environment(loader=PackageLoader("grader", "templates"), autoescape=select_autoescape(["html", "j2"]),
                   trim_blocks=True, lstrip_blocks=True)


@dataclass
class Cell:
    assignment: str
    status: str  # graded | infra_error | not graded | unfetched
    score: float | None = None
    max_score: float | None = None
    outcomes: dict = field(default_factory=dict)
    flagged: bool = False
    note: str = ""  # e.g. an infra_error kept beside the grade, or a grade of an older commit
    link: str = ""
    ci: str = ""  # the score Classroom 50's runner released, where the workspace holds one (grader.batch.classroom50)
    # a TA's decision that stands (grader.batch.reviews): score is its points
    review: dict = field(default_factory=dict)
    stale_review: str = ""  # a review of an earlier grade that no longer applies, and why
    # graded with --case/--dtype: cases_run, cases (AssignmentResult.partial)
    partial: dict = field(default_factory=dict)
    gpu_points: float = 0.0  # points only a GPU can earn, not graded here (CPU): in the course's points
    penalty: float = 0.0  # late points deducted from this score (grader.batch.course), in the course's points

    @property
    def final(self) -> float | None:
        """The grade: the score (course.toml's points, a review applied) less the late penalty."""
        return None if self.score is None else round(self.score - self.penalty, 4)

    @property
    def held(self) -> bool:
        """An integrity flag that no standing review has decided: the grade waits for a TA."""
        return self.flagged and not self.review
    earnable: float | None = None  # the points the run could earn where it ran (a GPU's apart), in the course's points

    @property
    def lacks(self) -> list[str]:
        """Why this score is not the assignment's whole grade, as a gradebook column says it:
        'partial run' (--case/--dtype), 'CPU only' (GPU-only points not graded); [] for a whole grade."""
        if self.score is None:
            return []
        return [*(["partial run"] if self.partial else []), *(["CPU only"] if self.gpu_points else [])]

    @property
    def lacking(self) -> str:
        """What this score lacks, in words (the gradebooks' notes): '' for a whole grade."""
        if self.score is None:
            return ""
        words = []
        if self.partial:
            words.append(f"partial run: {self.partial['cases_run']} of {self.partial['cases']} cases, --case/--dtype")
        if self.gpu_points:
            words.append(f"CPU only: {self.gpu_points:g} of {self.max_score:g} points need a GPU, not graded")
        return "; ".join(words)

    def notes(self, incomplete: bool = True) -> str:
        """The cell's note, with what its score lacks first (`incomplete`: where a page says it otherwise)."""
        return "; ".join(filter(None, [self.lacking if incomplete else "", self.note]))

    @property
    def fraction(self) -> float | None:
        if self.score is None or not self.max_score:
            return None
        return self.score / self.max_score

    @property
    def share(self) -> float | None:
        """The score's share of the points that could be earned where it ran: what the dashboard's
        colour, histogram and means show (a perfect CPU run is 1, its GPU points apart; the
        gradebooks keep `fraction`, of all the points)."""
        if self.score is None:
            return None
        if self.earnable is None:
            return self.fraction
        return min(1.0, self.score / self.earnable) if self.earnable > 0 else None

    @property
    def summary(self) -> str:
        """The outcomes in a few words: '7 passed, 1 failed'."""
        for fact in ("not submitted", "cannot be graded"):
            if self.outcomes.get(fact):
                return fact
        order = [o for o in Outcome if o != Outcome.SKIPPED] + [Outcome.SKIPPED]  # skipped last: no one's fault
        return ", ".join(f"{self.outcomes[o]} {o}" for o in order if self.outcomes.get(o))


@dataclass
class Row:
    student: str
    folder: str
    status: str  # fetched | unfetched
    reason: str = ""
    name: str = ""
    github_username: str = ""
    repo: str | None = None
    commit: str | None = None
    commit_date: str | None = None
    late: bool | None = None
    late_commits: int = 0
    cells: dict[str, Cell] = field(default_factory=dict)
    report: str = ""
    deadline: str | None = None  # this student's (an extension moves it)
    penalty: float = 0.0  # late points deducted from the total (grader.batch.course)
    hours_late: float | None = None
    problems: list[str] = field(default_factory=list)  # what of this student a stage could not do, and why
    lms: dict = field(default_factory=dict)  # the roster's LMS identities (grader.batch.roster.LMS_COLUMNS)

    @property
    def final(self) -> float | None:
        return None if self.total is None else round(self.total - self.penalty, 4)

    @property
    def total(self) -> float | None:
        scores = [cents(c.score) for c in self.cells.values() if c.score is not None]
        return sum(scores) / 100 if scores else None

    @property
    def max_total(self) -> float | None:
        maxes = [cents(c.max_score) for c in self.cells.values() if c.max_score is not None]
        return sum(maxes) / 100 if maxes else None

    @property
    def note(self) -> str:
        return self.notes()

    def notes(self, incomplete: bool = True) -> str:
        """Every cell's note and the row's problems; `incomplete`: with what each score lacks (the
        gradebooks), or without (the dashboard tags it in the cell)."""
        if self.status != "fetched":
            return self.reason if self.reason.startswith("not graded: ") else f"unfetched: {self.reason}"
        told = [(c, c.notes(incomplete)) for c in self.cells.values()]
        return "; ".join([*(f"{c.assignment}: {c.status}{' (' + note + ')' if note else ''}"
                            for c, note in told if c.status != "graded" or note), *self.problems])


@dataclass
class CheckRate:
    assignment: str
    check: str
    passed: int
    ran: int
    failing: Counter

    @property
    def rate(self) -> float:
        return self.passed / self.ran if self.ran else 0.0


@dataclass
class Diagnosis:
    """One thing students must change (or one state their code is in), across the class: the
    words of its first student's, and every student it concerns with how many checks it fails."""

    assignment: str
    outcome: str  # an outcome; "headline" for one cause of everything (an untouched starter); "passed"
    words: str
    students: dict[str, int] = field(default_factory=dict)  # student -> checks it concerns
    links: dict[str, str] = field(default_factory=dict)  # student -> their report's section


@dataclass
class ClassView:
    rows: list[Row]
    assignments: list[str]
    titles: dict[str, str]
    created: str
    deadline: str | None
    warning: str | None
    seed: int | None
    checks: list[CheckRate]
    flags: list[dict]
    environment: dict
    course: CourseConfig | None = None
    catalogue: object = None  # grader.spec.Course: the course folder's assignments (titles, points)
    late: dict = field(default_factory=dict)  # (student, assignment) -> grader.batch.course.Late
    # assignment -> grader.batch.similarity.Pair list above the threshold
    similarity: dict = field(default_factory=dict)
    similarity_meta: dict = field(default_factory=dict)
    speed: dict = field(default_factory=dict)  # assignment -> grader.batch.leaderboard.SpeedRow list
    # a stage or an output that failed as a whole (the rest was written)
    errors: list[str] = field(default_factory=list)
    reviews: dict = field(default_factory=lambda: {"done": [], "stale": []})  # TAs' reviews (grader.batch.reviews)
    diagnoses: list[Diagnosis] = field(default_factory=list)  # checks across the class, by what is wrong

    @property
    def awaiting_review(self) -> list[dict]:
        """The flags no standing review has decided (a stale review's included)."""
        return [f for f in self.flags if f.get("review") != "applied"]

    @property
    def partial(self) -> bool:
        """Some grade here is of a run with --case/--dtype: the chosen cases' share of the points, no grade."""
        return any(c.partial for r in self.rows for c in r.cells.values())

    @property
    def cpu_only(self) -> bool:
        """Some grade here lacks the points only a GPU can earn (a CPU run): not a grade, marked as such."""
        return any("CPU only" in c.lacks for r in self.rows for c in r.cells.values())

    def graded(self, assignment: str) -> list[Cell]:
        return [r.cells[assignment] for r in self.rows if assignment in r.cells
                and r.cells[assignment].score is not None]

    def counts(self) -> dict:
        cells = [c for r in self.rows if r.status == "fetched" for c in r.cells.values()]
        return {"students": len(self.rows), "unfetched": sum(r.status != "fetched" for r in self.rows),
                "late": sum(bool(r.late) for r in self.rows), "jobs": len(cells),
                **{s: sum(c.status == s for c in cells) for s in ("graded", "infra_error", "not graded")},
                "flagged": len(self.flags)}


def build_class_view(out: Path, lock, assignments: list[str], manifest: dict | None = None, course=None, *,
                     catalogue) -> ClassView:
    """The class as its records say; `catalogue` (the course folder, a grader.spec.Course) gives the
    assignments' titles and points."""
    from datetime import datetime, timezone

    out = Path(out)
    known = catalogue.catalogue()
    titles = {a: known[a].title if a in known else a for a in assignments}
    rows: list[Row] = []
    flags: list[dict] = []
    rates: dict[tuple[str, str], CheckRate] = {}
    environment: dict = {}
    log = reviews.read(out)
    done: dict = {"done": [], "stale": []}
    diagnoses: dict[tuple, Diagnosis] = {}
    for p in lock.students:
        row = Row(p.student, p.folder, p.status, p.reason, p.name, p.github_username, p.repo, p.commit, p.commit_date,
                  p.late, p.late_commits, deadline=getattr(p, "deadline", None),
                  lms=dict(getattr(p, "lms", None) or {}))
        try:
            found = _fill_row(row, out, p, assignments, course, rates, flags, log, done, diagnoses)
            environment = environment or found
        except Exception as exc:  # this student's records: their row says so, the class goes on
            why = f"records could not be read: {type(exc).__name__}: {exc}"
            row.problems.append(why)
            for a in assignments:
                row.cells.setdefault(a, Cell(a, "not graded", note=why))
        rows.append(row)
    from grader.batch.classroom50 import read_saved, score_cells

    ci = score_cells(read_saved(lock.root) if getattr(lock, "root", None) else [],
                     {p.github_username.lower(): p.student for p in lock.students if p.github_username},
                     assignments, course)
    for row in rows:
        for a, cell in row.cells.items():
            cell.ci = ci.get((row.student, a), "")
    checks = sorted(rates.values(), key=lambda c: (c.rate, c.assignment, c.check))
    manifest = manifest or {}
    view = ClassView(rows, assignments, titles, datetime.now(timezone.utc).isoformat(timespec="seconds"), lock.deadline,
                     lock.warning, manifest.get("seed"), checks, flags, environment, course, catalogue, reviews=done)
    view.errors.extend(log.problems)
    # the class's story first: what most students must change, then the rest; who passed everything last
    view.diagnoses = sorted(diagnoses.values(), key=lambda d: (d.outcome == "passed", -len(d.students),
                                                               assignments.index(d.assignment)))
    return view


def _diagnose(diagnoses: dict, student: str, link: str, result: AssignmentResult) -> None:
    """`result`'s diagnoses added to the class's: an untouched starter (or one cause of every
    failure) is one, each group of failures (grader.judge.feedback) another, every check passed
    one more; the words with their figures left out decide what is the same across students."""
    from grader.judge.feedback import diagnosis, group_failures, without_figures

    def add(outcome: str, words: str, checks: int, same: str | None = None) -> None:
        key = (result.name, outcome, same if same is not None else without_figures(words))
        d = diagnoses.setdefault(key, Diagnosis(result.name, outcome, words))
        d.students[student] = d.students.get(student, 0) + checks
        d.links[student] = link

    why = [t.details for t in result.tests if isinstance(t.details, SubmissionPayload)]
    groups = group_failures(result.tests)
    if any(d.not_submitted for d in why):
        add(Outcome.FAILED.value, "not submitted: no module was found", 1, "not submitted")
    elif result.headline:
        add("headline", result.headline, sum(len(g.tests) for g in groups))
    elif groups:
        for g in groups:
            add(g.outcome.value, g.diagnosis, len(g.tests), diagnosis(g.first))
    elif any(t.outcome == Outcome.PASSED for t in result.tests):
        add("passed", "every check that ran passed", 0, "")



def _kept_error(path: Path) -> str:
    """Why the kept infra_error attempt beside a grade failed (its record's error)."""
    try:
        kept = read_record(path)
    except RecordError as exc:
        return str(exc)
    return kept.error if kept is not None else "infra_error"


def _fill_row(row: Row, out: Path, p, assignments: list[str], course, rates: dict, flags: list, log: reviews.Log,
              done: dict, diagnoses: dict | None = None) -> dict:
    """One student's cells from their records, a TA's standing review applied; the environment of
    the first graded one."""
    environment: dict = {}
    records = read_records(out, p.folder) if p.status == "fetched" else {}
    if (student_dir(out, p.folder) / "report.html").is_file():
        row.report = f"students/{p.folder}/report.html"
    for a in assignments:
        if p.status != "fetched":
            row.cells[a] = Cell(a, "unfetched")
            continue
        record = records.get(a)
        if record is None:
            row.cells[a] = Cell(a, "not graded")
            continue
        cell = Cell(a, record.status, link=f"{row.report}#{a}" if row.report else "")
        if record.result:
            result = AssignmentResult.from_json(record.result)
            review = log.latest(p.folder, a)
            state = reviews.apply(result, review, record)
            cell.review = result.review
            if state:
                assert review is not None  # standing() gives a state only to a review
                entry = {"student": p.student, "assignment": a, "link": cell.link, **review.to_json(),
                         "decided": result.review.get("points"), "max_score": result.max_score}
                if state == "stale":
                    cell.stale_review = entry["why_stale"] = reviews.what_changed(review, record)
                done["done" if state == "applied" else "stale"].append(entry)
            # a partial run (--case/--dtype) is out of the assignment's whole points, as `grader check` counts it
            top = result.partial["assignment_points"] if result.partial else result.max_score
            cell.score, cell.max_score, cell.partial = result.score, top, dict(result.partial)
            cell.gpu_points = result.gpu_points_not_graded  # a CPU run: the gradebooks mark it (grader.batch.exporters)
            earnable = (cents(result.max_score) - cents(result.gpu_points_not_graded)) / 100
            cell.earnable = earnable
            if course is not None and a in course.points:  # course.toml: this assignment's points in this course
                can, _ = course.scale(a, exact(earnable), exact(top))
                cell.earnable = round(float(can), 4)
                gpu, _ = course.scale(a, exact(result.gpu_points_not_graded), exact(top))
                scaled, top = course.scale(a, exact(result.score), exact(top))
                cell.score, cell.max_score, cell.gpu_points = round(float(scaled), 4), float(top), round(float(gpu), 4)
                if cell.review:  # the verdict beside the decision, in the same points
                    verdict, _ = course.scale(a, exact(result.verdict_score), exact(result.max_score))
                    cell.review = dict(cell.review, verdict_score=round(float(verdict), 4))
            cell.outcomes = dict(Counter(t.outcome for t in result.tests))
            why = [t.details for t in result.tests if isinstance(t.details, SubmissionPayload)]
            if any(d.not_submitted for d in why):
                cell.outcomes = {"not submitted": 1}  # one fact, not a count of failed checks
            elif any(d.not_gradable for d in why):
                cell.outcomes = {"cannot be graded": 1}  # likewise: the student's set-up, said once
            cell.flagged = any(t.outcome == Outcome.FLAGGED for t in result.tests)
            _count_checks(rates, a, result)
            if diagnoses is not None:
                _diagnose(diagnoses, p.student, cell.link, result)
            for t in result.tests:
                if t.outcome == Outcome.FLAGGED:
                    flags.append({"student": p.student, "assignment": a, "check": t.name, "message": t.message,
                                  "severity": t.severity or "conclusive", "link": cell.link, "review": state})
            environment = environment or record.environment or {}
        else:
            cell.note = record.error
        if record.status == "graded" and failed_path(out, p.folder, a).is_file():
            kept = _kept_error(failed_path(out, p.folder, a))
            cell.note = "; ".join(filter(None, [cell.note, f"a later attempt failed ({kept}): "
                                                           "this earlier grade is kept"]))
        if record.commit != p.commit:
            cell.note = "; ".join(filter(None, [cell.note, f"graded at commit {str(record.commit)[:12]}, the lock now "
                                                           f"pins {str(p.commit)[:12]}: not regraded yet"]))
        if cell.review:
            cell.note = "; ".join(filter(None,
                                         [cell.note, f"{reviews.WORDS[cell.review['decision']]} by {cell.review['by']} "
                                                     f"(the grader's verdict: {cell.review['verdict_score']:g})"]))
        elif cell.stale_review:
            cell.note = "; ".join(filter(None,
                                         [cell.note, f"a review of an earlier grade is stale ({cell.stale_review}): "
                                                           "this grade stands until reviewed again"]))
        row.cells[a] = cell
    return environment


def _count_checks(rates: dict, assignment: str, result) -> None:
    for t in result.tests:
        if t.outcome == Outcome.SKIPPED:
            continue
        rate = rates.setdefault((assignment, t.name), CheckRate(assignment, t.name, 0, 0, Counter()))
        rate.ran += 1
        if t.outcome == Outcome.PASSED:
            rate.passed += 1
        else:
            rate.failing[t.outcome] += 1


def histogram_svg(fractions: list[float], bins: int = 10, width: int = 320, height: int = 120) -> str:
    """Inline SVG: how many students scored in each tenth of the points."""
    counts = [0] * bins
    for f in fractions:
        counts[min(bins - 1, max(0, math.floor(f * bins)))] += 1
    top = max(counts) or 1
    pad, plot_h = 14, height - 34  # room for the count above the tallest bar and the labels below
    bar_w = (width - 2 * pad) / bins
    parts = []
    for i, n in enumerate(counts):
        h = plot_h * n / top
        x, y = pad + i * bar_w, 14 + plot_h - h
        label = f"{i * 100 // bins}-{(i + 1) * 100 // bins}%: {n} student{'s' if n != 1 else ''}"
        parts.append(f'<rect x="{x + 1:.1f}" y="{y:.1f}" width="{bar_w - 2:.1f}" height="{h:.1f}" '
                     f'fill="#2b6cb0"><title>{label}</title></rect>')
        if n:
            parts.append(f'<text x="{x + bar_w / 2:.1f}" y="{y - 2:.1f}" font-size="10" '
                         f'text-anchor="middle">{n}</text>')
    for i in (0, bins // 2, bins):
        parts.append(f'<text x="{pad + i * bar_w:.1f}" y="{height - 4}" font-size="10" '
                     f'text-anchor="middle">{i * 100 // bins}%</text>')
    parts.append(f'<line x1="{pad}" x2="{width - pad}" y1="{14 + plot_h:.1f}" y2="{14 + plot_h:.1f}" '
                 f'stroke="#4a5568"/>')
    return (f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" role="img" '
            f'aria-label="score histogram">{"".join(parts)}</svg>')


def render_dashboard(view: ClassView) -> str:
    histograms = {a: histogram_svg([c.share for c in view.graded(a) if c.share is not None])
                  for a in view.assignments}
    return _ENV.get_template("class.html.j2").render(view=view, histograms=histograms, counts=view.counts(),
                                                     bad=BAD_OUTCOMES,
                                                     outcome_css=outcome_css())


def summary_json(view: ClassView, manifest: dict | None = None) -> dict:
    """The machine-readable summary: the class, each student's cells, and the last run."""
    return {
        "created": view.created, "deadline": view.deadline, "seed": view.seed, "assignments": view.assignments,
        "partial": view.partial, "cpu_only": view.cpu_only,
        "counts": view.counts(), "environment": view.environment,
        "last_run": ((manifest or {}).get("runs") or [None])[-1],
        "students": [
            {"student": r.student, "status": r.status, "reason": r.reason, "repo": r.repo, "commit": r.commit,
             "late": r.late, "late_commits": r.late_commits, "total": r.total, "max_total": r.max_total,
             "report": r.report,
             "deadline": r.deadline, "hours_late": r.hours_late, "late_penalty": r.penalty, "final": r.final,
             "problems": r.problems, "name": r.name, "lms": r.lms,
             "assignments": {a: {"status": c.status, "score": c.score, "max_score": c.max_score, "outcomes": c.outcomes,
                                 "flagged": c.flagged, "note": c.notes(), "classroom50": c.ci, "review": c.review,
                                 "stale_review": c.stale_review, "partial": c.partial or None,
                                 "gpu_points_not_graded": c.gpu_points, "late_penalty": c.penalty,
                                 "final": c.final, "held": c.held}
                             for a, c in r.cells.items()}}
            for r in view.rows
        ],
        "checks": [{"assignment": c.assignment, "check": c.check, "passed": c.passed, "ran": c.ran,
                    "failing": dict(c.failing)} for c in view.checks],
        "flags": view.flags,
        "reviews": {"awaiting": view.awaiting_review, **view.reviews},
        "late_policy": view.course.policy.describe() if view.course is not None and view.course.policy else None,
        "similarity": {"settings": view.similarity_meta,
                       "pairs": {a: [p.to_json() for p in pairs] for a, pairs in view.similarity.items()}},
        "speed": {a: [asdict(s) for s in rows] for a, rows in view.speed.items()},
        "errors": view.errors,
    }


def write_class_outputs(out: Path, lock, assignments: list[str], manifest: dict | None = None, course=None,
                        similarity_threshold: float | None = None, *, catalogue) -> ClassView:
    """index.html, summary.json and the gradebooks (grader.batch.exporters), each written atomically
    (a grade of a partial run, --case/--dtype, marked partial in each);
    with course.toml's late policy applied (grader.batch.course), the similar pairs
    (grader.batch.similarity) and the speed table (grader.batch.leaderboard)."""
    from grader.batch import exporters
    from grader.batch.grades import write_student_grades
    from grader.batch.leaderboard import speed_rows
    from grader.batch.similarity import update_similarity

    out = Path(out)
    view = build_class_view(out, lock, assignments, manifest, course, catalogue=catalogue)
    _guarded(view, "late penalties", lambda: apply_late(view, out))
    _guarded(view, "the students' grades", lambda: write_student_grades(view, out, lambda f: rewrite_student(out, f)))
    for a in assignments:
        view.speed[a] = []
        # _guarded calls the step at once, inside this iteration
        _guarded(view, f"the speed view of {a}", lambda: view.speed.__setitem__(a, speed_rows(view, out, a)))  # noqa: B023
    _guarded(view, "similarity", lambda: update_similarity(view, out, lock, similarity_threshold))
    rows = {r.student: r for r in view.rows}
    for a, counts in view.similarity_meta.get("per_assignment", {}).items():
        for student, why in (counts.get("not_compared") or {}).items():
            if student in rows:
                rows[student].problems.append(f"similarity of {a}: {why}")
    _guarded(view, "index.html", lambda: write_text_atomic(render_dashboard(view), out / "index.html"))
    _guarded(view, "summary.json", lambda: write_json_atomic(summary_json(view, manifest), out / "summary.json"))
    exporters.write_all(view, out, lambda what, step: _guarded(view, what, step))
    return view


def _guarded(view: ClassView, what: str, step) -> None:
    """Run one stage or write one output; a failure is a line of view.errors, and the rest goes on."""
    try:
        step()
    except Exception as exc:
        view.errors.append(f"{what} failed: {type(exc).__name__}: {' '.join(str(exc).split())[:500]}")


def _late_of_row(view, r: Row, course: CourseConfig) -> tuple[dict[str, str], bool]:
    """One student's lateness per assignment, their penalty and the notes for their report; and
    whether the fetch pinned by the deadline used (False: course.toml's, the fetch had none).
    A graded commit whose date cannot be read counts as later than any deadline."""
    notes: dict[str, str] = {}
    pinned = True
    if r.status != "fetched":
        return notes, pinned
    submitted = _commit_time(r.commit_date)
    penalty = Fraction(0)
    for a, cell in r.cells.items():
        deadline = when(r.deadline) or course.deadline_for(r.student, a)
        if deadline is None:
            continue
        pinned = pinned and r.deadline is not None
        late = Late.of(submitted or LATEST, deadline, course.policy, dated=submitted is not None)
        view.late[(r.student, a)] = late
        r.hours_late = round(late.hours, 2) if late.dated else None
        r.late = bool(r.late) or late.late
        text = late.explain(course.policy)
        if cell.score is not None and late.percent:
            cut = late.penalty(exact(cell.score))
            penalty += cut
            cell.penalty = round(float(cut), 4)
            earned, top = float(cell.score), float(cell.max_score or 0)
            scaled = f" (this course counts {a} for {top:g} points)" if a in course.points else ""
            text += (f" In the gradebook{scaled} you earned {earned:g} of {top:g} points: "
                     f"{float(cut):.4g} deducted, {float(exact(cell.score) - cut):.4g} count.")
        if text:
            notes[a] = text
    r.penalty = round(float(penalty), 4)
    return notes, pinned


def _commit_time(text: str | None):
    """The graded commit's date from the lock, or None where it holds none that can be read
    (grader.batch.workspace.CommitDate: a commit without a readable date)."""
    try:
        found = when(text)
    except (TypeError, ValueError):
        return None
    return found if found is not None and found.tzinfo is not None else None


def apply_late(view, out: Path) -> None:
    """Lateness per (student, assignment) from the graded commit's date and the student's
    deadline (the lock's, which pinning used; else course.toml's), and its penalty: computed on
    each assignment's earned points, summed into the row's `penalty` (applied to the total by
    the gradebooks). Each student's report gets the explanation (rewritten only if it changed)."""
    course = view.course or CourseConfig()
    unpinned = False  # a deadline from course.toml that the fetch did not pin by
    for r in view.rows:
        try:
            notes, pinned_by_fetch = _late_of_row(view, r, course)
        except Exception as exc:  # this student's dates: their row says so, the others' penalties stand
            notes, pinned_by_fetch = {}, True
            r.problems.append(f"late penalty not computed: {type(exc).__name__}: {exc}")
        unpinned = unpinned or not pinned_by_fetch
        path = student_dir(out, r.folder) / LATE_NOTES
        try:  # read back as input: a link or a FIFO in its place is replaced, never followed
            old: str | None = read_plain(path, MAX_NOTES).decode(errors="replace")
        except OSError:
            old = None
        new = json.dumps(notes, indent=1, sort_keys=True) if notes else None
        if old != new and (new is not None or os.path.lexists(path)):
            if new is None:
                path.unlink()
            else:
                write_text_atomic(new, path)
            rewrite_student(out, r.folder)
    if unpinned:
        view.warning = ((view.warning + " ") if view.warning else "") + (
            "The lock was fetched without course.toml's deadlines: lateness is computed from them, but the commits "
            "graded were not pinned by them (later ones may be graded). Fetch again with the course file to pin them.")
