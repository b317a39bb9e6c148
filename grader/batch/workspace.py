"""Workspace: every student's repo cloned or updated into a cache, and a lock file that pins
the commit that is graded.

`grader fetch` fills WORKDIR/repos/<student> (GitPython: init + fetch, so a first clone and an
update are one path) and writes WORKDIR/lock.json. A student whose repo cannot be fetched (bad
URL, unreachable host, empty repo, missing branch, nothing before the deadline) is `unfetched`
in the lock with the reason, and the others go on. Grading reads only the lock, so a class is
graded at exactly the commits pinned, however often it is graded again.

With a deadline, the pinned commit is the last one whose commit date is not after it. Commit
dates are written by the student's machine and can be set at will: the lock and the reports
say so, and the pinned commit is what counts.
"""

from __future__ import annotations

import json
import os
import re
import shutil
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Callable

import git

from grader.results import write_json_atomic
from grader.batch.roster import RosterEntry

LOCK_NAME = "lock.json"
DATE_WARNING = ("Commit dates are set by the student's own machine and can be forged; the pinned commit is what is graded "
                "(check push times on the forge where a deadline dispute matters).")
# git may only use these transports: no ext:: (runs a command), no fd::
ALLOWED_PROTOCOLS = "file:https:http:ssh:git"
FETCH_TIMEOUT_S = 300


class LockError(Exception):
    """The lock file is missing or malformed."""


@dataclass
class Pinned:
    """One student's line in the lock: the commit to grade, or why there is none."""

    student: str
    repo: str | None
    status: str  # fetched | unfetched
    reason: str = ""
    path: str | None = None  # the checkout, relative to the lock file's folder
    branch: str | None = None
    commit: str | None = None
    commit_date: str | None = None
    head: str | None = None  # the branch head when fetched
    head_date: str | None = None
    late: bool | None = None  # None: no deadline was given
    late_commits: int = 0  # commits after the deadline, not graded
    notes: list[str] = field(default_factory=list)
    name: str = ""
    github_username: str = ""
    deadline: str | None = None  # this student's deadline (an extension moves it), from course.toml or --deadline
    cutoff: str | None = None  # with a late policy: the last commit date still graded

    @property
    def folder(self) -> str:
        from grader.batch.roster import safe_name

        return safe_name(self.student)


@dataclass
class Lock:
    students: list[Pinned]
    created: str
    deadline: str | None = None
    roster: str | None = None
    warning: str | None = None
    root: Path = Path(".")  # where the lock file lies; checkout paths are relative to it

    def checkout(self, p: Pinned) -> Path:
        assert p.path is not None
        return (self.root / p.path).resolve()

    def to_json(self) -> dict:
        return {"format": 1, "created": self.created, "deadline": self.deadline, "roster": self.roster,
                "warning": self.warning, "students": [asdict(s) for s in self.students]}


def parse_deadline(text: str) -> datetime:
    """ISO 8601 with a time zone (2025-03-01T23:59:00-05:00, or ...Z for UTC)."""
    try:
        when = datetime.fromisoformat(text.strip().replace("Z", "+00:00").replace("z", "+00:00"))
    except ValueError:
        raise ValueError(f"--deadline {text!r} is not an ISO 8601 date and time, e.g. 2025-03-01T23:59:00-05:00") from None
    if when.tzinfo is None:
        raise ValueError(f"--deadline {text!r} has no time zone: add one, e.g. {text}-05:00 or {text}Z")
    return when


def fetch_roster(entries: list[RosterEntry], workdir: Path, deadline: datetime | None = None, branch: str | None = None,
                 jobs: int = 4, roster: Path | None = None, progress: Callable[[Pinned], None] | None = None,
                 per_student: Callable[[str], tuple[datetime | None, datetime | None]] | None = None) -> Lock:
    """Fetch every student (`jobs` at a time: clones wait on the network) and write the lock.
    `per_student(student)` gives (deadline, cutoff) where they differ by student (course.toml's
    extensions and late policy): the commit pinned is the last dated on or before the cutoff."""
    workdir = Path(workdir).resolve()
    (workdir / "repos").mkdir(parents=True, exist_ok=True)

    def one(entry: RosterEntry) -> Pinned:
        mine, cutoff = per_student(entry.student) if per_student else (deadline, None)
        pinned = fetch_one(entry, workdir, mine, branch, cutoff)
        if mine is not None and pinned.status == "fetched":
            pinned.deadline, pinned.cutoff = mine.isoformat(), cutoff.isoformat() if cutoff else None
        if progress:
            progress(pinned)
        return pinned

    with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
        students = list(pool.map(one, entries))
    lock = Lock(students, _now(), deadline.isoformat() if deadline else None, str(roster) if roster else None,
                DATE_WARNING if deadline else None, workdir)
    write_json_atomic(lock.to_json(), workdir / LOCK_NAME)
    return lock


