"""Build a class for batch tests: student git repos from the fixtures, and a roster.

Each repo is `good` overlaid with a fixture (as conftest.build_submission does), committed
with the dates given, so deadline pinning can be tested on real history.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

FIXTURES = Path(__file__).parent / "fixtures"
DEFAULT_DATE = "2025-01-10T12:00:00+00:00"


def git(repo: Path, *args: str, date: str = DEFAULT_DATE) -> str:
    env = dict(os.environ, GIT_AUTHOR_NAME="student", GIT_AUTHOR_EMAIL="student@example.edu", GIT_COMMITTER_NAME="student",
               GIT_COMMITTER_EMAIL="student@example.edu", GIT_AUTHOR_DATE=date, GIT_COMMITTER_DATE=date)
    return subprocess.run(["git", *args], cwd=repo, env=env, check=True, capture_output=True, text=True).stdout.strip()


def make_repo(dest: Path, fixture: str = "good", date: str = DEFAULT_DATE, branch: str = "main") -> Path:
    """A student repo with one commit holding `good` overlaid with `fixture`."""
    dest.mkdir(parents=True)
    git(dest, "init", "-q", "-b", branch)
    shutil.copytree(FIXTURES / "good", dest, dirs_exist_ok=True)
    if fixture != "good":
        shutil.copytree(FIXTURES / fixture, dest, dirs_exist_ok=True)
    commit(dest, "submission", date)
    return dest


def commit(repo: Path, message: str, date: str) -> str:
    git(repo, "add", "-A", date=date)
    git(repo, "commit", "-q", "--allow-empty", "-m", message, date=date)
    return git(repo, "rev-parse", "HEAD")


def overlay(repo: Path, fixture: str) -> None:
    """Put a fixture's files over the repo's (a later, different submission)."""
    shutil.copytree(FIXTURES / fixture, repo, dirs_exist_ok=True)


def make_class(root: Path, students: dict[str, str], extra_rows: list[str] = ()) -> Path:
    """Repos under root/repos (one per student: name -> fixture) and root/roster.csv,
    alternating local paths and file:// URLs; `extra_rows` are written as they are."""
    lines = ["student,repo"]
    for i, (name, fixture) in enumerate(students.items()):
        repo = make_repo(root / "repos" / name, fixture)
        lines.append(f"{name},{repo.as_uri() if i % 2 else 'repos/' + name}")
    lines += list(extra_rows)
    roster = root / "roster.csv"
    roster.write_text("\n".join(lines) + "\n")
    return roster


def unmarked(column: str) -> str:
    """A gradebook column's name without the mark of an incomplete grade (grader.batch.exporters):
    'vector_add (partial run, CPU only)' -> 'vector_add', 'total (CPU only)' -> 'total'."""
    for mark in (" (partial run, CPU only)", " (partial run)", " (CPU only)"):
        if column.endswith(mark):
            return column.removesuffix(mark)
    return column
