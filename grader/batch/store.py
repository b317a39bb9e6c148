"""The class folder (`grader grade --out`): where each job's record, each student's
results.json and report.html, and the batch's manifest live, and how they are written.

OUT/students/<student>/jobs/<assignment>.json is a job's record, written atomically the moment
the job ends; a kept infra_error attempt goes beside a real grade (<assignment>.infra_error.json),
never over it. A student's results.json and report.html are rebuilt from the records under the
student's lock, so writers in several job processes never interleave. A record's result is
`AssignmentResult.to_json()`, read back with `AssignmentResult.from_json()` (grader.results):
the one matched pair, so the student's files hold all that `grader check` shows.
"""

from __future__ import annotations

import errno
import json
import os
from pathlib import Path

from grader.batch import reviews
from grader.batch.record import RECORD_FORMAT, JobRecord, RecordError
from grader.payloads import Kind
from grader.results import AssignmentResult, FileLock, Outcome, RunResult, TestResult, write_json_atomic
from grader.safefiles import UnsafeFileError, read_plain

MANIFEST = "batch.json"  # the class folder's seed, assignments, lock and runs
LATE_NOTES = "late.json"  # a student's lateness explanations (grader.batch.classview writes them)
GRADES = "grades.json"  # a student's course grades as the class view computed them (grader.batch.grades)
MAX_RECORD = 64 << 20  # a job's stored record, the manifest; more is no file of ours
MAX_NOTES = 1 << 20  # a student's late notes


def student_dir(out: Path, folder: str) -> Path:
    return Path(out) / "students" / folder


def record_path(out: Path, folder: str, assignment: str) -> Path:
    return student_dir(out, folder) / "jobs" / f"{assignment}.json"


def failed_path(out: Path, folder: str, assignment: str) -> Path:
    return student_dir(out, folder) / "jobs" / f"{assignment}.infra_error.json"


def log_path(out: Path, folder: str, assignment: str) -> Path:
    return student_dir(out, folder) / "logs" / f"{assignment}.log"


def read_back(path: Path, limit: int = MAX_RECORD):
    """The JSON of a file the class folder keeps (a record, the manifest, late notes), read as
    input (grader.safefiles.read_plain: never through a link, never blocking on a FIFO, nothing
    but a regular file, at most `limit` bytes); None where there is no such file. UnsafeFileError
    (an OSError: one line that says what it is) or ValueError (not JSON) where it cannot be used."""
    try:
        return json.loads(read_plain(path, limit))
    except FileNotFoundError:
        return None
    except UnsafeFileError as exc:
        if exc.errno == errno.ENOENT:
            return None
        raise


def read_json(path: Path, limit: int = MAX_RECORD):
    """`read_back`, None for anything that cannot be used (the caller's default stands)."""
    try:
        return read_back(path, limit)
    except (OSError, ValueError):
        return None


def read_record(path: Path) -> JobRecord | None:
    """The record stored at `path`; None where there is none (no file, not JSON, not a record
    of ours: another format); RecordError where it is one but malformed, or where the file is
    no plain file (a link, a FIFO, a device, too large: `read_back`)."""
    try:
        data = read_back(path)
    except ValueError:
        return None
    except OSError as exc:
        raise RecordError(f"{Path(path).parent.name}/{exc}") from None
    if not isinstance(data, dict) or data.get("format") != RECORD_FORMAT:
        return None
    return JobRecord.from_json(data, where=str(path))


def read_records(out: Path, folder: str) -> dict[str, JobRecord]:
    """A student's stored records by assignment (the kept infra_error attempts aside); a
    malformed one is a RecordError that names its file."""
    jobs = student_dir(out, folder) / "jobs"
    records = {}
    for path in sorted(jobs.glob("*.json")) if jobs.is_dir() else []:
        if path.name.startswith(".") or path.name.endswith(".infra_error.json"):
            continue
        try:
            record = read_record(path)
        except RecordError:
            if os.path.islink(path) or not path.is_file() or path.stat().st_size > MAX_RECORD:
                continue  # no file of ours (--resume said so): a malformed record of ours is still said
            raise
        if record is not None:
            records[record.assignment] = record
    return records


def is_reusable(record: JobRecord | None, key: dict) -> bool:
    return record is not None and record.status == "graded" and record.key == key


