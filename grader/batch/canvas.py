"""`grader publish canvas`: a graded class's grades into a Canvas course's gradebook, through canvasapi.

What is sent is the class view's grade (grader.batch.grades, as OUT/summary.json holds it):
course.toml's points, a TA's review and the late penalty applied, the same number every gradebook
shows. Each assignment is found in the course by a stable key, its integration_id
`grader:<assignment>`, and created (published, no submission, course.toml's points) where none
has it: a second publish never adds a second column. Students are matched
through the roster's Canvas columns (canvas_user_id, sis_user_id or sis_login_id:
grader.batch.roster.LMS_COLUMNS) against the course's student enrolments.

Only what changed is sent: OUT/lms/canvas-<course>.json records each grade as it was sent
(rewritten atomically after each one, under a lock), so a publish cut short (a network error, a
rate limit that outlasted its retries) is finished by the next, and a regrade sends one grade.
An incomplete grade (CPU only, a partial run) or one held for review (an integrity flag no TA
has decided) is not sent unless asked (`include_incomplete`).

One failure costs only its own grade, said in one line: a student not in the course, or not
in the roster's Canvas columns, a grade Canvas refused. A token Canvas refuses (401), a course
it does not find (404) stop the publish before anything is sent, in one line. A rate limit
(429, or 403 "Rate Limit Exceeded") is retried with a growing wait, a bounded number of times.

The token is the TA's Canvas access token, read from an environment variable (never a file in
the class folder, never a command-line argument: either would land in a log or a backup).
"""

from __future__ import annotations

import functools
import json
import math
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable

from grader.results import FileLock, write_json_atomic
from grader.sanitize import one_line

TOKEN_ENV = "CANVAS_API_TOKEN"
URL_ENV = "CANVAS_API_URL"
EXTRA = "grader[lms]"  # where canvasapi comes from: pip install 'grader[lms]'
FOLDER = "lms"  # OUT/lms: what each publish sent
FORMAT = 1
RETRIES = 5  # tries of one request a rate limit answers
WAIT_S = 2.0  # the first wait after a rate limit; doubled each time, at most MAX_WAIT_S
MAX_WAIT_S = 60.0
TIMEOUT_S = 60.0  # one request's limit: a network that stops answering is a failure, not a hang
KEY = "grader:{}"  # an assignment's integration_id in Canvas: the grader's own name for it


class PublishError(Exception):
    """The publish cannot start or go on at all (no canvasapi, no token, a token or course refused): one line."""


@dataclass
class Change:
    """One student x assignment: what the last publish sent (`before`), what the class view has now
    (`grade`), and what this publish does: send, unchanged, or why it is not sent."""

    student: str
    assignment: str
    grade: float | None
    out_of: float | None
    before: float | None
    action: str  # send | unchanged | held for review | incomplete: ... | no grade | no Canvas id
    identity: dict = field(default_factory=dict)  # the roster's Canvas columns given for the student


@dataclass
class Published:
    sent: list[Change] = field(default_factory=list)
    failed: list[str] = field(default_factory=list)  # one line each
    said: list[str] = field(default_factory=list)  # what was done, one line each (assignments created)


def record_path(out: Path, course_id: int) -> Path:
    return Path(out) / FOLDER / f"canvas-{course_id}.json"


def read_sent(out: Path, course_id: int) -> dict:
    """The record of what was sent to this course ({"assignments": {name: id}, "sent": {student:
    {assignment: {"grade", "user_id", "at"}}}}); an empty one where there is none yet."""
    path = record_path(out, course_id)
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        data = {}
    except (OSError, ValueError) as exc:
        raise PublishError(f"{path}: the record of what was sent cannot be read ({type(exc).__name__}): move it "
                           "away to publish every grade again") from None
    if not isinstance(data, dict) or not isinstance(data.get("sent", {}), dict) \
            or not isinstance(data.get("assignments", {}), dict):
        raise PublishError(f"{path}: not a record of grader publish: move it away to publish every grade again")
    data.setdefault("format", FORMAT)
    data.setdefault("course_id", course_id)
    data.setdefault("assignments", {})
    data.setdefault("sent", {})
    return data


