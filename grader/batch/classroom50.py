"""A Classroom 50 class on the TA's side: its roster, and the scores its runner collected.

Classroom 50 names a student's repository `<classroom>-<slug>-<username>`, lower case, in the
course's organization. `grader fetch --classroom50 CLASSROOM --slug SLUG --org ORG` reads as the
roster either a list of GitHub usernames (one a line, `#` comments) or a CSV export whose header
names the username column (`username`, `github_username`, `github` or `login`; optionally
`identifier`, `student`, `student_id` or `email` for the gradebook's key, and `name`).

`--scores scores.json` reads the scores Classroom 50 collected: its own scores.json
(`classroom50/scores/v1`: `{"schema", "assignments": {slug: {"type", "entries": [{"owner",
"submissions": [result, ...], "override"}]}}}`, each submission a result.json less its
`assignment`), or result.json objects (classroom50/result/v1) a TA gathered: a list, the same list
under "results" or "scores", or an object that maps a username to one of them or to a list. The latest submission of
each
(owner, assignment) is kept, normalized into WORKDIR/classroom50-scores.json, and the class view
shows it beside our own grade.

Both files are hostile input (a TA downloaded them, a student may have written into them): a
malformed one is one clear message, never a traceback, and every value is checked for its type
and bounds before it is kept.
"""

from __future__ import annotations

import csv
import json
import re
from pathlib import Path
from typing import Any

from grader.batch.roster import RosterEntry, RosterError, _check_unique
from grader.sanitize import one_line

SCORES_SCHEMA = "classroom50/scores/v1"
SCORES_FILE = "classroom50-scores.json"  # in the workspace, beside lock.json
MAX_BYTES = 50 * 2**20
USER = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9]|-(?=[A-Za-z0-9])){0,38}")  # GitHub's rule for a username
PART = re.compile(r"[a-z0-9][a-z0-9._-]{0,99}")
USER_COLUMNS = ("username", "github_username", "github", "login")
ID_COLUMNS = ("identifier", "student", "student_id", "email")


class ScoresError(Exception):
    """scores.json cannot be read as a whole."""


def repo_name(classroom: str, slug: str, user: str) -> str:
    return f"{classroom}-{slug}-{user}".lower()


def _read_text(path: Path, what: str, error) -> str:
    path = Path(path)
    if not path.is_file():
        raise error(f"{what} {path}: no such file")
    if path.stat().st_size > MAX_BYTES:
        raise error(f"{what} {path}: larger than {MAX_BYTES // 2**20} MiB")
    try:
        return path.read_text(encoding="utf-8-sig")
    except UnicodeDecodeError:
        raise error(f"{what} {path}: not UTF-8 text") from None


