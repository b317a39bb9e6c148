"""Batch grading: a class x assignments as jobs, run by a pool, with nothing lost.

A job is one student and one assignment (`grade.grade_assignment`). The local executor runs
`--jobs N` of them at once, each in a fresh job process (`python -m grader.batch`), which
starts the sandboxed worker as `grader check` does; with several GPUs, each pool slot owns
one (CUDA_VISIBLE_DEVICES), and timing phases hold their GPU alone (`grader.devicelock`).

Nothing is lost:
- each job process writes its record atomically the moment the job ends
  (OUT/students/<student>/jobs/<assignment>.json), then that student's results.json and
  report.html; the class view is rebuilt from the records on disk;
- `--resume` skips a job whose record is a real grade with the same key: commit, spec and
  reference fingerprint, grader version, GPU model and the grading options;
- an infra_error (our fault: the job process died, hung, or the grader raised) is retried, and
  never overwrites an earlier real grade (it is kept beside it, as <assignment>.infra_error.json);
- a job process dies with the grader (SIGKILL included: the kernel sends it SIGTERM), closes
  its workers and writes nothing, so the next `--resume` runs that job again.

`--executor ray` sends the same jobs to a Ray cluster: the student's code travels with the
task, the job runs in the sandboxed worker on the node it lands on, and the record comes back
to be stored here in the same layout.
"""

from __future__ import annotations

import collections
import ctypes
import fcntl
import hashlib
import io
import json
import os
import signal
import subprocess
import sys
import tarfile
import tempfile
import threading
import time
import traceback
import uuid
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Callable

import grader
from grader.results import AssignmentResult, RunResult, TestResult, write_json_atomic

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

    @property
    def label(self) -> str:
        return f"{self.student}/{self.assignment}"


def spec_fingerprint(spec) -> str:
    """sha256 of the assignment's spec.py and its reference kernel (both decide the grade)."""
    h = hashlib.sha256()
    for part in (Path(spec.folder) / "spec.py", spec.reference_module()):
        h.update(part.name.encode() + b"\0")
        h.update(part.read_bytes() if part.is_file() else b"<absent>")
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
    return AssignmentResult(d["name"], d["title"], d["module"], tests, list(d.get("notes", [])))


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
    from grader.submission import open_submission

    started = time.time()
    log(f"grading {job.label} at commit {job.commit or '-'} ({job.device}{'' if job.gpu is None else ' gpu ' + job.gpu}, "
        f"seed {job.seed})")
    try:
        spec = specs.get(job.assignment)
        sub = open_submission(Path(job.repo))
        opts = Options(job.device, job.seed, job.cases, job.dtypes, job.timeout, gpu=job.gpu)
        with tempfile.TemporaryDirectory(prefix="grader-job-") as tmp:
            result = grade_assignment(sub, spec, opts, Path(tmp) / spec.name, lambda step: log(f"  {step}"))
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
    return new_record(job, status, infra[0].message if infra else "", result, env, started)


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


def write_student(out: Path, folder: str) -> None:
    from grader import spec as specs
    from grader.report import render
    from grader.results import write_text_atomic

    run = student_run(read_records(out, folder), list(specs.catalogue()))
    if run is None:
        return
    folder_path = student_dir(out, folder)
    write_json_atomic(run.to_gradescope(), folder_path / "results.json")
    write_text_atomic(render(run), folder_path / "report.html")


# -- scheduling ---------------------------------------------------------------------------------------

class Scheduler:
    """The queue of jobs: slots take jobs, an infra_error goes back in line until its retries
    are spent, and stop() (Ctrl-C) lets no new job start."""

    def __init__(self, jobs: list[Job], retries: int, on_event: Callable[[str, Job, dict | None], None]) -> None:
        self.queue = collections.deque(jobs)
        self.retries = retries
        self.on_event = on_event
        self.cond = threading.Condition()
        self.in_flight = 0
        self.stopped = False
        self.finished: list[tuple[Job, dict | None]] = []

    def take(self, block: bool = True) -> Job | None:
        with self.cond:
            while block and not self.queue and self.in_flight and not self.stopped:
                self.cond.wait()
            if self.stopped or not self.queue:
                return None
            job = self.queue.popleft()
            job.tries += 1
            job.attempt = uuid.uuid4().hex
            self.in_flight += 1
        self.on_event("start", job, None)
        return job

    def finish(self, job: Job, record: dict | None) -> None:
        with self.cond:
            self.in_flight -= 1
            retry = record is not None and record["status"] == "infra_error" and job.tries <= self.retries and not self.stopped
            if retry:
                self.queue.append(job)
            else:
                self.finished.append((job, record))
            self.cond.notify_all()
        self.on_event("retry" if retry else ("interrupted" if record is None else "done"), job, record)

    @property
    def idle(self) -> bool:
        with self.cond:
            return not self.queue and not self.in_flight

    def stop(self) -> None:
        with self.cond:
            self.stopped = True
            self.cond.notify_all()