def _class_grades(out: Path) -> tuple[list[str], list[dict]]:
    """(assignments, students) of OUT/summary.json: the class view as `grader grade` last wrote it."""
    path = Path(out) / "summary.json"
    try:
        summary = json.loads(path.read_text())
        return list(summary["assignments"]), list(summary["students"])
    except FileNotFoundError:
        raise PublishError(f"{out}: no summary.json: grade the class first (grader grade --out {out})") from None
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise PublishError(f"{path} cannot be read ({type(exc).__name__}): rebuild it with grader similarity "
                           f"--class {out}") from None


def _number(value) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) \
        and math.isfinite(value) else None


def plan(out: Path, course_id: int, include_incomplete: bool = False) -> list[Change]:
    """Every grade of the class against the record of the last publish to `course_id`."""
    assignments, students = _class_grades(out)
    sent = read_sent(out, course_id)["sent"]
    changes = []
    for s in students:
        if not isinstance(s, dict) or not isinstance(s.get("student"), str):
            continue
        student = s["student"]
        lms: dict = s["lms"] if isinstance(s.get("lms"), dict) else {}
        identity = {k: str(v) for k, v in lms.items() if k in ("canvas_user_id", "sis_user_id", "sis_login_id")}
        cells: dict = s["assignments"] if isinstance(s.get("assignments"), dict) else {}
        for a in assignments:
            cell: dict = cells[a] if isinstance(cells.get(a), dict) else {}
            grade, out_of = _number(cell.get("final")), _number(cell.get("max_score"))
            last = (sent.get(student) or {}).get(a) or {}
            before = _number(last.get("grade")) if isinstance(last, dict) else None
            lacks = [*(["partial run"] if cell.get("partial") else []),
                     *(["CPU only"] if cell.get("gpu_points_not_graded") else [])]
            if grade is None:
                action = "no grade"
            elif cell.get("held") and not include_incomplete:
                action = "held for review"
            elif lacks and not include_incomplete:
                action = f"incomplete: {', '.join(lacks)}"
            elif not identity:
                action = "no Canvas id"
            elif before is not None and before == grade:
                action = "unchanged"
            else:
                action = "send"
            changes.append(Change(student, a, grade, out_of, before, action, identity))
    return changes


def _canvas(url: str, token: str):
    from urllib.parse import urlsplit

    where = urlsplit(url)
    if where.scheme not in ("https", "http") or not where.hostname:
        raise PublishError(f"{one_line(url, 200)!r} is not a Canvas address: give --url https://canvas.example.edu")
    if where.scheme == "http" and where.hostname not in ("localhost", "127.0.0.1", "::1"):
        raise PublishError(f"{one_line(url, 200)}: the token would cross the network unencrypted: use https://")
    try:
        from canvasapi import Canvas
    except ImportError:
        raise PublishError(f"grader publish canvas needs canvasapi: pip install '{EXTRA}'") from None
    canvas = Canvas(url.rstrip("/"), token)
    session = canvas._Canvas__requester._session  # canvasapi sets no timeout of its own
    session.request = functools.partial(session.request, timeout=TIMEOUT_S)
    return canvas


def _rate_limited(exc: Exception) -> bool:
    from canvasapi.exceptions import Forbidden, RateLimitExceeded

    return isinstance(exc, RateLimitExceeded) or (isinstance(exc, Forbidden)
                                                  and "rate limit exceeded" in str(exc).lower())


def _retrying(call: Callable[[], Any], sleep: Callable[[float], None]) -> Any:
    """call(), tried again after a growing wait where Canvas answers with its rate limit."""
    wait = WAIT_S
    for attempt in range(RETRIES):
        try:
            return call()
        except Exception as exc:
            if not _rate_limited(exc) or attempt == RETRIES - 1:
                raise
            sleep(wait)
            wait = min(wait * 2, MAX_WAIT_S)


