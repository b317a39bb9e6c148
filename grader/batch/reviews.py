"""A TA's review of a graded assignment (`grader review`): clear an integrity flag, uphold it, or
set the points; who decided, when, why, and the grade it was decided on.

OUT/reviews.jsonl is the audit trail, one review a line, append-only: a review is never changed
or removed, a later one for the same student and assignment takes its place. It is appended under
an exclusive lock (two reviews at once both land) by writing the whole file anew through a temp
file and a rename, as a job's record is written: a crash leaves the old log or the new one, never
half a line.

A review applies to the record it was made on: the record's key (commit, spec and reference,
grader version, GPU model, options: what `--resume` matches) is kept in the review. While the
student's current record has that key, the decision stands in results.json, the report, the
dashboard, summary.json and every gradebook (`grade --resume` keeps the record, so the decision
too). A regrade with another key makes the review stale: the new verdict stands, and the
dashboard says a review is needed again. The record itself is never changed: the grader's own
verdict stays in it, and is shown beside the decision.

What a decision gives: `clear` the points as if no finding stood
(grader.judge.scoring.points_without_findings), `uphold` the grader's verdict (the flag marked
reviewed), `points` the points the TA set. The note and the name are a TA's free text, possibly
quoting a student: every sink neutralises them as it does student text (grader.sanitize).
"""

from __future__ import annotations

import json
import math
import os
import uuid
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from pathlib import Path

from grader.batch.record import JobRecord
from grader.results import AssignmentResult, FileLock, Outcome, write_text_atomic
from grader.safefiles import read_plain

LOG = "reviews.jsonl"
LOCK = ".reviews.lock"
FORMAT = 1
DECISIONS = ("clear", "uphold", "points")
NOTE_LIMIT = 2000  # characters of a note
BY_LIMIT = 100  # characters of a reviewer's name
WORDS = {"clear": "flag cleared", "uphold": "flag upheld", "points": "points set"}
LOG_LIMIT = 64 << 20  # bytes of the log read back (a review is under 3 kB: some 20,000 of them)
NAME_LIMIT = 200  # characters of a student's, folder's or assignment's name in a review


class ReviewError(Exception):
    """A review that cannot be made: the reason, in one line."""


@dataclass
class Review:
    student: str
    folder: str
    assignment: str
    decision: str  # one of DECISIONS
    points: float  # the assignment's points the decision gave, when it was made
    note: str
    by: str
    at: str  # UTC, ISO 8601
    record: dict  # the record decided on: its commit, key (spec, grader version, options) and finish time
    verdict: dict  # the grader's verdict then: score, max_score, flags
    id: str = field(default_factory=lambda: uuid.uuid4().hex)
    format: int = FORMAT

    @property
    def words(self) -> str:
        return WORDS[self.decision] + (f" to {self.points:g}" if self.decision == "points" else "")

    def to_json(self) -> dict:
        return asdict(self)


def log_path(out: Path) -> Path:
    return Path(out) / LOG


def flags(result: AssignmentResult) -> list[str]:
    """The integrity findings of a result: what --clear and --uphold decide on."""
    return [t.name for t in result.tests if t.outcome == Outcome.FLAGGED]


def make(student: str, folder: str, assignment: str, record: JobRecord | None, decision: str, points: float | None,
         note: str, by: str) -> Review:
    """A review of a graded record, checked: ReviewError says why it cannot be made."""
    from grader.judge.scoring import points_without_findings

    if decision not in DECISIONS:
        raise ReviewError(f"the decision must be one of {', '.join(DECISIONS)}, not {decision!r}")
    if not note.strip():
        raise ReviewError("--note is required: say why (it is kept in the review log and shown in the report)")
    if len(note) > NOTE_LIMIT:
        raise ReviewError(f"--note is {len(note)} characters: at most {NOTE_LIMIT}")
    if not by.strip():
        raise ReviewError("--by: the reviewer's name is empty")
    if len(by) > BY_LIMIT:
        raise ReviewError(f"--by is {len(by)} characters: at most {BY_LIMIT}")
    if record is None or record.status != "graded" or not record.result:
        why = "no record" if record is None else f"its last job ended in {record.status}"
        raise ReviewError(f"{student} has no graded record of {assignment} ({why}): grade it first")
    result = AssignmentResult.from_json(record.result)
    if result.partial:
        raise ReviewError(f"{student}'s {assignment} was graded as a partial run (--case/--dtype: "
                          f"{result.partial.get('cases_run')} of {result.partial.get('cases')} cases), which is no "
                          "grade: grade the class without --case/--dtype, then review")
    found = flags(result)
    if decision in ("clear", "uphold") and not found:
        raise ReviewError(f"{student}'s {assignment} has no integrity flag to {decision} "
                          f"(its grade is {result.verdict_score:g} / {result.max_score:g}): use --points to set its "
                          f"points")
    if decision == "points":
        if points is None or not 0 <= points <= result.max_score:
            raise ReviewError(f"--points must be between 0 and {result.max_score:g} ({assignment}'s points), not "
                              f"{points}")
        points = round(points, 2)
    elif decision == "clear":
        points = points_without_findings(result)
    else:
        points = result.verdict_score
    return Review(student, folder, assignment, decision, points, note, by.strip(),
                  datetime.now(timezone.utc).isoformat(timespec="seconds"),
                  record={"commit": record.commit, "key": record.key, "finished": record.finished},
                  verdict={"score": result.verdict_score, "max_score": result.max_score, "flags": found})


def locked(out: Path) -> FileLock:
    """Hold the log for an append and what is rebuilt from it, so the last writer's pages hold every review."""
    return FileLock(Path(out) / LOCK)


