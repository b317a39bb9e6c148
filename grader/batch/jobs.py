"""A job: one student and one assignment (`grader.judge.grade.grade_assignment`) under the
batch's grading context, run by an executor (`grader.batch.executors`: a pool of job processes,
`python -m grader.batch.jobs`, or Ray); its key, its record, and the job process itself. With
several GPUs, each pool slot owns one (CUDA_VISIBLE_DEVICES); timing phases hold their GPU
alone (`grader.judge.devicelock`).

Nothing is lost:
- each job process writes its record atomically the moment the job ends
  (OUT/students/<student>/jobs/<assignment>.json), then that student's results.json and
  report.html; the class view is rebuilt from the records on disk;
- `--resume` skips a job whose record is a real grade with the same key: commit, spec and
  reference fingerprint, grader version, GPU model and the grading options (the seed included);
- an infra_error (our fault: the job process died, hung, or the grader raised) is retried, and
  never overwrites an earlier real grade (it is kept beside it, as <assignment>.infra_error.json);
- a job process dies with the grader (SIGKILL included: the kernel sends it SIGTERM), closes
  its workers and writes nothing, so the next `--resume` runs that job again.

`--executor ray` sends the same jobs to a Ray cluster: the student's code travels with the
task, the job runs in the sandboxed worker on the node it lands on, and the record comes back
to be stored here in the same layout.
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import sys
import time
import traceback
from dataclasses import MISSING, asdict, dataclass, field, fields
from datetime import datetime, timezone
from pathlib import Path
from typing import Callable

import grader
from grader.batch.record import JobRecord
from grader.batch.store import log_path, store_record
from grader.results import AssignmentResult, Outcome
from grader.settings import Settings, current


class JobError(ValueError):
    """A job sent to a job process that is not one (one line)."""


@dataclass
class Job:
    student: str
    folder: str  # the student's folder name under OUT/students
    assignment: str
    repo: str  # the checkout to grade (absolute path)
    repo_url: str | None
    commit: str | None
    key: dict  # what a stored grade must match to be reused by --resume
    out: str
    context: dict  # the batch's grading context (grader.judge.context.GradingContext.to_json), the same for every job
    gpu: str | None = None  # CUDA_VISIBLE_DEVICES for this job, set by the pool slot
    notes: list[str] = field(default_factory=list)
    attempt: str = ""
    tries: int = 0
    cache: str | None = None  # the run's grader.judge.runcache folder (this host); None: the job makes its own inputs

    @property
    def label(self) -> str:
        return f"{self.student}/{self.assignment}"

    @property
    def device(self) -> str:
        return self.context["device"]

    @property
    def seed(self) -> int:
        return self.context["seed"]

    def to_json(self) -> dict:
        return asdict(self)

    @classmethod
    def from_json(cls, data: object) -> "Job":
        """The job a pool or a Ray driver sent; JobError naming the field where `data` holds none."""
        if not isinstance(data, dict):
            raise JobError(f"a job is a JSON object, not {type(data).__name__}")
        names = {f.name: f for f in fields(cls)}
        unknown = sorted(set(data) - set(names))
        if unknown:
            raise JobError(f"a job has no field {unknown[0]!r}")
        for name, spec in names.items():
            if name not in data and spec.default is MISSING and spec.default_factory is MISSING:
                raise JobError(f"the job has no {name!r}")
            if name in data and not isinstance(data[name], _JOB_TYPES[name]):
                wanted = " or ".join("null" if k is _NONE else k.__name__ for k in _JOB_TYPES[name])
                raise JobError(f"the job's {name!r} must be {wanted}, not {type(data[name]).__name__}")
        return cls(**data)

    def grading_context(self):
        """The batch's context on this job's slot: its GPU and the run's cache."""
        from grader.judge.context import GradingContext

        return GradingContext.from_json(self.context).for_slot(self.gpu, self.cache)


_NONE = type(None)
_JOB_TYPES: dict[str, tuple[type, ...]] = {
    "student": (str,), "folder": (str,), "assignment": (str,), "repo": (str,), "repo_url": (str, _NONE),
    "commit": (str, _NONE), "key": (dict,), "out": (str,), "context": (dict,), "gpu": (str, _NONE), "notes": (list,),
    "attempt": (str,), "tries": (int,), "cache": (str, _NONE)}