def default_job_timeout(job: Job) -> float:
    """Generous: every call may use its whole timeout, the worker may restart, timing may run."""
    from grader import spec as specs
    from grader.plan import plan_calls

    spec = specs.get(job.assignment)
    calls = plan_calls(spec, job.seed, job.device == "cpu", job.cases, job.dtypes)
    per_call = job.timeout or spec.call_timeout_s
    perf = 900 if spec.performance is not None and job.device == "cuda" else 0
    return 120 + 3 * spec.import_timeout_s + len(calls) * per_call + perf


try:  # loaded here, not in the forked child (the loader's locks may be held there)
    _PRCTL = ctypes.CDLL(None, use_errno=True).prctl
except (AttributeError, OSError):  # not Linux
    _PRCTL = None


def _die_with(parent: int) -> Callable[[], None]:
    """preexec_fn of a job process: SIGTERM when the grader that started it dies, even by SIGKILL."""

    def arm() -> None:
        if _PRCTL is not None:
            _PRCTL(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
        if os.getppid() != parent:  # the grader died before the line above
            os._exit(1)

    return arm


class LocalExecutor:
    """`slots` job processes at once on this machine; slot i owns GPU slots[i] (None: CPU)."""

    def __init__(self, slots: list[str | None], job_timeout: Callable[[Job], float] = default_job_timeout,
                 runner: list[str] | None = None) -> None:
        from grader.sandbox import PACKAGE_PARENT

        self.slots = slots
        self.job_timeout = job_timeout
        self.runner = runner or [sys.executable, "-m", "grader.batch"]
        self.pythonpath = PACKAGE_PARENT
        self.running: dict[str, subprocess.Popen] = {}
        self.lock = threading.Lock()
        self.stopping = False

    def run(self, sched: Scheduler) -> None:
        self.threads = [threading.Thread(target=self._slot, args=(sched, gpu), name=f"slot-{i}", daemon=True)
                        for i, gpu in enumerate(self.slots)]
        for t in self.threads:
            t.start()
        self.join()

    def join(self) -> None:
        for t in getattr(self, "threads", []):
            while t.is_alive():
                t.join(0.2)  # short joins: Ctrl-C reaches the main thread

    def _slot(self, sched: Scheduler, gpu: str | None) -> None:
        while (job := sched.take()) is not None:
            job.gpu = gpu
            try:
                record = self._run_one(job)
            except Exception as exc:  # never lose the slot to our own bug
                record = new_record(job, "infra_error", f"the pool failed: {type(exc).__name__}: {exc}")
                store_record(Path(job.out), record)
            sched.finish(job, record)

    def _run_one(self, job: Job) -> dict | None:
        out = Path(job.out)
        log_file = log_path(out, job.folder, job.assignment)
        log_file.parent.mkdir(parents=True, exist_ok=True)
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [self.pythonpath, os.environ.get("PYTHONPATH")])))
        if job.device == "cuda" and job.gpu is not None:
            env["CUDA_VISIBLE_DEVICES"] = job.gpu
        limit = self.job_timeout(job)
        started = time.time()
        with open(log_file, "a") as log:
            log.write(f"\n=== {_now()} attempt {job.tries} of {job.label}" + (f" on GPU {job.gpu}" if job.gpu else "") + " ===\n")
            log.flush()
            proc = subprocess.Popen([*self.runner, "--job", job.label, "--out", job.out], stdin=subprocess.PIPE,
                                    stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True,
                                    preexec_fn=_die_with(os.getpid()))
            with self.lock:
                self.running[job.attempt] = proc
                stopping = self.stopping
            if stopping:
                self._terminate(proc)
            try:
                proc.stdin.write(json.dumps(asdict(job)).encode())
                proc.stdin.close()
            except BrokenPipeError:
                pass
            hung = False
            try:
                proc.wait(timeout=limit)
            except subprocess.TimeoutExpired:
                hung = True
                self._terminate(proc)
            with self.lock:
                del self.running[job.attempt]
                stopping = self.stopping
        for path in (record_path(out, job.folder, job.assignment), failed_path(out, job.folder, job.assignment)):
            record = read_json(path)
            if record and record.get("attempt") == job.attempt:
                return record
        if stopping:
            return None  # interrupted: not a result, the job runs again on --resume
        why = (f"the grading job ran over its time limit ({limit:.0f} s) and was killed" if hung
               else f"the grading job process died ({_exit_reason(proc.returncode)}) before writing a result")
        record = new_record(job, "infra_error", why + f"; see {log_file}", started=started)
        store_record(out, record)
        return record

    def _terminate(self, proc: subprocess.Popen) -> None:
        """SIGTERM (the job closes its workers), then SIGKILL if it lingers."""
        for sig, wait in ((signal.SIGTERM, 15), (signal.SIGKILL, 5)):
            try:
                os.killpg(proc.pid, sig)
            except (ProcessLookupError, PermissionError):
                return
            try:
                proc.wait(timeout=wait)
                return
            except subprocess.TimeoutExpired:
                continue

    def stop(self) -> None:
        with self.lock:
            self.stopping = True
            procs = list(self.running.values())
        threads = [threading.Thread(target=self._terminate, args=(p,)) for p in procs]
        for t in threads:
            t.start()
        for t in threads:
            t.join()


