"""Batch grading: a class x assignments as jobs, with nothing lost.

A job is one student and one assignment (`grade.grade_assignment`), run by an executor
(`grader.executors`: a pool of job processes, `python -m grader.batch`, or Ray). This module
says what a job is, keys and stores its record, plans a batch and runs it. With several GPUs,
each pool slot owns one (CUDA_VISIBLE_DEVICES); timing phases hold their GPU alone
(`grader.devicelock`).

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

import fcntl
import hashlib
import json
import os
import signal
import sys
import tempfile
import time
import traceback
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Callable

import grader
from grader.results import AssignmentResult, RunResult, TestResult, write_json_atomic
from grader.spec import course_secret

RECORD_FORMAT = 1


# -- jobs and their keys --------------------------------------------------------------------

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
    seed: int
    device: str  # cuda | cpu
    gpu: str | None = None  # CUDA_VISIBLE_DEVICES for this job, set by the pool slot
    cases: list[str] | None = None
    dtypes: list[str] | None = None
    timeout: float | None = None
    notes: list[str] = field(default_factory=list)
    attempt: str = ""
    tries: int = 0
    cache: str | None = None  # the run's grader.runcache folder (this host); None: the job makes its own inputs

    @property
    def label(self) -> str:
        return f"{self.student}/{self.assignment}"


def spec_fingerprint(spec) -> str:
    """sha256 of the assignment's spec.py and its reference kernel (both decide the grade), and of
    its hidden.py and the course secret (the hidden cases and the random shapes) where there are."""
    h = hashlib.sha256()
    hidden = Path(spec.folder) / "hidden.py"
    for part in (Path(spec.folder) / "spec.py", spec.reference_module(), *([hidden] if hidden.is_file() else [])):
        h.update(part.name.encode() + b"\0")
        h.update(part.read_bytes() if part.is_file() else b"<absent>")
    secret = course_secret()
    if secret:
        h.update(b"secret\0" + hashlib.sha256(secret.encode()).digest())
    return h.hexdigest()[:16]


def job_key(commit: str | None, spec, gpu_model: str, options: dict) -> dict:
    return {"commit": commit, "spec": spec_fingerprint(spec), "grader": grader.__version__, "gpu_model": gpu_model,
            "options": options}


# -- the class folder -------------------------------------------------------------------------

def student_dir(out: Path, folder: str) -> Path:
    return Path(out) / "students" / folder


def record_path(out: Path, folder: str, assignment: str) -> Path:
    return student_dir(out, folder) / "jobs" / f"{assignment}.json"


def failed_path(out: Path, folder: str, assignment: str) -> Path:
    return student_dir(out, folder) / "jobs" / f"{assignment}.infra_error.json"


def log_path(out: Path, folder: str, assignment: str) -> Path:
    return student_dir(out, folder) / "logs" / f"{assignment}.log"


def read_json(path: Path) -> dict | None:
    try:
        return json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return None


def read_records(out: Path, folder: str) -> dict[str, dict]:
    """A student's stored records by assignment (the kept infra_error attempts aside)."""
    jobs = student_dir(out, folder) / "jobs"
    records = {}
    for path in sorted(jobs.glob("*.json")) if jobs.is_dir() else []:
        if path.name.startswith(".") or path.name.endswith(".infra_error.json"):
            continue
        record = read_json(path)
        if record and record.get("format") == RECORD_FORMAT:
            records[record["assignment"]] = record
    return records


def is_reusable(record: dict | None, key: dict) -> bool:
    return bool(record) and record.get("status") == "graded" and record.get("key") == key


# -- one job ------------------------------------------------------------------------------------

def assignment_from_dict(d: dict) -> AssignmentResult:
    tests = [TestResult(**t) for t in d.get("tests", [])]
    return AssignmentResult(d["name"], d["title"], d["module"], tests, list(d.get("notes", [])),
                            headline=d.get("headline", ""), partial=dict(d.get("partial") or {}))