def spec_fingerprint(spec, reference: Path) -> str:
    """sha256 of the assignment's spec.py and its reference kernel (both decide the grade), and of
    its hidden.py and the course secret (the hidden cases and the random shapes) where there are."""
    h = hashlib.sha256()
    hidden = Path(spec.folder) / "hidden.py"
    for part in (Path(spec.folder) / "spec.py", reference, *([hidden] if hidden.is_file() else [])):
        h.update(part.name.encode() + b"\0")
        h.update(part.read_bytes() if part.is_file() else b"<absent>")
    secret = spec.shapes_secret
    if secret:
        h.update(b"secret\0" + hashlib.sha256(secret.encode()).digest())
    return h.hexdigest()[:16]


def job_key(commit: str | None, spec, gpu_model: str, ctx) -> dict:
    """What a stored grade must match to be reused: the commit, the spec and reference, the
    grader's version, the GPU model and the grading options (grader.judge.context.GradingContext.key)."""
    return {"commit": commit, "spec": spec_fingerprint(spec, ctx.reference_module(spec)), "grader": grader.__version__,
            "gpu_model": gpu_model, "options": ctx.key()}


def now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def new_record(job: Job, status: str, error: str = "", result: AssignmentResult | None = None,
               environment: dict | None = None, started: float | None = None) -> JobRecord:
    finished = time.time()
    return JobRecord(
        student=job.student, folder=job.folder, assignment=job.assignment, status=status, error=error, key=job.key,
        attempt=job.attempt, commit=job.commit, repo=job.repo_url, seed=job.seed, gpu=job.gpu,
        environment=environment or {},
        started=datetime.fromtimestamp(started or finished, timezone.utc).isoformat(timespec="seconds"),
        finished=datetime.fromtimestamp(finished, timezone.utc).isoformat(timespec="seconds"),
        seconds=round(finished - (started or finished), 2),
        result=result.to_json() if result is not None else None,  # read back by AssignmentResult.from_json
    )


def _shown(log: Callable[[str], None]) -> Callable[[str], None]:
    """The job's log (a file a TA reads in a terminal) as text: a student's name, message or
    traceback with its control characters shown as escapes (grader.sanitize.for_terminal)."""
    from grader.sanitize import for_terminal

    return lambda text: log(for_terminal(text))


def execute(job: Job, log: Callable[[str], None] = print, sessions: dict | None = None, *,
            settings: Settings) -> JobRecord:
    """Grade one job here (the sandboxed worker is started from here) and return its record.
    Student failures are outcomes inside the result; only our own failures are infra_error.
    `sessions`: the grading sessions this process has opened, reused by a later job on the
    same context (a job server's); without it the job opens its own."""
    from grader.spec import CourseCodeError
    from grader.submission import SubmissionError, open_submission

    started = time.time()
    log = _shown(log)
    log(f"grading {job.label} at commit {job.commit or '-'} "
        f"({job.device}{'' if job.gpu is None else ' gpu ' + job.gpu}, seed {job.seed})")
    try:
        session = _session(job, sessions if sessions is not None else {}, settings)
        spec = session.course.get(job.assignment)
        graded_at = time.time()
        phases: dict[str, float] = {}
        try:
            sub = open_submission(Path(job.repo))
        except SubmissionError as exc:  # the student's grader.toml: graded, and the student is told why
            if not Path(job.repo).is_dir():
                raise  # the workspace's checkout is gone: ours
            result, env = session.not_gradable(spec, str(exc)), dict(session.environment)
        else:
            run = session.grade(sub, [spec], lambda step: log(f"  {step}"), phases)
            result, env = run.assignments[0], run.environment  # the record says which isolation ran, and the roofline
        result.notes[:0] = job.notes
    except CourseCodeError as exc:  # the course's: not retried, and the assignment's other jobs are not run
        log(f"the course's error: {exc}")
        record = new_record(job, "infra_error", str(exc), started=started)
        record.extra["course_error"] = True
        record.extra["course_error_stops"] = not exc.sees_results  # every student's job would break alike
        return record
    except Exception as exc:  # the grader's own failure: never the student's
        log(traceback.format_exc())
        return new_record(job, "infra_error", f"the grader failed: {type(exc).__name__}: {exc}", started=started)
    infra = [t for t in result.tests if t.outcome == Outcome.INFRA_ERROR]
    status = "infra_error" if infra else "graded"  # the job's status (graded | infra_error), not an outcome
    for t in result.tests:
        if t.outcome not in (Outcome.PASSED, Outcome.SKIPPED):
            log(f"  {t.outcome}: {t.name}: {t.message}")
    log(f"{job.label}: {result.score:g} / {result.max_score:g} points, {status}")
    record = new_record(job, status, infra[0].message if infra else "", result, env, started)
    record.phase_seconds = dict(phases, before_grading=round(graded_at - started, 3))  # where the job's time went
    return record


