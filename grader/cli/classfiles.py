"""What the TA's class commands read besides their flags: course.toml (grader.batch.course),
and the lock a graded class folder was graded from."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

from grader import spec as specs
from grader.cli.common import UsageError
from grader.cli.common import fail as _fail


def load_course_or_fail(path: Optional[Path], catalogue: specs.Course):
    """course.toml (--course, or the course root's), or an empty course; exit 2 if it is bad.
    `catalogue`: the course folder (grader.spec.Course) whose assignments it may name."""
    from grader.batch.course import CourseError, find_course

    try:
        return find_course(path, catalogue)
    except CourseError as exc:
        _fail(exc)


def class_lock(class_dir: Path):
    """The lock a graded class folder was graded from (its batch.json names it)."""
    from grader.batch.store import MANIFEST, read_json
    from grader.batch.workspace import LockError, read_lock

    manifest = read_json(class_dir / MANIFEST)
    if not manifest or not manifest.get("lock"):
        _fail(UsageError(f"{class_dir}: not a class folder graded by grader grade (no {MANIFEST})"))
    try:
        return read_lock(Path(manifest["lock"])), manifest
    except LockError as exc:
        _fail(exc)
