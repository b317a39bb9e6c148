"""Workspace: every student's repo cloned or updated into a cache, and a lock file that pins
the commit that is graded.

`grader fetch` fills WORKDIR/repos/<student> (GitPython: init + fetch, so a first clone and an
update are one path) and writes WORKDIR/lock.json. A student whose repo cannot be fetched (bad
URL, unreachable host, empty repo, missing branch, nothing before the deadline) is `unfetched`
in the lock with the reason, and the others go on. Grading reads only the lock, so a class is
graded at exactly the commits pinned, however often it is graded again.

With a deadline, the pinned commit is the last one whose commit date is not after it. Commit
dates are written by the student's machine and can be set at will: the lock and the reports
say so, and the pinned commit is what counts. They are read from the commit's own bytes
(`commit_date`), never through a parser that can fail on them: a date beyond the years 1-9999,
a time zone like +9959 or a header that names no date is one student's note, never a crash.

One student never stops the class: whatever a repo holds (no commits, a corrupt object, an
odd branch name, any date), `fetch_roster` gives that student an `unfetched` line with the
reason, pins everyone else, and always writes the lock.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from collections import defaultdict
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field, replace
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Callable

import git

from grader.batch.course import (  # LATEST: with EARLIEST, the dates a lock can hold: datetime's years 1-9999
    LATEST,
    FetchLimits,
)
from grader.batch.roster import RosterEntry
from grader.results import write_json_atomic

LOCK_NAME = "lock.json"
DATE_WARNING = ("Commit dates are set by the student's own machine and can be forged; the pinned commit is what is "
                "graded (check push times on the forge where a deadline dispute matters).")
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
    lms: dict = field(default_factory=dict)  # the roster's LMS identities (grader.batch.roster.LMS_COLUMNS)
    passed_over: str = ""  # where the commit graded is not the head: which, why, and what was not graded

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
        raise ValueError(f"--deadline {text!r} is not an ISO 8601 date and time, "
                         f"e.g. 2025-03-01T23:59:00-05:00") from None
    if when.tzinfo is None:
        raise ValueError(f"--deadline {text!r} has no time zone: add one, e.g. {text}-05:00 or {text}Z")
    return when


def fetch_roster(entries: list[RosterEntry], workdir: Path, deadline: datetime | None = None, branch: str | None = None,
                 jobs: int = 4, roster: Path | None = None, progress: Callable[[Pinned], None] | None = None,
                 per_student: Callable[[str], tuple[datetime | None, datetime | None]] | None = None,
                 limits: FetchLimits = FetchLimits()) -> Lock:
    """Fetch every student (`jobs` at a time: clones wait on the network) and write the lock.
    `per_student(student)` gives (deadline, cutoff) where they differ by student (course.toml's
    extensions and late policy): the commit pinned is the last dated on or before the cutoff.
    `limits`: the largest checkout written (course.toml's [fetch]); a repo over them is not graded."""
    workdir = Path(workdir).resolve()
    (workdir / "repos").mkdir(parents=True, exist_ok=True)
    budget = ClassBudget(limits.class_bytes)

    def one(entry: RosterEntry) -> Pinned:
        try:
            mine, cutoff = per_student(entry.student) if per_student else (deadline, None)
            pinned = budget.fetch(entry, workdir, lambda cap: fetch_one(entry, workdir, mine, branch, cutoff,
                                                                      replace(limits, clone_bytes=cap)), limits)
            if mine is not None and pinned.status == "fetched":
                pinned.deadline, pinned.cutoff = mine.isoformat(), cutoff.isoformat() if cutoff else None
        except Exception as exc:  # a surprise of one student's: that student's line, never the others' pins or the lock
            pinned = Pinned(entry.student, entry.repo, "unfetched", reason=_unreadable(exc), name=entry.name,
                            github_username=entry.github_username, lms=dict(entry.lms))
        if progress:
            try:
                progress(pinned)
            except Exception:  # a line that could not be shown costs nothing of the lock
                pass
        return pinned

    with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
        students = list(pool.map(one, entries))
    lock = Lock(students, _now(), deadline.isoformat() if deadline else None, str(roster) if roster else None,
                DATE_WARNING if deadline else None, workdir)
    write_json_atomic(lock.to_json(), workdir / LOCK_NAME)
    return lock


class ClassBudget:
    """The class's disk as a whole ([fetch] max_class_mb, --max-class-mb): each student's fetch
    reserves what it may take (its clone's bound and its checkout's, or what is left of the
    class's), gives back what it did not use, and a student for whom nothing is left is not
    fetched, with the reason. Repos fetched at once never pass the total together."""

    def __init__(self, total: int) -> None:
        import threading

        self.total, self.used, self.lock = total, 0, threading.Lock()

    def fetch(self, entry: RosterEntry, workdir: Path, fetch: Callable[[int], Pinned], limits: FetchLimits) -> Pinned:
        """`fetch(cap)` with the clone bounded by `cap`, within what is left of the class's budget."""
        dest = workdir / "repos" / entry.folder
        why = (f"not fetched: the class's disk budget ({_mib(self.total)}, course.toml's [fetch] max_class_mb or "
               f"--max-class-mb) is used by the students fetched before")
        with self.lock:
            claim = max(0, min(limits.clone_bytes + limits.checkout_bytes, self.total - self.used))
            self.used += claim
        size = 0
        try:
            if claim == 0:
                return _unfetched(entry, why)
            pinned = fetch(min(limits.clone_bytes, claim))
            size = _disk_bytes(dest) if pinned.status == "fetched" else 0
            if size > claim:  # its checkout took what was left
                shutil.rmtree(dest, ignore_errors=True)
                size = 0
                return _unfetched(entry, f"{why} ({_mib(claim)} was left for it)")
            if pinned.status != "fetched" and claim < limits.clone_bytes and TOO_LARGE in pinned.reason:
                pinned.reason = f"{why} ({_mib(claim)} was left for it)"
            return pinned
        finally:
            with self.lock:
                self.used += size - claim


def _unfetched(entry: RosterEntry, reason: str) -> Pinned:
    return Pinned(entry.student, entry.repo, "unfetched", reason=reason, name=entry.name,
                  github_username=entry.github_username)


def fetch_one(entry: RosterEntry, workdir: Path, deadline: datetime | None, branch: str | None,
              cutoff: datetime | None = None, limits: FetchLimits = FetchLimits()) -> Pinned:
    base = Pinned(entry.student, entry.repo, "unfetched", name=entry.name, github_username=entry.github_username,
                  lms=dict(entry.lms))
    if entry.problem or not entry.repo:
        base.reason = entry.problem or "no repository"
        return base
    dest = workdir / "repos" / entry.folder
    repo = None
    try:
        _check_url(entry.repo)
        # the pin needs history only to find the last commit before a deadline or the roster's own commit
        repo = _fetch(entry.repo, dest, limits.clone_bytes, shallow=deadline is None and not entry.commit)
        pinned = _pin(repo, entry, deadline, branch, cutoff)
        check_size(repo, pinned.commit, limits)  # from the objects, before a byte is checked out
        _checkout(repo, pinned.commit)
    except FetchError as exc:
        base.reason = _printable(str(exc))
        return base
    except git.GitCommandError as exc:
        base.reason = _printable(_git_message(exc))
        return base
    except Exception as exc:  # anything else a hostile repo makes GitPython or git raise: this student's reason
        base.reason = _unreadable(exc)
        return base
    finally:
        if repo is not None:
            repo.close()  # its cat-file processes: a class of 500 does not keep 500 of them
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


# git run with its files bounded: a write past the limit fails (EFBIG, "File too large") instead of
# filling the disk; with fetch.unpackLimit=1 every fetch is kept as one pack, so the limit bounds it whole
BOUNDED_GIT = ("import os, resource, signal, sys; signal.signal(signal.SIGXFSZ, signal.SIG_IGN); "
               "resource.setrlimit(resource.RLIMIT_FSIZE, (int(sys.argv[1]), int(sys.argv[1]))); "
               "os.execvp(sys.argv[2], sys.argv[2:])")


def _fetch(url: str, dest: Path, clone_bytes: int = FetchLimits().clone_bytes, shallow: bool = False) -> git.Repo:
    """Clone or update: a cache folder from an earlier fetch is reused if it is sound. The whole
    clone is bounded, not only the checkout (history can hold what the head deleted): each fetch's
    pack may not pass `clone_bytes` (the write fails, never the disk), nor the clone in all; a
    repository over it is removed and FetchError says so. `shallow`: only each branch's head is
    fetched (--depth 1), where the pin needs no history (no deadline, no commit of the roster's):
    a large history behind a small tree costs nothing; a shallow clone fetched again for a pin
    that needs its history is made whole (--unshallow)."""
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
    over = FetchError(f"{TOO_LARGE} (more than {_mib(clone_bytes)} of git history; course.toml's [fetch] "
                      "max_clone_mb sets the limit)")
    with repo.git.custom_environment(**_git_env()):
        try:
            git_cmd = git.Git.GIT_PYTHON_GIT_EXECUTABLE or "git"
            depth = ["--depth", "1"] if shallow else ["--unshallow"] if (dest / ".git" / "shallow").exists() else []

            def fetch(depth: list[str]) -> None:
                repo.git.execute([sys.executable, "-I", "-c", BOUNDED_GIT, str(clone_bytes), git_cmd,
                                  "-c", "fetch.unpackLimit=1", "-c", "transfer.unpackLimit=1", "fetch", "--prune",
                                  "--no-tags", *depth, "origin", "+refs/heads/*:refs/remotes/origin/*"],
                                 kill_after_timeout=FETCH_TIMEOUT_S)

            try:
                fetch(depth)
            except git.GitCommandError as exc:
                # git refuses a shallow fetch of a repository with no commit at all (exit 1, nothing said):
                # fetched whole, an empty one fetches nothing and is named as empty when it is pinned
                if not shallow or "File too large" in str(exc.stderr):
                    raise
                fetch([])
        except git.GitCommandError as exc:
            if "File too large" in str(exc.stderr):
                repo.close()
                shutil.rmtree(dest, ignore_errors=True)
                raise over from None
            raise
    if _disk_bytes(dest / ".git") > clone_bytes:  # several fetches, each under the limit
        repo.close()
        shutil.rmtree(dest, ignore_errors=True)
        raise over
    return repo


def _disk_bytes(folder: Path) -> int:
    """The bytes of the files under `folder`, links not followed. A loop over a stack of folders, not
    os.walk, which recurses on Python 3.11 and before: a student's checkout 1,200 folders deep would
    raise RecursionError."""
    total, stack = 0, [os.fspath(folder)]
    while stack:
        try:
            with os.scandir(stack.pop()) as entries:
                for entry in entries:
                    try:
                        if entry.is_dir(follow_symlinks=False):
                            stack.append(entry.path)
                        else:
                            total += entry.stat(follow_symlinks=False).st_size
                    except OSError:
                        pass
        except OSError:
            pass
    return total


def _branches(repo: git.Repo) -> list[str]:
    """The branches fetched (a name that is not UTF-8 is held with surrogate escapes, as GitPython reads it)."""
    return sorted(r.remote_head for r in repo.remotes.origin.refs if r.remote_head != "HEAD")


def _default_branch(repo: git.Repo, branches: list[str]) -> str:
    try:
        with repo.git.custom_environment(**_git_env()):
            out = str(repo.git.ls_remote("--symref", "origin", "HEAD", kill_after_timeout=FETCH_TIMEOUT_S))
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
    deadline, or with a late policy the end of its acceptance window), else the head. Dates
    are compared as the commits' own seconds since 1970 (`commit_dates`), whatever they are."""
    branches = _branches(repo)
    if not branches:
        raise FetchError("the repository is empty: no commit has been pushed")
    if branch and branch not in branches:
        raise FetchError(f"branch {branch!r} not found (branches: {', '.join(map(_printable, branches))})")
    branch = branch or _default_branch(repo, branches)
    if _printable(branch) != branch:
        raise FetchError(f"its branch {_printable(branch)!r} is not named in UTF-8 text: ask for a branch with a plain "
                         f"name")
    head = _commit_of(repo, f"refs/remotes/origin/{branch}", f"the head of branch {branch!r} is not a commit")
    p = Pinned(entry.student, entry.repo, "fetched", branch=branch, head=head, name=entry.name,
               github_username=entry.github_username, lms=dict(entry.lms))
    if entry.commit:
        chosen = _commit_of(repo, entry.commit,
                            f"commit {entry.commit} (pinned by the roster) is not in the repository")
        dates = commit_dates(repo, [head, chosen])
        p.notes.append(f"Graded at commit {chosen[:12]}, pinned by the roster.")
        if chosen != head:
            p.passed_over = (f"the branch head {head[:12]} ({dates[head].shown}) is not graded: the roster pins "
                             f"commit {chosen[:12]}")
    elif deadline is not None:
        limit = cutoff or deadline
        what = "the deadline" if cutoff is None else "the end of the late period"
        history = repo.git.rev_list(head, kill_after_timeout=FETCH_TIMEOUT_S).split()
        dates = commit_dates(repo, history)
        on_time = [c for c in history if not dates[c].after(limit)]
        if not on_time:
            raise FetchError(f"no commit on {branch!r} is dated on or before {what} {limit.isoformat()} "
                             f"(the first is dated {dates[history[-1]].shown})")
        # ties: the first in git's order (a commit on time has a date: an unreadable one counts as late)
        chosen = max(on_time, key=lambda c: dates[c].timestamp or 0)
        after = repo.git.rev_list(f"{chosen}..{head}", kill_after_timeout=FETCH_TIMEOUT_S).split()
        late = [c for c in after if dates[c].after(limit)]
        # made after the commit graded (its descendants) yet dated before it: the machines' clocks disagree
        skewed = [c for c in after if not dates[c].after(limit)]
        p.late_commits = len(late)
        p.notes.append(f"Graded at commit {chosen[:12]} ({dates[chosen].shown}), the last one dated on or before "
                       f"{what} {limit.isoformat()}" + (f" (deadline {deadline.isoformat()})" if cutoff else "") + ". "
                       + DATE_WARNING)
        if p.late_commits:
            p.notes.append(f"{p.late_commits} commit(s) dated after {what} were not graded.")
        if skewed:
            p.notes.append(f"{len(skewed)} commit(s) made after it but dated before it (the clocks disagree) were "
                           f"not graded; none counts as late.")
        if chosen != head:
            why = (f"it is dated after {what}" if head in late else
                   f"it is dated before commit {chosen[:12]} ({dates[chosen].shown}), which it follows: the clocks of "
                   f"the machines that made them disagree, and the commit graded is the last one dated on or before "
                   f"{what}")
            listed = ", ".join(f"{c[:12]} ({dates[c].shown})" for c in after[:5])
            p.passed_over = (f"the branch head {head[:12]} ({dates[head].shown}) is not graded: {why}; passed over: "
                             f"{len(after)} commit(s), {listed}" + (" ..." if len(after) > 5 else ""))
            p.notes.append(f"Not HEAD: {p.passed_over}.")
    else:
        chosen = head
        dates = commit_dates(repo, [head])
    p.commit, p.commit_date, p.head_date = chosen, dates[chosen].iso, dates[head].iso
    if dates[chosen].note:
        p.notes.append(f"Commit {chosen[:12]}: {dates[chosen].note}")
    if deadline is not None:
        p.late = dates[chosen].after(deadline) or (cutoff is None and p.late_commits > 0)
    return p