def load_roster(path: Path, org: str | None, classroom: str, slug: str) -> list[RosterEntry]:
    """The students of a Classroom 50 assignment, each with ORG/<classroom>-<slug>-<user>."""
    path = Path(path)
    if not org:
        raise RosterError("--classroom50 needs --org ORG (the organization of the students' repositories, or a base "
                          "URL)")
    classroom, slug = classroom.strip().lower(), slug.strip().lower()
    for what, value in (("--classroom50", classroom), ("--slug", slug)):
        if not PART.fullmatch(value):
            raise RosterError(f"{what} {one_line(value, 80)!r}: letters, digits, '-', '_' and '.' only")
    base = org.rstrip("/") if "://" in org else f"https://github.com/{org.strip('/')}"
    text = _read_text(path, "roster", RosterError)
    lines = [(n, line.strip()) for n, line in enumerate(text.splitlines(), 1)]
    lines = [(n, line) for n, line in lines if line and not line.startswith("#")]
    if not lines:
        raise RosterError(f"roster {path}: the file is empty")
    first = [h.strip().lower() for h in next(csv.reader([lines[0][1]]))]
    column = next((c for c in USER_COLUMNS if c in first), None)
    if column is None and ("," in lines[0][1] or len(first) > 1):
        raise RosterError(f"roster {path}: a CSV header needs a username column ({', '.join(USER_COLUMNS)}), "
                          f"not {one_line(','.join(first), 200)!r}")
    if column is None:  # a list of usernames
        rows = [(n, {"username": line}) for n, line in lines]
        column = "username"
    else:
        rows = []
        for n, cells in zip((n for n, _ in lines[1:]), csv.reader([line for _, line in lines[1:]])):
            if len(cells) > len(first):
                raise RosterError(f"roster {path}, line {n}: {len(cells)} fields, but the header has {len(first)}")
            rows.append((n, {h: (cells[i].strip() if i < len(cells) else "") for i, h in enumerate(first)}))
    entries = []
    for n, rec in rows:
        user = rec.get(column, "")
        student = next((rec[c] for c in ID_COLUMNS if rec.get(c)), "") or user
        if not student:
            raise RosterError(f"roster {path}, line {n}: neither a username nor a student id")
        if not user:
            entries.append(RosterEntry(student, None, name=rec.get("name", ""),
                                       problem="no GitHub username in the roster (assignment not accepted?)"))
            continue
        if not USER.fullmatch(user):
            raise RosterError(f"roster {path}, line {n}: {one_line(user, 80)!r} is not a GitHub username")
        entries.append(RosterEntry(student, f"{base}/{repo_name(classroom, slug, user)}", name=rec.get("name", ""),
                                   github_username=user))
    if not entries:
        raise RosterError(f"roster {path}: a header but no student")
    _check_unique(path, entries)
    return entries