def store_record(out: Path, record: JobRecord) -> Path:
    """Write a job's record, unless it is an infra_error and a real grade is already there:
    then it is kept beside it. Then rebuild the student's results.json and report.html."""
    out = Path(out)
    folder, assignment = record.folder, record.assignment
    with FileLock(student_dir(out, folder) / ".lock"):
        path = record_path(out, folder, assignment)
        existing = read_json(path)
        if record.status == "infra_error" and isinstance(existing, dict) and existing.get("status") == "graded":
            path = failed_path(out, folder, assignment)
        elif record.status == "graded":
            failed_path(out, folder, assignment).unlink(missing_ok=True)
        write_json_atomic(record.to_json(), path)
        write_student(out, folder)
    return path


def student_run(records: dict[str, JobRecord], order: list[str]) -> RunResult | None:
    """The student's assignments as one RunResult (what `grader check` would have written)."""
    if not records:
        return None
    ranked = sorted(records.values(),
                    key=lambda r: (order.index(r.assignment) if r.assignment in order else len(order), r.assignment))
    first = ranked[0]
    run = RunResult(first.repo or first.student, first.seed, first.environment or {}, commit=first.commit)
    for r in ranked:
        if r.result:
            run.assignments.append(AssignmentResult.from_json(r.result))
        else:
            a = AssignmentResult(r.assignment, r.assignment, "")
            a.tests.append(TestResult(r.assignment, Kind.CORRECTNESS, "grading", Outcome.INFRA_ERROR,
                                      f"not graded: {r.error or 'the grader failed'} "
                                      "(it is retried on the next --resume)"))
            run.assignments.append(a)
    return run


def repair_students(out: Path, folders: list[str]) -> None:
    """Rewrite a student's results.json and report.html where a record, or the review log for a
    student it reviews, is newer (a process killed between writing one and the reports)."""
    log = reviews.log_path(out)
    reviewed = reviews.read(out).folders() if log.is_file() else set()
    for folder in folders:
        records = list((student_dir(out, folder) / "jobs").glob("*.json"))
        report = student_dir(out, folder) / "results.json"
        sources = records + ([log] if folder in reviewed else [])
        if records and (not report.is_file() or report.stat().st_mtime < max(p.stat().st_mtime for p in sources)):
            try:
                with FileLock(student_dir(out, folder) / ".lock"):
                    write_student(out, folder)
            except Exception:  # one student's report: the class view (built from the records) is still written
                pass


def rewrite_student(out: Path, folder: str) -> None:
    """write_student under the student's lock (the class view's late notes changed)."""
    with FileLock(student_dir(out, folder) / ".lock"):
        write_student(out, folder)


def write_student(out: Path, folder: str) -> None:
    from grader.report import render
    from grader.results import write_text_atomic

    records = read_records(out, folder)
    run = student_run(records, sorted(records))  # by assignment name, as the course's catalogue lists them
    if run is None:
        return
    folder_path = student_dir(out, folder)
    late = late_notes(folder_path)
    gradebook = course_grades(folder_path)
    log = reviews.read(out)
    for a in run.assignments:
        # a TA's decision on this grade, or a stale one said
        reviews.apply(a, log.latest(folder, a.name), records.get(a.name))
        if a.name in late:
            a.notes.append(late[a.name])
    write_json_atomic(run.to_gradescope(gradebook), folder_path / "results.json")
    write_text_atomic(render(run, gradebook=gradebook), folder_path / "report.html")


def late_notes(folder: Path) -> dict[str, str]:
    """What the class view wrote of a student's lateness, for the report (empty if nothing)."""
    notes = read_json(Path(folder) / LATE_NOTES, MAX_NOTES)
    return {k: v for k, v in notes.items() if isinstance(k, str) and isinstance(v, str)} \
        if isinstance(notes, dict) else {}


def course_grades(folder: Path) -> dict[str, dict]:
    """The student's course grades the class view wrote (grader.batch.grades.CourseGrade.to_json, by
    assignment): course.toml's points, a review and the late penalty applied. Empty where none."""
    data = read_json(Path(folder) / GRADES)
    if not isinstance(data, dict):
        return {}
    number = (int, float, type(None))
    return {a: g for a, g in data.items()
            if isinstance(g, dict) and isinstance(g.get("final"), number) and isinstance(g.get("out_of"), number)}