def _exit_reason(code: int | None) -> str:
    if code is None:
        return "no exit status"
    if code < 0:
        return f"killed by signal {signal.Signals(-code).name}"
    return f"exit status {code}"


# -- Ray ----------------------------------------------------------------------------------------------

def pack_repo(root: Path) -> bytes:
    """The submission as a tar.gz (what the worker's private copy would hold), to travel to a node."""
    from grader.submission import IGNORED

    buffer = io.BytesIO()
    root = Path(root)
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        for folder, dirs, files in os.walk(root):
            ignored = IGNORED(folder, dirs + files)
            dirs[:] = sorted(d for d in dirs if d not in ignored)
            for name in sorted(files):
                if name not in ignored:
                    path = Path(folder) / name
                    tar.add(path, arcname=str(path.relative_to(root)), recursive=False)
    return buffer.getvalue()


def _unpack(code: bytes, dest: Path) -> None:
    with tarfile.open(fileobj=io.BytesIO(code), mode="r:gz") as tar:
        if hasattr(tarfile, "data_filter"):
            tar.extractall(dest, filter="data")
        else:  # pragma: no cover - Python without the extraction filters
            for m in tar.getmembers():
                if m.name.startswith("/") or ".." in Path(m.name).parts or not (m.isfile() or m.isdir()):
                    raise ValueError(f"unsafe path in the submission archive: {m.name}")
            tar.extractall(dest)


def ray_task(job: dict, code: bytes) -> tuple[dict, str]:
    """Runs on a Ray node: unpack the submission, grade it there, return the record and log."""
    lines: list[str] = []
    j = Job(**job)
    j.gpu = (os.environ.get("CUDA_VISIBLE_DEVICES") or None) if j.device == "cuda" else None  # the GPU Ray gave the task
    with tempfile.TemporaryDirectory(prefix="grader-ray-") as tmp:
        _unpack(code, Path(tmp) / "repo")
        j.repo = str(Path(tmp) / "repo")
        record = execute(j, log=lines.append)
    record["node"] = os.uname().nodename
    return record, "\n".join(lines) + "\n"


