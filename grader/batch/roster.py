"""The class roster: who is graded and where their repo is.

Three CSV layouts are read, told apart by their header:
- the plain one, `student,repo[,commit]` (repo: a URL, a file:// URL or a local path,
  relative to the roster's folder; commit: pins that commit instead of the branch head);
- GitHub Classroom's roster export, `identifier,github_username,github_id,name`, with
  `--org ORG --prefix PREFIX`: Classroom names a student's repo ORG/PREFIX-USERNAME;
- GitHub Classroom's grades export of one assignment, which holds
  `student_repository_url` itself.

Any layout may add the columns an LMS needs to find the student (grader.batch.exporters and
`grader publish` use them; each is optional, and checked on load):
- Canvas: `canvas_user_id` (Canvas's numeric user id, the gradebook's ID), `sis_user_id`,
  `sis_login_id` (the login: often the email). One of them lets a grade reach Canvas;
- Gradescope: `gradescope_sid` (the SID, the student id Gradescope matches by), `email` (the
  account's email: Gradescope's other key), and `name`.

A roster that cannot be read as a whole (no known header, a row without a student or a repo,
two rows for one student) is a RosterError: the TA fixes the file before anything runs.
A student that cannot be fetched (no GitHub account linked yet) is only that student's
problem, carried in `problem`.
"""

from __future__ import annotations

import csv
import re
from dataclasses import dataclass, field
from pathlib import Path

PLAIN = ("student", "repo")
CLASSROOM_ROSTER = ("identifier", "github_username", "github_id", "name")
CLASSROOM_GRADES = ("github_username", "roster_identifier", "student_repository_url")
# the LMS identities a roster may carry, by column (RosterEntry.lms keeps those given)
LMS_COLUMNS = ("canvas_user_id", "sis_user_id", "sis_login_id", "gradescope_sid", "email")
_EMAIL = re.compile(r"[^@\s,;<>\"']+@[^@\s,;<>\"']+\.[^@\s,;<>\"']+")
_ID = re.compile(r"[^\x00-\x1f\x7f]{1,200}")  # an SIS id or login: printable, bounded


class RosterError(Exception):
    """The roster file is malformed: nobody is graded until it is fixed."""


@dataclass
class RosterEntry:
    student: str  # the gradebook's key: what the TA knows the student by
    repo: str | None  # URL or absolute path; None when it cannot be formed (see problem)
    commit: str | None = None  # pinned by the roster itself
    name: str = ""
    github_username: str = ""
    problem: str | None = None
    lms: dict[str, str] = field(default_factory=dict)  # LMS_COLUMNS given for this student

    @property
    def folder(self) -> str:
        return safe_name(self.student)


def safe_name(student: str) -> str:
    """A folder name for a student id (ids may be emails or full names)."""
    name = re.sub(r"[^A-Za-z0-9._@+-]", "_", student.strip()).lstrip(".")
    return name or "_"


def load_roster(path: Path, org: str | None = None, prefix: str | None = None) -> list[RosterEntry]:
    path = Path(path)
    if not path.is_file():
        raise RosterError(f"roster {path}: no such file")
    try:
        text = path.read_text(encoding="utf-8-sig")  # Excel writes a byte-order mark
    except UnicodeDecodeError:
        raise RosterError(f"roster {path}: not UTF-8 text (save it as CSV UTF-8)") from None
    rows = [(i + 1, r) for i, r in enumerate(csv.reader(text.splitlines())) if any(cell.strip() for cell in r)]
    if not rows:
        raise RosterError(f"roster {path}: the file is empty")
    header = [h.strip().lower() for h in rows[0][1]]
    data = rows[1:]
    for line, row in data:
        if len(row) > len(header):
            raise RosterError(f"roster {path}, line {line}: {len(row)} fields, but the header has {len(header)}")
    records = [(line, {h: (row[i].strip() if i < len(row) else "") for i, h in enumerate(header)})
               for line, row in data]

    if set(PLAIN) <= set(header):
        entries = [_plain(path, line, rec) for line, rec in records]
    elif set(CLASSROOM_GRADES) <= set(header):
        entries = [_classroom_grades(path, line, rec) for line, rec in records]
    elif {"identifier", "github_username"} <= set(header):
        if not org or not prefix:
            raise RosterError(f"roster {path} is GitHub Classroom's roster export: give --org ORG and --prefix PREFIX "
                              "(the assignment's repo prefix), so each repo is ORG/PREFIX-USERNAME")
        entries = [_classroom_roster(line, rec, org, prefix) for line, rec in records]
    elif missing := _missing_columns(header):
        raise RosterError(f"roster {path}: the header {','.join(header)!r} has no {missing}")
    else:
        raise RosterError(f"roster {path}: unknown header {','.join(header)!r}; expected 'student,repo[,commit]', "
                          f"GitHub Classroom's roster ({','.join(CLASSROOM_ROSTER)}) with --org and --prefix, "
                          "or Classroom's grades export (with student_repository_url)")
    if not entries:
        raise RosterError(f"roster {path}: a header but no student")
    _check_unique(path, entries)
    _lms_identities(path, records, entries, header)
    return entries