def _why(exc: Exception) -> str:
    """A failed request in a few words, never the token or a whole page of HTML."""
    import requests
    from canvasapi.exceptions import CanvasException, ResourceDoesNotExist, Unauthorized

    if _rate_limited(exc):
        return f"Canvas's rate limit held after {RETRIES} tries: run the same command again later"
    if isinstance(exc, ResourceDoesNotExist):
        return "Canvas answers 404 (not found)"
    if isinstance(exc, Unauthorized):
        return "Canvas answers 401: the token may not grade this course"
    if isinstance(exc, requests.RequestException):
        return f"network error ({type(exc).__name__}): run the same command again to finish"
    if isinstance(exc, CanvasException):
        return f"Canvas refused it: {one_line(str(exc), 200)}"
    return f"{type(exc).__name__}: {one_line(str(exc), 200)}"


def _course(canvas, course_id: int, url: str, allow_unpublished: bool, sleep):
    import requests
    from canvasapi.exceptions import InvalidAccessToken, ResourceDoesNotExist, Unauthorized

    try:
        course = _retrying(lambda: canvas.get_course(course_id), sleep)
    except (InvalidAccessToken, Unauthorized):
        raise PublishError(f"Canvas at {url} refused the token (401: wrong, expired or revoked): make a new one "
                           f"(Account > Settings > New access token) and set {TOKEN_ENV}") from None
    except ResourceDoesNotExist:
        raise PublishError(f"Canvas at {url} has no course {course_id} that this token can see (404): check "
                           "--course-id (the number in the course's URL) and the token's user") from None
    except requests.RequestException as exc:
        raise PublishError(f"Canvas at {url} cannot be reached ({type(exc).__name__}): check --url / "
                           f"{URL_ENV} and the network") from None
    except Exception as exc:
        raise PublishError(f"course {course_id}: {_why(exc)}") from None
    if getattr(course, "workflow_state", "available") == "unpublished" and not allow_unpublished:
        raise PublishError(f"course {course_id} is unpublished in Canvas: its students see no grade. Publish the "
                           "course, or give --allow-unpublished to load the grades first")
    return course


def _students(course, sleep) -> dict[tuple[str, str], int]:
    """The course's students by each id the roster may give: (column, value) -> Canvas user id."""
    found: dict[tuple[str, str], int] = {}

    def listed():
        return list(course.get_users(enrollment_type=["student"]))

    for u in _retrying(listed, sleep):
        uid = getattr(u, "id", None)
        if not isinstance(uid, int):
            continue
        found[("canvas_user_id", str(uid))] = uid
        if getattr(u, "sis_user_id", None):
            found[("sis_user_id", str(u.sis_user_id))] = uid
        if getattr(u, "login_id", None):
            found[("sis_login_id", str(u.login_id).lower())] = uid
    return found


def _user_id(change: Change, students: dict[tuple[str, str], int]) -> int | None:
    for column in ("canvas_user_id", "sis_user_id", "sis_login_id"):
        value = change.identity.get(column)
        if value:
            uid = students.get((column, value.lower() if column == "sis_login_id" else value))
            if uid is not None:
                return uid
    return None


def _assignments(course, record: dict, changes: list[Change], outcome: Published, sleep) -> dict[str, Any]:
    """Each assignment with a grade to send, found by its integration_id or created once."""
    wanted = sorted({c.assignment for c in changes if c.action == "send"})
    if not wanted:
        return {}
    existing = {getattr(a, "integration_id", None): a for a in _retrying(lambda: list(course.get_assignments()), sleep)}
    found = {}
    for name in wanted:
        key = KEY.format(name)
        assignment = existing.get(key)
        points = max((c.out_of for c in changes if c.assignment == name and c.out_of is not None), default=None)
        if assignment is not None and points is not None and getattr(assignment, "points_possible", None) != points:
            made = assignment
            assignment = _retrying(lambda: made.edit(assignment={"points_possible": points}), sleep)  # noqa: B023
            outcome.said.append(f"the assignment {name!r} in Canvas is now out of {points:g} points (course.toml's)")
        if assignment is None:
            spec = {"name": name, "integration_id": key, "submission_types": ["none"], "published": True,
                    "grading_type": "points", **({"points_possible": points} if points is not None else {})}
            assignment = _retrying(lambda: course.create_assignment(spec), sleep)  # noqa: B023 - called at once
            outcome.said.append(f"created the assignment {name!r} in Canvas ({points:g} points)" if points is not None
                                else f"created the assignment {name!r} in Canvas")
        found[name] = assignment
        record["assignments"][name] = assignment.id
    return found