class RayExecutor:
    """The jobs as Ray tasks: a GPU fraction each on cuda (so `per_gpu` jobs share a GPU and
    overlap their correctness phases; the lock files serialize timing on each node)."""

    def __init__(self, address: str | None, max_in_flight: int, per_gpu: int = 2,
                 job_timeout: Callable[[Job], float] = default_job_timeout, ray_module=None) -> None:
        self.address = address
        self.max_in_flight = max(1, max_in_flight)
        self.per_gpu = max(1, per_gpu)
        self.job_timeout = job_timeout
        self.ray = ray_module
        self.stopping = False

    def _ray(self):
        if self.ray is None:
            try:
                import ray
            except ImportError:
                raise RuntimeError("--executor ray needs Ray: pip install 'grader[ray]'") from None
            self.ray = ray
        return self.ray

    def run(self, sched: Scheduler) -> None:
        ray = self._ray()
        from grader.sandbox import PACKAGE_PARENT

        if not ray.is_initialized():
            # the driver's grader and course folder for local workers; a cluster's nodes have their own install
            env = {"PYTHONPATH": os.pathsep.join(filter(None, [PACKAGE_PARENT, os.environ.get("PYTHONPATH")]))}
            for var in ("GRADER_COURSE", "GRADER_REFERENCE_DIR", "GRADER_LOCK_DIR"):
                if var in os.environ:
                    env[var] = os.environ[var]
            ray.init(address=self.address, runtime_env={"env_vars": env}, log_to_driver=False,
                     **({} if self.address else {"include_dashboard": False}))
        task = ray.remote(ray_task)
        in_flight: dict = {}
        try:
            while not self.stopping:
                while len(in_flight) < self.max_in_flight:
                    job = sched.take(block=False)
                    if job is None:
                        break
                    resources = {"num_gpus": 1 / self.per_gpu} if job.device == "cuda" else {"num_cpus": 1}
                    ref = task.options(max_retries=0, **resources).remote(asdict(job), pack_repo(Path(job.repo)))
                    in_flight[ref] = (job, time.time(), self.job_timeout(job))
                if not in_flight:
                    if sched.idle or sched.stopped:
                        return
                    time.sleep(0.2)
                    continue
                ready, _ = ray.wait(list(in_flight), num_returns=1, timeout=0.5)
                for ref in ready:
                    job, started, _ = in_flight.pop(ref)
                    try:
                        record, log_text = ray.get(ref)
                    except Exception as exc:  # the task or its node died: ours, not the student's
                        record, log_text = new_record(job, "infra_error", f"the Ray task failed: {type(exc).__name__}: {exc}",
                                                      started=started), traceback.format_exc()
                    self._finish(sched, job, record, log_text)
                now = time.time()
                for ref, (job, started, limit) in list(in_flight.items()):
                    if now - started > limit:
                        ray.cancel(ref, force=True)
                        in_flight.pop(ref)
                        self._finish(sched, job, new_record(job, "infra_error", f"the Ray task ran over its time limit "
                                                            f"({limit:.0f} s) and was cancelled", started=started), "")
        finally:  # Ctrl-C, or stop(): what is still running is cancelled and not a result
            for ref, (job, _, _) in in_flight.items():
                ray.cancel(ref, force=True)
                sched.finish(job, None)

    def _finish(self, sched: Scheduler, job: Job, record: dict, log_text: str) -> None:
        out = Path(job.out)
        log_file = log_path(out, job.folder, job.assignment)
        log_file.parent.mkdir(parents=True, exist_ok=True)
        with open(log_file, "a") as log:
            log.write(f"\n=== {_now()} attempt {job.tries} of {job.label} on Ray node {record.get('node', '?')} ===\n{log_text}")
        store_record(out, record)
        sched.finish(job, record)

    def stop(self) -> None:
        self.stopping = True

    def join(self) -> None:
        pass  # run() cancels what is in flight as it returns


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
    options = {"device": opts.device, "cases": opts.cases, "dtypes": opts.dtypes, "timeout": opts.timeout}
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

    out = Path(opts.out).resolve()
    manifest = read_json(out / MANIFEST) or {}
    manifest["seed"] = plan.seed
    manifest["assignments"] = list(dict.fromkeys([*manifest.get("assignments", []), *opts.assignments]))
    manifest["lock"] = str(lock.root)
    entry = {"started": _now(), "device": opts.device, "gpu_model": opts.gpu_model, "slots": opts.slots,
             "executor": opts.executor, "jobs": len(plan.jobs), "reused": len(plan.reused), "only": opts.only}
    manifest.setdefault("runs", []).append(entry)
    write_json_atomic(manifest, out / MANIFEST)

    sched = Scheduler(plan.jobs, opts.retries, on_event)
    executor = executor or make_executor(opts, opts.slots)
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
        write_class_outputs(out, lock, manifest["assignments"], manifest)
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
    store_record(Path(job.out), record)
    return 0


if __name__ == "__main__":
    sys.exit(_job_process_main(sys.argv[1:]))