def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def new_record(job: Job, status: str, error: str = "", result: AssignmentResult | None = None,
               environment: dict | None = None, started: float | None = None) -> dict:
    finished = time.time()
    return {
        "format": RECORD_FORMAT, "student": job.student, "folder": job.folder, "assignment": job.assignment,
        "status": status, "error": error, "key": job.key, "attempt": job.attempt, "commit": job.commit,
        "repo": job.repo_url, "seed": job.seed, "gpu": job.gpu, "environment": environment or {},
        "started": datetime.fromtimestamp(started or finished, timezone.utc).isoformat(timespec="seconds"),
        "finished": datetime.fromtimestamp(finished, timezone.utc).isoformat(timespec="seconds"),
        "seconds": round(finished - (started or finished), 2),
        "result": asdict(result) if result is not None else None,
    }


def execute(job: Job, log: Callable[[str], None] = print) -> dict:
    """Grade one job here (the sandboxed worker is started from here) and return its record.
    Student failures are outcomes inside the result; only our own failures are infra_error."""
    from grader import environment, spec as specs
    from grader.grade import Options, grade_assignment
    from grader.runcache import RunCache
    from grader.submission import open_submission

    started = time.time()
    log(f"grading {job.label} at commit {job.commit or '-'} ({job.device}{'' if job.gpu is None else ' gpu ' + job.gpu}, "
        f"seed {job.seed})")
    try:
        spec = specs.get(job.assignment)
        sub = open_submission(Path(job.repo))
        opts = Options(job.device, job.seed, job.cases, job.dtypes, job.timeout, gpu=job.gpu,
                       cache=RunCache(Path(job.cache)) if job.cache else None)
        graded_at = time.time()
        phases: dict[str, float] = {}
        with tempfile.TemporaryDirectory(prefix="grader-job-") as tmp:
            result = grade_assignment(sub, spec, opts, Path(tmp) / spec.name, lambda step: log(f"  {step}"), phases)
        result.notes[:0] = job.notes
        env = environment.describe(job.device)
        if opts.roofline:
            env["roofline"] = opts.roofline
    except Exception as exc:  # the grader's own failure: never the student's
        log(traceback.format_exc())
        return new_record(job, "infra_error", f"the grader failed: {type(exc).__name__}: {exc}", started=started)
    infra = [t for t in result.tests if t.outcome == "infra_error"]
    status = "infra_error" if infra else "graded"
    for t in result.tests:
        if t.outcome not in ("passed", "skipped"):
            log(f"  {t.outcome}: {t.name}: {t.message}")
    log(f"{job.label}: {result.score:g} / {result.max_score:g} points, {status}")
    record = new_record(job, status, infra[0].message if infra else "", result, env, started)
    record["phase_seconds"] = dict(phases, before_grading=round(graded_at - started, 3))  # where the job's time went
    return record


# -- storing a record ------------------------------------------------------------------------------

class _FileLock:
    """An exclusive flock on a file: one writer of a student's files at a time, across processes."""

    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path

    def __enter__(self):
        self.fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        fcntl.flock(self.fd, fcntl.LOCK_EX)
        return self

    def __exit__(self, *exc):
        os.close(self.fd)


def store_record(out: Path, record: dict) -> Path:
    """Write a job's record, unless it is an infra_error and a real grade is already there:
    then it is kept beside it. Then rebuild the student's results.json and report.html."""
    out = Path(out)
    folder, assignment = record["folder"], record["assignment"]
    with _FileLock(student_dir(out, folder) / ".lock"):
        path = record_path(out, folder, assignment)
        existing = read_json(path)
        if record["status"] == "infra_error" and existing and existing.get("status") == "graded":
            path = failed_path(out, folder, assignment)
        elif record["status"] == "graded":
            failed_path(out, folder, assignment).unlink(missing_ok=True)
        write_json_atomic(record, path)
        write_student(out, folder)
    return path


def student_run(records: dict[str, dict], order: list[str]) -> RunResult | None:
    """The student's assignments as one RunResult (what `grader check` would have written)."""
    if not records:
        return None
    ranked = sorted(records.values(), key=lambda r: (order.index(r["assignment"]) if r["assignment"] in order else len(order), r["assignment"]))
    first = ranked[0]
    run = RunResult(first.get("repo") or first["student"], first["seed"], first.get("environment") or {}, commit=first.get("commit"))
    for r in ranked:
        if r.get("result"):
            run.assignments.append(assignment_from_dict(r["result"]))
        else:
            a = AssignmentResult(r["assignment"], r["assignment"], "")
            a.tests.append(TestResult(r["assignment"], "correctness", "grading", "infra_error",
                                      f"not graded: {r.get('error') or 'the grader failed'} (it is retried on the next --resume)"))
            run.assignments.append(a)
    return run