def _commit_of(repo: git.Repo, rev: str, missing: str) -> str:
    """The commit `rev` names, as a hex sha; FetchError(missing) if it names none (a branch may
    point at a tree or a blob)."""
    try:
        sha = repo.git.rev_parse("--verify", "--quiet", f"{rev}^{{commit}}")
    except git.GitCommandError:
        raise FetchError(_printable(missing)) from None
    if not re.fullmatch(r"[0-9a-f]{40}|[0-9a-f]{64}", sha):
        raise FetchError(_printable(missing))
    return sha


EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)
EARLIEST = datetime(1, 1, 1, tzinfo=timezone.utc)
HEADER_BYTES = 64 * 1024  # of a commit object, read for its date; the rest (a message of any size) is skipped
_DATE = re.compile(rb"\s*(-?)(\d+)(?:\s+([+-])(\d\d)(\d\d)(?!\d))?")


@dataclass(frozen=True)
class CommitDate:
    """A commit's committer date as its own bytes give it. `timestamp` orders commits (any
    integer: seconds since 1970, in UTC whatever the offset says); None when the commit names no
    date (then it counts as later than any deadline). `iso` is what a lock holds: in the commit's
    offset where that is a real one (under 24 h), else in UTC; years 1-9999 (beyond, clamped).
    `note` says what was odd, for the TA and the student."""

    timestamp: int | None
    iso: str | None
    note: str = ""

    def after(self, limit: datetime) -> bool:
        return self.timestamp is None or self.timestamp > limit.timestamp()

    @property
    def shown(self) -> str:
        return self.iso or "no readable date"