def append(out: Path, review: Review) -> Path:
    """Add one review at the end of the log (the caller holds `locked(out)`): the file is written
    anew through a temp file and a rename, every earlier line as it was."""
    path = log_path(out)
    old = read_plain(path, LOG_LIMIT).decode(errors="replace") if os.path.lexists(path) else ""
    if old and not old.endswith("\n"):
        old += "\n"
    write_text_atomic(old + json.dumps(review.to_json(), sort_keys=True) + "\n", path)
    return path


@dataclass
class Log:
    reviews: list[Review]
    problems: list[str]  # lines that could not be read (a hand edit): said, and skipped

    def latest(self, folder: str, assignment: str) -> Review | None:
        """The review that decides a student's assignment: the last one made."""
        found = [r for r in self.reviews if r.folder == folder and r.assignment == assignment]
        return found[-1] if found else None

    def folders(self) -> set[str]:
        return {r.folder for r in self.reviews}


def read(out: Path) -> Log:
    """The log's reviews, each line checked as input (a hand edit, or another user's, may hold
    anything): a line that is not a review of the form `make` writes (names and texts within
    their limits, points a number within 0 and the points it was decided on) is skipped and
    said in `problems`, never applied. The file is read bounded, never through a link or a FIFO."""
    path = log_path(out)
    try:
        lines = read_plain(path, LOG_LIMIT).decode().splitlines() if os.path.lexists(path) else []
    except (OSError, UnicodeDecodeError) as exc:
        return Log([], [f"{LOG} could not be read: {exc}"])
    reviews, problems = [], []
    names = set(Review.__dataclass_fields__)
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            data = json.loads(line)
            if not isinstance(data, dict):
                raise ValueError("not an object")
            review = Review(**{k: v for k, v in data.items() if k in names})
            _check(review)
        except (ValueError, TypeError) as exc:
            problems.append(f"{LOG} line {n} is not a review, skipped: {str(exc)[:200]}")
            continue
        reviews.append(review)
    return Log(reviews, problems)


def _check(review: Review) -> None:
    """ValueError where a review read back is not one `make` could have written."""
    for name, limit in (("student", NAME_LIMIT), ("folder", NAME_LIMIT), ("assignment", NAME_LIMIT),
                        ("note", NOTE_LIMIT), ("by", BY_LIMIT), ("at", 64), ("id", 64)):
        value = getattr(review, name)
        if not isinstance(value, str) or len(value) > limit:
            raise ValueError(f"its {name} is not a text of at most {limit} characters")
    if review.decision not in DECISIONS:
        raise ValueError(f"decision {str(review.decision)[:40]!r}")
    if not isinstance(review.record, dict) or not isinstance(review.verdict, dict):
        raise ValueError("its record or verdict is not an object")
    most = review.verdict.get("max_score")
    if not _number(review.points) or not _number(most) or not 0 <= review.points <= float(most or 0):
        raise ValueError(f"points {str(review.points)[:40]} are not within 0 and the assignment's points "
                         f"({str(most)[:40]})")


def _number(value: object) -> bool:
    """A plain finite int or float (a bool, a string or a NaN is not a number of points)."""
    return isinstance(value, (int, float)) and type(value) is not bool and math.isfinite(value)


def standing(review: Review | None, record: JobRecord | None) -> str:
    """'applied' where the review was made on this record's grade; 'stale' where the record was
    graded again at another commit, spec, grader version or options; '' without a review."""
    if review is None or record is None or record.status != "graded":
        return "" if review is None else "stale"
    return "applied" if review.record.get("key") == record.key else "stale"


def what_changed(review: Review, record: JobRecord | None) -> str:
    """Why a review is stale, in words: what of the grade it was made on differs now."""
    old, new = review.record.get("key") or {}, (record.key if record is not None else None) or {}
    parts = []
    if old.get("commit") != new.get("commit"):
        parts.append(f"commit {str(old.get('commit'))[:12]} -> {str(new.get('commit'))[:12]}")
    if old.get("spec") != new.get("spec"):
        parts.append("the assignment's spec or reference changed")
    if old.get("grader") != new.get("grader"):
        parts.append(f"grader {old.get('grader')} -> {new.get('grader')}")
    if old.get("options") != new.get("options") or old.get("gpu_model") != new.get("gpu_model"):
        parts.append("graded with other options or on another GPU")
    return ", ".join(parts) or "graded again"


def apply(result: AssignmentResult, review: Review | None, record: JobRecord | None) -> str:
    """Put a standing review's decision on the result (result.review: its points, who, why, and
    the verdict it overrode: the report and results.json's output say it), or a stale one's note;
    returns standing()."""
    state = standing(review, record)
    if state and review is not None and not 0 <= review.points <= result.max_score:  # a forged line's
        result.notes.append(f"A review ({WORDS[review.decision]} by {review.by} on {review.at}) gives "
                            f"{review.points:g} points, outside 0 to {result.max_score:g}: it is not applied.")
        return ""
    if state == "applied":
        assert review is not None  # standing() applies only a review
        from grader.judge.scoring import points_without_findings

        verdict = result.verdict_score
        points = {"clear": points_without_findings(result), "uphold": verdict}.get(review.decision, review.points)
        result.review = {"decision": review.decision, "words": review.words, "points": points, "verdict_score": verdict,
                         "flags": flags(result), "note": review.note, "by": review.by, "at": review.at, "id": review.id}
    elif state == "stale":
        assert review is not None  # standing() calls only a review stale
        result.notes.append(f"A review of an earlier grade ({review.words} by {review.by} on {review.at}) no longer "
                            f"applies: {what_changed(review, record)}. This grade stands until a TA reviews it again.")
    return state