def repair_students(out: Path, folders: list[str]) -> None:
    """Rewrite a student's results.json and report.html where a record is newer (a job process
    killed between writing its record and the reports)."""
    for folder in folders:
        records = list((student_dir(out, folder) / "jobs").glob("*.json"))
        report = student_dir(out, folder) / "results.json"
        if records and (not report.is_file() or report.stat().st_mtime < max(p.stat().st_mtime for p in records)):
            with _FileLock(student_dir(out, folder) / ".lock"):
                write_student(out, folder)


def rewrite_student(out: Path, folder: str) -> None:
    """write_student under the student's lock (the class view's late notes changed)."""
    with _FileLock(student_dir(out, folder) / ".lock"):
        write_student(out, folder)


def write_student(out: Path, folder: str) -> None:
    from grader import spec as specs
    from grader.course import late_notes
    from grader.report import render
    from grader.results import write_text_atomic

    run = student_run(read_records(out, folder), list(specs.catalogue()))
    if run is None:
        return
    folder_path = student_dir(out, folder)
    late = late_notes(folder_path)
    for a in run.assignments:
        if a.name in late:
            a.notes.append(late[a.name])
    write_json_atomic(run.to_gradescope(), folder_path / "results.json")
    write_text_atomic(render(run), folder_path / "report.html")


# -- a batch -------------------------------------------------------------------------------------------

MANIFEST = "batch.json"


@dataclass
class BatchOptions:
    out: Path
    assignments: list[str]
    device: str  # cuda | cpu
    slots: list[str | None]  # one GPU per pool slot (None on the CPU)
    gpu_model: str
    resume: bool = False
    only: list[str] | None = None
    seed: int | None = None
    cases: list[str] | None = None
    dtypes: list[str] | None = None
    timeout: float | None = None
    retries: int = 1
    executor: str = "local"
    address: str | None = None
    per_gpu: int = 2
    job_timeout: float | None = None
    course: object = None  # grader.course.Course: points, late policy (the class view applies them)
    similarity_threshold: float | None = None


@dataclass
class Plan:
    jobs: list[Job]
    reused: list[Job]
    seed: int
    broken: list[str] = field(default_factory=list)


def plan_batch(lock, opts: BatchOptions) -> Plan:
    """Every (fetched student, assignment) job; with --resume, those with a reusable grade apart."""
    import secrets

    from grader import spec as specs
    from grader.workspace import ensure_checkout

    out = Path(opts.out).resolve()
    manifest = read_json(out / MANIFEST) or {}
    seed = opts.seed if opts.seed is not None else manifest.get("seed", secrets.randbelow(2**31))
    # everything that changes what is graded; the seed draws the random cases and every input
    options = {"device": opts.device, "cases": opts.cases, "dtypes": opts.dtypes, "timeout": opts.timeout, "seed": seed}
    plan = Plan([], [], seed)
    for p in lock.students:
        if p.status != "fetched" or (opts.only and p.student not in opts.only):
            continue
        try:
            repo = str(ensure_checkout(lock, p))
        except Exception as exc:  # the cache was removed or damaged after fetch
            repo, why = "", f"the checkout of {p.student} in the workspace is missing or damaged ({exc}): run grader fetch again"
            plan.broken.append(why)
        for name in opts.assignments:
            spec = specs.get(name)
            job = Job(p.student, p.folder, name, repo, p.repo, p.commit, job_key(p.commit, spec, opts.gpu_model, options),
                      str(out), seed, opts.device, cases=opts.cases, dtypes=opts.dtypes, timeout=opts.timeout, notes=list(p.notes))
            if not repo:
                store_record(out, new_record(job, "infra_error", plan.broken[-1]))
            elif opts.resume and is_reusable(read_json(record_path(out, p.folder, name)), job.key):
                plan.reused.append(job)
            else:
                plan.jobs.append(job)
    return plan


def make_executor(opts: BatchOptions, slots: list[str | None]):
    from grader.executors import LocalExecutor, RayExecutor, default_job_timeout

    timeout = (lambda job: opts.job_timeout) if opts.job_timeout else default_job_timeout
    if opts.executor == "ray":
        return RayExecutor(opts.address, max_in_flight=len(slots), per_gpu=opts.per_gpu, job_timeout=timeout)
    return LocalExecutor(slots, job_timeout=timeout)