def comment_of(c: Change) -> str:
    """The submission comment sent with a grade (`comment`): the grade and where it comes from."""
    top = "" if c.out_of is None else f" / {c.out_of:g}"
    return (f"{c.assignment}: {c.grade:g}{top} points, from the course's grader (course points, any review and "
            "late penalty applied). Your report.html has every check.")


def publish(out: Path, course_id: int, url: str, token: str, *, include_incomplete: bool = False,
            allow_unpublished: bool = False, comment: bool = False, sleep: Callable[[float], None] = time.sleep,
            on_sent: Callable[[Change], None] | None = None) -> tuple[list[Change], Published]:
    """Send every changed grade of the class in `out` to the Canvas course, with a comment saying
    it where `comment`; (the plan, what came of it)."""
    out = Path(out)
    canvas = _canvas(url, token)  # first: without canvasapi, the line that names the extra
    from canvasapi.submission import Submission

    outcome = Published()
    path = record_path(out, course_id)
    path.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(path.parent / f".canvas-{course_id}.lock"):
        record = read_sent(out, course_id)
        if record.get("url") not in (None, url.rstrip("/")):
            raise PublishError(f"{path} records grades sent to course {course_id} of {one_line(record['url'], 200)}, "
                               f"not of {one_line(url, 200)}: give that --url, or move the record away")
        record["url"] = url.rstrip("/")
        changes = plan(out, course_id, include_incomplete)
        course = _course(canvas, course_id, url, allow_unpublished, sleep)
        todo = [c for c in changes if c.action == "send"]
        if not todo:
            return changes, outcome
        try:
            students = _students(course, sleep)
        except Exception as exc:
            raise PublishError(f"the students of course {course_id} cannot be listed: {_why(exc)}") from None
        try:
            assignments = _assignments(course, record, changes, outcome, sleep)
        except Exception as exc:
            raise PublishError(f"the assignments of course {course_id} cannot be found or made: {_why(exc)}") from None
        write_json_atomic(record, path)
        requester = canvas._Canvas__requester
        for c in todo:
            uid = _user_id(c, students)
            if uid is None:
                given = ", ".join(f"{k} {v}" for k, v in c.identity.items())
                outcome.failed.append(f"{c.student}/{c.assignment}: not sent: no student of course {course_id} has "
                                      f"the roster's {given} (not enrolled, or a typo in the roster)")
                continue
            grade = assignments[c.assignment]
            submission = Submission(requester, {"course_id": course_id, "assignment_id": grade.id, "user_id": uid})
            try:
                said = {"comment": {"text_comment": comment_of(c)}} if comment else {}
                _retrying(lambda: submission.edit(submission={"posted_grade": f"{c.grade:g}"}, **said),  # noqa: B023
                          sleep)
            except Exception as exc:
                outcome.failed.append(f"{c.student}/{c.assignment}: not sent: {_why(exc)}")
                continue
            record["sent"].setdefault(c.student, {})[c.assignment] = {
                "grade": c.grade, "out_of": c.out_of, "user_id": uid,
                "at": datetime.now(timezone.utc).isoformat(timespec="seconds")}
            write_json_atomic(record, path)  # each grade recorded as it is sent: a cut run is finished by the next
            outcome.sent.append(c)
            if on_sent:
                on_sent(c)
    return changes, outcome