def _check_int(value, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ScoresError(f"{what} is {one_line(repr(value), 60)}, not a non-negative integer")
    return value


def _record(item, where: str) -> dict:
    if not isinstance(item, dict):
        raise ScoresError(f"{where}: not an object")
    out: dict[str, Any] = {}
    for key in ("owner", "assignment", "submission", "datetime"):
        value = item.get(key)
        if not isinstance(value, str) or not value:
            raise ScoresError(f"{where}: {key!r} is missing or not a string")
        out[key] = one_line(value, 200)
    if not USER.fullmatch(out["owner"]):
        raise ScoresError(f"{where}: owner {out['owner']!r} is not a GitHub username")
    out["score"] = _check_int(item.get("score"), f"{where}: score")
    out["max-score"] = _check_int(item.get("max-score"), f"{where}: max-score")
    if out["score"] > out["max-score"]:
        raise ScoresError(f"{where}: score {out['score']} is above max-score {out['max-score']}")
    release = item.get("release")
    out["release"] = one_line(release, 300) if isinstance(release, str) else ""
    if isinstance(item.get("late"), bool):  # marked by Classroom 50's collection against the assignment's `due`
        out["late"] = item["late"]
    return out


def _scores_v1(data: dict, path: Path) -> list[tuple[str, object]]:
    """(where, result) of every submission in Classroom 50's scores.json, each with its bucket's
    slug as `assignment` and its entry's owner where it names none."""
    buckets = data.get("assignments")
    if not isinstance(buckets, dict):
        raise ScoresError(f"scores {path}: \"assignments\" is not an object of assignments by slug")
    items = []
    for slug, bucket in buckets.items():
        where = f"assignment {one_line(slug, 60)!r}"
        if not isinstance(bucket, dict) or not isinstance(bucket.get("entries"), list):
            raise ScoresError(f"scores {path}, {where}: not {{\"type\", \"entries\": [...]}}")
        for i, entry in enumerate(bucket["entries"]):
            at = f"{where}, entry {i + 1}"
            if not isinstance(entry, dict) or not isinstance(entry.get("submissions"), list):
                raise ScoresError(f"scores {path}, {at}: not {{\"owner\", \"submissions\": [...]}}")
            for j, sub in enumerate(entry["submissions"]):
                if isinstance(sub, dict):
                    sub = {"owner": entry.get("owner"), **sub, "assignment": slug}
                items.append((f"{at}, submission {j + 1}", sub))
    return items


def load_scores(path: Path) -> list[dict]:
    """Every submission's record in scores.json, checked; the latest per (owner, assignment)."""
    text = _read_text(path, "scores", ScoresError)
    try:
        data = json.loads(text)
    except (ValueError, RecursionError) as exc:
        raise ScoresError(f"scores {path}: not valid JSON ({one_line(str(exc), 120)})") from None
    items: list[tuple[str, object]] = []
    if isinstance(data, dict) and "schema" in data:  # Classroom 50's own scores.json
        if data["schema"] != SCORES_SCHEMA:
            raise ScoresError(f"scores {path}: schema {one_line(repr(data['schema']), 80)} is not {SCORES_SCHEMA!r} "
                              "(Classroom 50's scores.json)")
        items = _scores_v1(data, path)
    else:  # result.json objects a TA gathered
        if isinstance(data, dict) and any(k in data for k in ("results", "scores")):
            data = data.get("results", data.get("scores"))
        if isinstance(data, list):
            items = [(f"entry {i + 1}", item) for i, item in enumerate(data)]
        elif isinstance(data, dict):
            for user, value in data.items():
                for i, item in enumerate(value if isinstance(value, list) else [value]):
                    if isinstance(item, dict) and "owner" not in item:
                        item = {**item, "owner": user}
                    items.append((f"{one_line(user, 60)!r}, entry {i + 1}", item))
        else:
            raise ScoresError(f"scores {path}: expected Classroom 50's scores.json ({SCORES_SCHEMA}) or a list of "
                              f"results")
    records = [_record(item, f"scores {path}, {where}") for where, item in items]
    latest: dict[tuple[str, str], dict] = {}
    for r in records:
        key = (r["owner"].lower(), r["assignment"].lower())
        if key not in latest or (r["datetime"], r["submission"]) > (latest[key]["datetime"], latest[key]["submission"]):
            latest[key] = r
    return sorted(latest.values(), key=lambda r: (r["owner"].lower(), r["assignment"].lower()))


def save_scores(records: list[dict], workdir: Path) -> Path:
    from grader.results import write_json_atomic

    path = Path(workdir) / SCORES_FILE
    write_json_atomic({"format": 1, "scores": records}, path)
    return path


def read_saved(workdir: Path) -> list[dict]:
    """The workspace's normalized scores (written by save_scores); [] when there are none or the
    file was damaged since (each record is checked again)."""
    path = Path(workdir) / SCORES_FILE
    if not path.is_file():
        return []
    try:
        return load_scores(path)
    except ScoresError:
        return []


def score_cells(records: list[dict], users: dict[str, str], assignments: list[str],
                course=None) -> dict[tuple[str, str], str]:
    """(student, assignment) -> 'Classroom 50: 7 / 10 (submit/...)' where a record's owner is a
    student's GitHub username (`users`: username -> student) and its slug the assignment's. Where
    course.toml (`course`, a CourseConfig) scales the assignment, the score in its points beside it
    ('7 / 10 = 14 / 20 in this course'): the runner counts the spec's points, the gradebooks the course's."""
    from grader.batch.course import exact
    from grader.kit.classroom50 import slug_of

    by_slug = {slug_of(a): a for a in assignments} | {a.lower(): a for a in assignments}
    out: dict[tuple[str, str], str] = {}
    for r in records:
        student, assignment = users.get(r["owner"].lower()), by_slug.get(r["assignment"].lower())
        if student is not None and assignment is not None:
            late = ", late" if r.get("late") else ""
            scaled = ""
            # a kit released with course.toml's points reports in them already (grader.kit.points): not scaled twice
            if course is not None and assignment in course.points and r["max-score"] \
                    and exact(r["max-score"]) != course.points[assignment]:
                points, top = course.scale(assignment, exact(r["score"]), exact(r["max-score"]))
                scaled = f" = {float(points):.4g} / {float(top):g} in this course"
            out[(student, assignment)] = (f"Classroom 50: {r['score']} / {r['max-score']}{scaled} "
                                          f"({r['submission']}{late})")
    return out