def _session(job: Job, sessions: dict, settings: Settings):
    """The grading session for this job's context (the batch's, on this job's slot), opened once
    per process and context: a job server's jobs share it, as a check's assignments do."""
    from grader.judge.session import open_session

    key = json.dumps([job.context, job.gpu, job.cache], sort_keys=True)
    if key not in sessions:
        sessions[key] = open_session(job.grading_context(), settings)
    return sessions[key]


def _job_process_main(argv: list[str]) -> int:
    """`python -m grader.batch.jobs --job LABEL --out OUT`, the job on stdin as JSON."""

    def terminate(signum, frame):  # the pool stops us, or the grader died: close the workers, write nothing
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, terminate)
    signal.signal(signal.SIGINT, terminate)
    try:
        job = Job.from_json(json.loads(sys.stdin.read()))
    except (ValueError, JobError) as exc:  # never a traceback for the pool's log: what is wrong, in one line
        print(f"grader.batch.jobs: the job on stdin cannot be read: {exc}", file=sys.stderr, flush=True)
        return 2
    # its own session: one job, one process
    record = execute(job, log=lambda line: print(line, flush=True), settings=current())
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM, signal.SIGINT})  # the record and the reports, whole
    store_record(Path(job.out), record)
    return 0


def _job_server_main() -> int:
    """`python -m grader.batch.jobs --serve`: a job process that stays and takes job after job
    (one JSON line each on stdin), so a batch pays for the interpreter, torch's import, the
    sandbox probe and the workers' zygote once per slot, not once per job. Each job logs to its
    own file and stores its record as a one-shot job process does, then `{"done": attempt}` goes
    back on stdout. Every worker of a job is closed when its job ends; only our own code (this
    process and its zygote, which holds nothing of a student's) carries over to the next job."""

    def terminate(signum, frame):  # as the one-shot job process: close the workers, write nothing
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, terminate)
    signal.signal(signal.SIGINT, terminate)
    replies = os.fdopen(os.dup(1), "w")
    own_out, own_err = os.dup(1), os.dup(2)
    os.dup2(own_err, 1)  # stray prints between jobs: the server's log, never the reply channel
    sessions: dict = {}  # opened once per context, kept for every later job
    settings = current()  # this process's, read once: the executor set them (grader.batch.executors)
    for line in sys.stdin:
        if not line.strip():
            continue
        try:
            job = Job.from_json(json.loads(line))
        except (ValueError, JobError) as exc:  # the pool sees this server end and the job as infra_error
            print(f"grader.batch.jobs --serve: a job cannot be read: {exc}", file=sys.stderr, flush=True)
            return 2
        log_file = log_path(Path(job.out), job.folder, job.assignment)
        with open(log_file, "a") as log:
            sys.stdout.flush()
            sys.stderr.flush()
            os.dup2(log.fileno(), 1)
            os.dup2(log.fileno(), 2)
            try:
                record = execute(job, log=lambda text: print(text, flush=True), sessions=sessions, settings=settings)
                # the record and reports, whole
                signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM, signal.SIGINT})
                store_record(Path(job.out), record)
                signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM, signal.SIGINT})
            finally:
                sys.stdout.flush()
                sys.stderr.flush()
                os.dup2(own_err, 1)
                os.dup2(own_err, 2)
        replies.write(json.dumps({"done": job.attempt}) + "\n")
        replies.flush()
    os.close(own_out)
    return 0


if __name__ == "__main__":
    sys.exit(_job_server_main() if sys.argv[1:] == ["--serve"] else _job_process_main(sys.argv[1:]))