UNREADABLE = CommitDate(None, None, "its commit date cannot be read: it counts as later than any deadline.")


def parse_commit_date(raw: bytes) -> CommitDate:
    """The committer date of a raw commit object (its header lines, up to the first blank line)."""
    headers = raw.split(b"\n\n", 1)[0].split(b"\n")
    line = next((h for h in headers if h.startswith(b"committer ")), None)
    if line is None or b">" not in line:
        return UNREADABLE
    m = _DATE.match(line.rsplit(b">", 1)[1])
    if not m:
        return UNREADABLE
    sign, digits, tz_sign, hh, mm = m.groups()
    notes = []
    timestamp = int(digits[:40]) if len(digits) <= 40 else 10**40  # beyond any date either way
    timestamp = -timestamp if sign else timestamp
    offset = timezone.utc
    if tz_sign is None:
        notes.append("its time zone cannot be read: shown in UTC.")
    elif int(hh) * 60 + int(mm) >= 24 * 60 or int(mm) >= 60:
        notes.append(f"its time zone {(tz_sign + hh + mm).decode()} is not a real offset: shown in UTC.")
    else:
        minutes = int(hh) * 60 + int(mm)
        offset = timezone(timedelta(minutes=-minutes if tz_sign == b"-" else minutes))
    try:
        when = EPOCH + timedelta(seconds=timestamp)
    except OverflowError:
        when = LATEST if timestamp > 0 else EARLIEST
        seconds = f"{timestamp} seconds from 1970" if len(digits) <= 40 else f"a number of {len(digits)} digits"
        notes.append(f"its date ({seconds}) is outside the years 1-9999: shown as {when.isoformat()}"
                     + (" (later than any deadline)." if timestamp > 0 else "."))
    else:
        try:
            when = when.astimezone(offset)
        except OverflowError:  # near the ends of the calendar, in an offset that crosses them
            pass
    return CommitDate(timestamp, when.isoformat(), " ".join(notes))