def run_batch(lock, opts: BatchOptions, plan: Plan, on_event: Callable[[str, Job, dict | None], None],
              executor=None) -> dict:
    """Run the plan, then write the class view. Ctrl-C (KeyboardInterrupt) stops the jobs in
    flight, keeps every finished one and still writes the class view; returns this run's entry
    of the manifest."""
    from grader.classview import write_class_outputs
    from grader.executors import Scheduler
    from grader.runcache import RunCache

    out = Path(opts.out).resolve()
    manifest = read_json(out / MANIFEST) or {}
    manifest["seed"] = plan.seed
    manifest["assignments"] = list(dict.fromkeys([*manifest.get("assignments", []), *opts.assignments]))
    manifest["lock"] = str(lock.root)
    entry = {"started": _now(), "device": opts.device, "gpu_model": opts.gpu_model, "slots": opts.slots,
             "executor": opts.executor, "jobs": len(plan.jobs), "reused": len(plan.reused), "only": opts.only}
    manifest.setdefault("runs", []).append(entry)
    write_json_atomic(manifest, out / MANIFEST)

    executor = executor or make_executor(opts, opts.slots)
    # jobs on this host share one run cache (inputs, roofline, the reference's compiled kernels);
    # a Ray job on another node makes its own
    cache = RunCache.temporary() if opts.executor == "local" and opts.device == "cuda" else None
    for job in plan.jobs:
        job.cache = str(cache.folder) if cache else None
    sched = Scheduler(plan.jobs, opts.retries, on_event)
    started = time.time()
    try:
        executor.run(sched)
    except KeyboardInterrupt:
        entry["interrupted"] = True
        sched.stop()
        executor.stop()
        executor.join()
    finally:
        done = [r for _, r in sched.finished if r is not None]
        entry.update(finished=_now(), wall_s=round(time.time() - started, 1), graded=sum(r["status"] == "graded" for r in done),
                     infra_error=sum(r["status"] == "infra_error" for r in done),
                     not_run=len(plan.jobs) - len(done))
        write_json_atomic(manifest, out / MANIFEST)
        repair_students(out, [p.folder for p in lock.students if p.status == "fetched"])
        write_class_outputs(out, lock, manifest["assignments"], manifest, opts.course, opts.similarity_threshold)
        if cache:
            cache.remove()
    return entry


# -- the job process -------------------------------------------------------------------------------

def _job_process_main(argv: list[str]) -> int:
    """`python -m grader.batch --job LABEL --out OUT`, the job on stdin as JSON."""

    def terminate(signum, frame):  # the pool stops us, or the grader died: close the workers, write nothing
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, terminate)
    signal.signal(signal.SIGINT, terminate)
    job = Job(**json.loads(sys.stdin.read()))
    record = execute(job, log=lambda line: print(line, flush=True))
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM, signal.SIGINT})  # the record and the reports, whole
    store_record(Path(job.out), record)
    return 0


def _job_server_main() -> int:
    """`python -m grader.batch --serve`: a job process that stays and takes job after job (one
    JSON line each on stdin), so a batch pays for the interpreter, torch's import, the sandbox
    probe and the workers' zygote once per slot, not once per job. Each job logs to its own
    file and stores its record as a one-shot job process does, then `{"done": attempt}` goes
    back on stdout. Every worker of a job is closed when its job ends; only our own code (this
    process and its zygote, which holds nothing of a student's) carries over to the next job."""

    def terminate(signum, frame):  # as the one-shot job process: close the workers, write nothing
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, terminate)
    signal.signal(signal.SIGINT, terminate)
    replies = os.fdopen(os.dup(1), "w")
    own_out, own_err = os.dup(1), os.dup(2)
    os.dup2(own_err, 1)  # stray prints between jobs: the server's log, never the reply channel
    for line in sys.stdin:
        if not line.strip():
            continue
        job = Job(**json.loads(line))
        log_file = log_path(Path(job.out), job.folder, job.assignment)
        with open(log_file, "a") as log:
            sys.stdout.flush()
            sys.stderr.flush()
            os.dup2(log.fileno(), 1)
            os.dup2(log.fileno(), 2)
            try:
                record = execute(job, log=lambda text: print(text, flush=True))
                signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM, signal.SIGINT})  # the record and reports, whole
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