def fetch_one(entry: RosterEntry, workdir: Path, deadline: datetime | None, branch: str | None,
              cutoff: datetime | None = None) -> Pinned:
    base = Pinned(entry.student, entry.repo, "unfetched", name=entry.name, github_username=entry.github_username)
    if entry.problem or not entry.repo:
        base.reason = entry.problem or "no repository"
        return base
    dest = workdir / "repos" / entry.folder
    try:
        _check_url(entry.repo)
        repo = _fetch(entry.repo, dest)
        pinned = _pin(repo, entry, deadline, branch, cutoff)
        _checkout(repo, pinned.commit)
    except FetchError as exc:
        base.reason = str(exc)
        return base
    except git.GitCommandError as exc:
        base.reason = _git_message(exc)
        return base
    pinned.path = os.path.relpath(dest, workdir)
    return pinned


class FetchError(Exception):
    pass


def _check_url(url: str) -> None:
    if url.startswith("-") or "::" in url or any(ord(c) < 32 for c in url):
        raise FetchError(f"not a repository URL or path: {url!r}")
    if "://" not in url and not re.match(r"^[\w.-]+@[\w.-]+:", url) and not Path(url).is_dir():
        raise FetchError(f"no such folder: {url}")


def _git_env() -> dict[str, str]:
    env = {"GIT_TERMINAL_PROMPT": "0", "GIT_ALLOW_PROTOCOL": ALLOWED_PROTOCOLS}
    if "GIT_SSH_COMMAND" not in os.environ:
        env["GIT_SSH_COMMAND"] = "ssh -o BatchMode=yes"  # fail, never ask for a password
    return env


def _fetch(url: str, dest: Path) -> git.Repo:
    """Clone or update: a cache folder from an earlier fetch is reused if it is sound."""
    repo = None
    if (dest / ".git").is_dir():
        try:
            repo = git.Repo(dest)
            origin = repo.remotes.origin if "origin" in repo.remotes else repo.create_remote("origin", url)
            if origin.url != url:
                origin.set_url(url)
        except (git.InvalidGitRepositoryError, git.GitCommandError, ValueError):
            repo = None
    if repo is None:
        if dest.exists():
            shutil.rmtree(dest)
        repo = git.Repo.init(dest)
        repo.create_remote("origin", url)
    with repo.git.custom_environment(**_git_env()):
        repo.git.fetch("--prune", "--no-tags", "origin", "+refs/heads/*:refs/remotes/origin/*", kill_after_timeout=FETCH_TIMEOUT_S)
    return repo


def _branches(repo: git.Repo) -> list[str]:
    return sorted(r.remote_head for r in repo.remotes.origin.refs if r.remote_head != "HEAD")


def _default_branch(repo: git.Repo, branches: list[str]) -> str:
    try:
        with repo.git.custom_environment(**_git_env()):
            out = repo.git.ls_remote("--symref", "origin", "HEAD", kill_after_timeout=FETCH_TIMEOUT_S)
        m = re.search(r"^ref: refs/heads/(\S+)\s+HEAD", out, re.M)
        if m and m.group(1) in branches:
            return m.group(1)
    except git.GitCommandError:
        pass
    for name in ("main", "master"):
        if name in branches:
            return name
    if len(branches) == 1:
        return branches[0]
    raise FetchError(f"the repository names no default branch and has several ({', '.join(branches)}): give --branch")