def commit_dates(repo: git.Repo, shas: list[str]) -> dict[str, CommitDate]:
    """Each commit's date, read from its own bytes through one `git cat-file --batch` (at most
    HEADER_BYTES of each: a commit of a gigabyte costs no memory). A commit git cannot read is
    UNREADABLE. The mapping answers UNREADABLE for a sha it does not hold."""
    dates: dict[str, CommitDate] = {}
    env = dict(os.environ, **_git_env())
    with subprocess.Popen(["git", "cat-file", "--batch"], cwd=repo.working_dir, stdin=subprocess.PIPE,
                          stdout=subprocess.PIPE,
                          stderr=subprocess.DEVNULL, env=env) as proc:
        assert proc.stdin is not None and proc.stdout is not None  # both pipes
        try:
            for sha in dict.fromkeys(shas):
                proc.stdin.write(sha.encode() + b"\n")
                proc.stdin.flush()
                header = proc.stdout.readline(256).split()
                if len(header) != 3 or header[1] != b"commit" or not header[2].isdigit():
                    if not header:  # git stopped (a corrupt object): the rest are unreadable too
                        break
                    continue
                size = int(header[2])
                head = proc.stdout.read(min(size, HEADER_BYTES))
                left = size - len(head)
                while left > 0:
                    chunk = proc.stdout.read(min(left, 1 << 20))
                    if not chunk:
                        break
                    left -= len(chunk)
                proc.stdout.read(1)  # the newline after each object
                dates[sha] = parse_commit_date(head)
        except (OSError, ValueError):
            pass
        finally:
            proc.kill()
    return defaultdict(lambda: UNREADABLE, dates)