def _lms_identities(path: Path, records: list[tuple[int, dict]], entries: list[RosterEntry], header: list[str]) -> None:
    """The LMS columns of each row, checked (a Canvas user id is a number, an email is one, an id
    is printable and no two students share one) and kept in RosterEntry.lms."""
    given = [c for c in LMS_COLUMNS if c in header]
    seen: dict[tuple[str, str], str] = {}
    for (line, rec), entry in zip(records, entries):
        for column in given:
            value = rec.get(column, "")
            if not value:
                continue
            if column == "canvas_user_id" and not re.fullmatch(r"[1-9][0-9]{0,17}", value):
                raise RosterError(f"roster {path}, line {line}: canvas_user_id {value[:40]!r} of {entry.student!r} "
                                  "is not a Canvas user id (a number: People > the student > the URL's last part)")
            if column == "email" and not _EMAIL.fullmatch(value):
                raise RosterError(f"roster {path}, line {line}: email {value[:60]!r} of {entry.student!r} is not "
                                  "an email address")
            if not _ID.fullmatch(value):
                raise RosterError(f"roster {path}, line {line}: {column} of {entry.student!r} holds a control "
                                  "character or is longer than 200 characters")
            key = (column, value.lower() if column in ("email", "sis_login_id") else value)
            if key in seen:
                raise RosterError(f"roster {path}, line {line}: {column} {value[:60]!r} is given to both "
                                  f"{seen[key]!r} and {entry.student!r}")
            seen[key] = entry.student
            entry.lms[column] = value


def _missing_columns(header: list[str]) -> str:
    """'repo column (a plain roster is student,repo[,commit])' for a header that is most of
    a known layout: the column to add, named. Empty when the header resembles none."""
    layouts = ((PLAIN, "a plain roster is student,repo[,commit]"),
               (CLASSROOM_GRADES, "Classroom's grades export has " + ",".join(CLASSROOM_GRADES)))
    best = max(layouts, key=lambda lay: len(set(lay[0]) & set(header)))
    have = set(best[0]) & set(header)
    if not have:
        return ""
    missing = [c for c in best[0] if c not in header]
    return f"{' and '.join(missing)} column{'s' if len(missing) > 1 else ''} ({best[1]})"


def _plain(path: Path, line: int, rec: dict) -> RosterEntry:
    student, repo = rec["student"], rec["repo"]
    if not student:
        raise RosterError(f"roster {path}, line {line}: no student id")
    if not repo:
        raise RosterError(f"roster {path}, line {line}: student {student!r} has no repo")
    commit = rec.get("commit") or None
    if commit and not re.fullmatch(r"[0-9a-fA-F]{7,40}", commit):
        raise RosterError(f"roster {path}, line {line}: commit {commit!r} of {student!r} is not a commit hash")
    return RosterEntry(student, _resolve(repo, path.parent), commit, name=rec.get("name", ""))


def _classroom_roster(line: int, rec: dict, org: str, prefix: str) -> RosterEntry:
    user = rec["github_username"]
    student = rec["identifier"] or user
    if not student:
        raise RosterError(f"line {line}: neither an identifier nor a github_username")
    if not user:
        return RosterEntry(student, None, name=rec.get("name", ""),
                           problem="no GitHub account is linked to this roster identifier in Classroom (assignment not "
                                   "accepted?)")
    base = org.rstrip("/") if "://" in org else f"https://github.com/{org.strip('/')}"
    return RosterEntry(student, f"{base}/{prefix.rstrip('-')}-{user}", name=rec.get("name", ""), github_username=user)


def _classroom_grades(path: Path, line: int, rec: dict) -> RosterEntry:
    user = rec["github_username"]
    student = rec["roster_identifier"] or user
    if not student:
        raise RosterError(f"roster {path}, line {line}: neither a roster_identifier nor a github_username")
    url = rec["student_repository_url"]
    return RosterEntry(student, url or None, github_username=user,
                       problem=None if url else "Classroom lists no repository for this student")


def _resolve(repo: str, base: Path) -> str:
    """URLs stay as they are; a local path is taken relative to the roster's folder."""
    if "://" in repo or re.match(r"^[\w.-]+@[\w.-]+:", repo):
        return repo
    return str((base / repo).resolve())


def _check_unique(path: Path, entries: list[RosterEntry]) -> None:
    seen: dict[str, str] = {}
    for e in entries:
        if e.folder in seen:
            what = ("appears twice" if seen[e.folder] == e.student
                    else f"and {seen[e.folder]!r} map to the same folder {e.folder!r}")
            raise RosterError(f"roster {path}: student {e.student!r} {what}")
        seen[e.folder] = e.student