def _pin(repo: git.Repo, entry: RosterEntry, deadline: datetime | None, branch: str | None,
         cutoff: datetime | None = None) -> Pinned:
    """The commit to grade: the roster's, else the last dated on or before the cutoff (the
    deadline, or with a late policy the end of its acceptance window), else the head."""
    branches = _branches(repo)
    if not branches:
        raise FetchError("the repository is empty: no commit has been pushed")
    if branch and branch not in branches:
        raise FetchError(f"branch {branch!r} not found (branches: {', '.join(branches)})")
    branch = branch or _default_branch(repo, branches)
    head = repo.commit(f"refs/remotes/origin/{branch}")
    p = Pinned(entry.student, entry.repo, "fetched", branch=branch, head=head.hexsha, head_date=_iso(head),
               name=entry.name, github_username=entry.github_username)
    if entry.commit:
        try:
            chosen = repo.commit(entry.commit)
        except (git.BadName, ValueError):
            raise FetchError(f"commit {entry.commit} (pinned by the roster) is not in the repository") from None
        p.notes.append(f"Graded at commit {chosen.hexsha[:12]}, pinned by the roster.")
    elif deadline is not None:
        limit = cutoff or deadline
        what = "the deadline" if cutoff is None else "the end of the late period"
        history = list(repo.iter_commits(head))
        on_time = [c for c in history if c.committed_datetime <= limit]
        if not on_time:
            raise FetchError(f"no commit on {branch!r} is dated on or before {what} {limit.isoformat()} "
                             f"(the first is dated {_iso(history[-1])})")
        chosen = max(on_time, key=lambda c: c.committed_datetime)  # ties: the first in git's order
        p.late_commits = sum(1 for _ in repo.iter_commits(f"{chosen.hexsha}..{head.hexsha}"))
        p.notes.append(f"Graded at commit {chosen.hexsha[:12]} ({_iso(chosen)}), the last one dated on or before {what} "
                       f"{limit.isoformat()}" + (f" (deadline {deadline.isoformat()})" if cutoff else "") + ". " + DATE_WARNING)
        if p.late_commits:
            p.notes.append(f"{p.late_commits} commit(s) dated after {what} were not graded.")
    else:
        chosen = head
    p.commit, p.commit_date = chosen.hexsha, _iso(chosen)
    if deadline is not None:
        p.late = chosen.committed_datetime > deadline or (cutoff is None and p.late_commits > 0)
    return p


def _checkout(repo: git.Repo, commit: str | None) -> None:
    repo.git.checkout("--force", "--detach", commit)
    repo.git.clean("-ffdxq")


def ensure_checkout(lock: Lock, p: Pinned) -> Path:
    """The checkout at the pinned commit (a TA may have poked around in the cache)."""
    path = lock.checkout(p)
    repo = git.Repo(path)
    if repo.head.commit.hexsha != p.commit or repo.is_dirty(untracked_files=True):
        _checkout(repo, p.commit)
    return path


def read_lock(path: Path) -> Lock:
    path = Path(path)
    if path.is_dir():
        path = path / LOCK_NAME
    if not path.is_file():
        raise LockError(f"lock file {path}: no such file (write one with `grader fetch`)")
    try:
        data = json.loads(path.read_text())
        students = [Pinned(**s) for s in data["students"]]
        return Lock(students, data["created"], data.get("deadline"), data.get("roster"), data.get("warning"), path.parent.resolve())
    except (ValueError, KeyError, TypeError) as exc:
        raise LockError(f"lock file {path} is malformed: {exc}") from None


def _iso(commit: git.Commit) -> str:
    return commit.committed_datetime.isoformat()


def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def _git_message(exc: git.GitCommandError) -> str:
    """git's own words, without the command line GitPython wraps them in."""
    text = exc.stderr if isinstance(exc.stderr, str) else str(exc)
    lines = [ln.strip().removeprefix("stderr:").strip(" '") for ln in text.splitlines()]
    lines = [ln for ln in lines if ln and not ln.startswith("hint:")]
    fatal = [ln for ln in lines if ln.startswith(("fatal:", "error:"))]
    message = (fatal or lines or [str(exc)])[0]
    if "timed out" in str(exc).lower() or exc.status == -9:
        message = f"git gave no answer in {FETCH_TIMEOUT_S} s: unreachable"
    return f"git fetch failed: {message}"