TOO_LARGE = "not graded: the repository is larger than the course allows"


def check_size(repo: git.Repo, commit: str | None, limits: FetchLimits) -> None:
    """FetchError if the checkout of `commit` would pass `limits`: its files counted and sized
    from the commit's trees (`git ls-tree -r -l`, streamed and stopped at the first limit passed),
    so a blob of a gigabyte, or a million small files, is refused before anything is written."""
    if commit is None:
        return
    proc = subprocess.Popen(["git", "ls-tree", "-r", "-l", "-z", "--full-tree", commit], cwd=repo.working_tree_dir,
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=dict(os.environ, **_git_env()))
    assert proc.stdout is not None  # a pipe
    stdout = proc.stdout
    files = total = 0
    over = None
    buffer = b""
    try:
        for chunk in iter(lambda: stdout.read(1 << 16), b""):
            buffer += chunk
            *entries, buffer = buffer.split(b"\0")
            for entry in entries:
                meta = entry.split(b"\t", 1)[0].split()
                if len(meta) != 4 or meta[1] != b"blob":
                    continue  # a submodule's commit, never checked out
                size = int(meta[3]) if meta[3].isdigit() else 0
                files, total = files + 1, total + size
                if size > limits.file_bytes:
                    over = f"a file of {_mib(size)}; at most {_mib(limits.file_bytes)} per file"
                elif files > limits.files:
                    over = f"more than {limits.files} files"
                elif total > limits.checkout_bytes:
                    over = f"more than {_mib(limits.checkout_bytes)} of files"
                if over:
                    break
            if over:
                break
    finally:
        proc.kill()
        proc.wait()
    if over:
        raise FetchError(f"{TOO_LARGE} ({over}; course.toml's [fetch] sets the limits)")


def _mib(n: int) -> str:
    return f"{n / (1 << 20):.0f} MiB" if n < 1 << 30 else f"{n / (1 << 30):.1f} GiB"


def _checkout(repo: git.Repo, commit: str | None) -> None:
    repo.git.checkout("--force", "--detach", commit, kill_after_timeout=FETCH_TIMEOUT_S)
    repo.git.clean("-ffdxq", kill_after_timeout=FETCH_TIMEOUT_S)


def ensure_checkout(lock: Lock, p: Pinned) -> Path:
    """The checkout at the pinned commit (a TA may have poked around in the cache)."""
    path = lock.checkout(p)
    repo = git.Repo(path)
    if repo.head.commit.hexsha != p.commit or repo.is_dirty(untracked_files=True):
        _checkout(repo, p.commit)
    return path


LOCK_LIMIT = 64 << 20  # a class's lock.json: a pin per student


def read_lock(path: Path) -> Lock:
    path = Path(path)
    if path.is_dir():
        path = path / LOCK_NAME
    if not path.is_file():
        raise LockError(f"lock file {path}: no such file (write one with `grader fetch`)")
    try:
        from grader.safefiles import read_plain

        data = json.loads(read_plain(path, LOCK_LIMIT))  # read as input: bounded, never through a link
        students = [Pinned(**s) for s in data["students"]]
        return Lock(students, data["created"], data.get("deadline"), data.get("roster"), data.get("warning"),
                    path.parent.resolve())
    except OSError as exc:
        raise LockError(f"lock file {path} cannot be read: {exc}") from None
    except (ValueError, KeyError, TypeError) as exc:
        raise LockError(f"lock file {path} is malformed: {exc}") from None


def _printable(text: str) -> str:
    """Text whose bytes were not UTF-8 (a branch name, git's words), with each such byte shown
    as U+FFFD: it can be written to a lock, a page or a terminal."""
    return text.encode("utf-8", "surrogateescape").decode("utf-8", "replace")


def _unreadable(exc: BaseException) -> str:
    """One line that says why a repo could not be pinned, from an exception nobody expected."""
    text = " ".join(_printable(str(exc)).split())
    return f"the repository could not be read: {type(exc).__name__}" + (f": {text[:300]}" if text else "")


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
