"""Executors: how the jobs of a batch run, with the queue they share.

- `LocalExecutor`: `--jobs N` job processes at once on this machine (`python -m grader.batch.jobs`,
  each starting its own sandboxed worker); slot i owns GPU i mod G. A job process that dies or
  runs over its time limit is an infra_error of that job alone; one that outlives the grader
  is sent SIGTERM by the kernel (PR_SET_PDEATHSIG), closes its workers and writes nothing.
- `RayExecutor`: the same jobs as Ray tasks; the submission travels with the task as a tar.gz,
  the record comes back and is stored here.
- `Scheduler`: the queue both take from: an infra_error goes back in line until its retries
  are spent, and stop() (Ctrl-C) lets no new job start.
"""

from __future__ import annotations

import collections
import ctypes
import io
import json
import os
import select
import signal
import subprocess
import sys
import tarfile
import tempfile
import threading
import time
import traceback
import uuid
from pathlib import Path
from typing import Callable

from grader.batch.jobs import Job, execute, new_record, now
from grader.batch.record import JobRecord, RecordError
from grader.batch.store import failed_path, log_path, read_record, record_path, store_record
from grader.settings import Settings, current
from grader.spec import Course

# -- scheduling ---------------------------------------------------------------------------------------

class Scheduler:
    """The queue of jobs: slots take jobs, an infra_error goes back in line until its retries
    are spent, and stop() (Ctrl-C) lets no new job start."""

    def __init__(self, jobs: list[Job], retries: int, on_event: Callable[[str, Job, JobRecord | None], None]) -> None:
        self.queue = collections.deque(jobs)
        self.retries = retries
        self.on_event = on_event
        self.cond = threading.Condition()
        self.in_flight = 0
        self.stopped = False
        self.finished: list[tuple[Job, JobRecord | None]] = []
        self.course_errors: dict[str, str] = {}  # assignment -> its course error, the first job's

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

    def finish(self, job: Job, record: JobRecord | None) -> None:
        """A job ended. An infra_error goes back in line; the course's own error (a spec that
        raised, grader.spec.CourseCodeError) is not retried, and that assignment's jobs still
        waiting are not run: every student's would break the same way (`course_errors`), unless the
        code that raised reads the student's results (a property check: that result may be the cause)."""
        dropped: list[Job] = []
        with self.cond:
            self.in_flight -= 1
            course_error = record is not None and bool(record.extra.get("course_error"))
            retry = (record is not None and record.status == "infra_error" and job.tries <= self.retries
                     and not self.stopped and not course_error)
            if retry:
                self.queue.append(job)
            else:
                self.finished.append((job, record))
            if course_error and record is not None:
                self.course_errors.setdefault(job.assignment, record.error)
            if course_error and record is not None and record.extra.get("course_error_stops", True):
                dropped = [j for j in self.queue if j.assignment == job.assignment]
                self.queue = collections.deque(j for j in self.queue if j.assignment != job.assignment)
            self.cond.notify_all()
        self.on_event("retry" if retry else ("interrupted" if record is None else "done"), job, record)
        for j in dropped:
            self.on_event("not_run", j, None)

    @property
    def idle(self) -> bool:
        with self.cond:
            return not self.queue and not self.in_flight

    def stop(self) -> None:
        with self.cond:
            self.stopped = True
            self.cond.notify_all()


def default_job_timeout(catalogue: Course) -> Callable[[Job], float]:
    """A job's time limit, from its assignment in `catalogue` (the course graded). Generous:
    every call may use its whole timeout, the worker may restart, timing may run."""

    def limit(job: Job) -> float:
        spec = catalogue.get(job.assignment)
        ctx = job.grading_context()
        perf = 900 if spec.performance is not None and ctx.device == "cuda" else 0
        return 120 + 3 * ctx.import_timeout_for(spec) + len(ctx.calls(spec)) * ctx.call_timeout_for(spec) + perf

    return limit


_PRCTL: Callable[..., int] | None
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


def thread_share(slots: int, settings: Settings) -> dict[str, str]:
    """The CPU threads each of `slots` job processes at once may use, and their workers
    (sandbox.launch.worker_env passes GRADER_THREADS on as OMP_NUM_THREADS): the machine's cores
    shared out. Left alone, every process's torch and OpenMP pools take every core (a job
    process, its workers and the interpreter replay, in each slot), and several slots
    oversubscribe the machine. One slot, or a value the user set (`settings.threads`), is left as it is."""
    if slots <= 1 or settings.threads is not None:
        return {}
    share = str(max(1, (os.cpu_count() or 1) // slots))
    return {"GRADER_THREADS": share, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", share)}


class LocalExecutor:
    """`slots` job processes at once on this machine; slot i owns GPU slots[i] (None: CPU)."""

    def __init__(self, slots: list[str | None], job_timeout: Callable[[Job], float] | None = None,
                 runner: list[str] | None = None, server: list[str] | None = None, *,
                 settings: Settings) -> None:
        """`server` (default: `python -m grader.batch.jobs --serve`, unless GRADER_JOB_SERVER=0 or a
        one-shot `runner` is given) keeps one job process per slot for job after job; `settings`
        are the batch command's; `job_timeout` (default: `default_job_timeout` of the course the
        settings name) a job's time limit."""
        from grader.sandbox.launch import PACKAGE_PARENT

        self.slots = slots
        self.job_timeout = job_timeout or default_job_timeout(Course.find(settings))
        self.runner = runner or [sys.executable, "-m", "grader.batch.jobs"]
        self.settings = settings
        if server is None and runner is None and settings.warm.job_server:
            server = [sys.executable, "-m", "grader.batch.jobs", "--serve"]
        self.server = server
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
        server: list = [None]  # this slot's job server, started on its first job, replaced if it dies or hangs
        try:
            while (job := sched.take()) is not None:
                job.gpu = gpu
                try:
                    record = self._run_served(job, server) if self.server else self._run_one(job)
                except Exception as exc:  # never lose the slot to our own bug
                    record = new_record(job, "infra_error", f"the pool failed: {type(exc).__name__}: {exc}")
                    store_record(Path(job.out), record)
                sched.finish(job, record)
        finally:
            if server[0] is not None:
                self._close_server(server[0])

    def _env(self, job: Job) -> dict[str, str]:
        env = dict(os.environ,
                   PYTHONPATH=os.pathsep.join(filter(None, [self.pythonpath, os.environ.get("PYTHONPATH")])))
        if job.device == "cuda" and job.gpu is not None:
            env["CUDA_VISIBLE_DEVICES"] = job.gpu
        env.update(thread_share(len(self.slots), self.settings))
        return env

    def _start_server(self, job: Job) -> subprocess.Popen:
        folder = Path(job.out) / "logs"
        folder.mkdir(parents=True, exist_ok=True)
        name = threading.current_thread().name
        assert self.server is not None  # only a pool with a job server starts one
        with open(folder / f"job-server-{name}.log", "a") as log:
            return subprocess.Popen(self.server, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log,
                                    env=self._env(job),
                                    start_new_session=True, preexec_fn=_die_with(os.getpid()))

    def _close_server(self, proc: subprocess.Popen) -> None:
        assert proc.stdin is not None  # started with stdin=PIPE
        try:
            proc.stdin.close()
            proc.wait(timeout=30)
        except (OSError, subprocess.TimeoutExpired):
            self._terminate(proc)
        if proc.stdout:
            proc.stdout.close()

    def _run_served(self, job: Job, server: list) -> JobRecord | None:
        """The job in this slot's job server: as _run_one, without a new process per job."""
        out = Path(job.out)
        log_file = log_path(out, job.folder, job.assignment)
        log_file.parent.mkdir(parents=True, exist_ok=True)
        limit = self.job_timeout(job)
        started = time.time()
        with open(log_file, "a") as log:
            log.write(_attempt_header(job))
        proc = server[0]
        if proc is None or proc.poll() is not None:
            proc = server[0] = self._start_server(job)
        with self.lock:
            self.running[job.attempt] = proc
            stopping = self.stopping
        if stopping:
            self._terminate(proc)
        hung = died = False
        try:
            proc.stdin.write((json.dumps(job.to_json()) + "\n").encode())
            proc.stdin.flush()
        except (BrokenPipeError, OSError):
            pass
        deadline = time.monotonic() + limit
        line = b""
        while not line.endswith(b"\n"):
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                hung = True
                break
            ready, _, _ = select.select([proc.stdout], [], [], min(remaining, 1.0))
            if not ready:
                continue
            chunk = os.read(proc.stdout.fileno(), 4096)
            if not chunk:
                died = True
                break
            line += chunk
        if hung or died:
            self._terminate(proc)
            server[0] = None
        with self.lock:
            del self.running[job.attempt]
            stopping = self.stopping
        return _job_record(job, stopping, hung, limit, proc.poll(), log_file, started)

    def _run_one(self, job: Job) -> JobRecord | None:
        out = Path(job.out)
        log_file = log_path(out, job.folder, job.assignment)
        log_file.parent.mkdir(parents=True, exist_ok=True)
        env = self._env(job)
        limit = self.job_timeout(job)
        started = time.time()
        with open(log_file, "a") as log:
            log.write(_attempt_header(job))
            log.flush()
            proc = subprocess.Popen([*self.runner, "--job", job.label, "--out", job.out], stdin=subprocess.PIPE,
                                    stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True,
                                    preexec_fn=_die_with(os.getpid()))
            with self.lock:
                self.running[job.attempt] = proc
                stopping = self.stopping
            if stopping:
                self._terminate(proc)
            assert proc.stdin is not None  # started with stdin=PIPE
            try:
                proc.stdin.write(json.dumps(job.to_json()).encode())
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
        return _job_record(job, stopping, hung, limit, proc.returncode, log_file, started)

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


def _attempt_header(job: Job) -> str:
    """The line that opens an attempt in the job's log (the student's name in it shown as text)."""
    from grader.sanitize import one_line

    on_gpu = f" on GPU {job.gpu}" if job.gpu else ""
    return f"\n=== {now()} attempt {job.tries} of {one_line(job.label)}{on_gpu} ===\n"


def _job_record(job: Job, stopping: bool, hung: bool, limit: float, code: int | None, log_file: Path,
                started: float) -> JobRecord | None:
    """What a job process left for this attempt; else why it left nothing, as an infra_error of
    this job alone (None when the pool was stopped: the job runs again on --resume)."""
    out = Path(job.out)
    for path in (record_path(out, job.folder, job.assignment), failed_path(out, job.folder, job.assignment)):
        try:
            record = read_record(path)
        except RecordError:  # not this attempt's: a job process writes whole records (said below if none is)
            continue
        if record is not None and record.attempt == job.attempt:
            return record
    if stopping:
        return None
    why = (f"the grading job ran over its time limit ({limit:.0f} s) and was killed" if hung
           else f"the grading job process died ({_exit_reason(code)}) before writing a result")
    record = new_record(job, "infra_error", why + f"; see {log_file}", started=started)
    store_record(out, record)
    return record


def _exit_reason(code: int | None) -> str:
    if code is None:
        return "no exit status"
    if code < 0:
        return f"killed by signal {signal.Signals(-code).name}"
    return f"exit status {code}"


# -- Ray ----------------------------------------------------------------------------------------------

def pack_repo(root: Path) -> bytes:
    """The submission as a tar.gz to travel to a node: exactly what the worker's private copy
    would hold (`grader.repofiles.copy_tree`: links only where they stay inside the repo, no
    special files, bounded in depth and size), so a link out or a tree 1,200 deep is the
    student's outcome on the node, never an archive the node refuses."""
    from grader.repofiles import copy_tree
    from grader.submission import IGNORED

    buffer = io.BytesIO()
    with tempfile.TemporaryDirectory(prefix="grader-pack-") as tmp, tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        copy = Path(tmp) / "repo"
        copy_tree(Path(root), copy, ignore=IGNORED)
        for folder, dirs, files in os.walk(copy):  # at most 64 folders deep: the walk's recursion holds
            dirs.sort()
            for name in sorted(files + [d for d in dirs if os.path.islink(os.path.join(folder, d))]):
                path = Path(folder) / name  # files and links; a folder comes with what it holds
                tar.add(path, arcname=str(path.relative_to(copy)), recursive=False)
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
    """Runs on a Ray node (the entry point of its work there: the node's settings are read here):
    unpack the submission, grade it there, return the record (as JSON, read back and checked by
    the driver) and log."""
    lines: list[str] = []
    j = Job.from_json(job)
    # the GPU Ray gave the task
    j.gpu = (os.environ.get("CUDA_VISIBLE_DEVICES") or None) if j.device == "cuda" else None
    with tempfile.TemporaryDirectory(prefix="grader-ray-") as tmp:
        _unpack(code, Path(tmp) / "repo")
        j.repo = str(Path(tmp) / "repo")
        record = execute(j, log=lines.append, settings=current())
    record.node = os.uname().nodename
    return record.to_json(), "\n".join(lines) + "\n"


class RayExecutor:
    """The jobs as Ray tasks: a GPU fraction each on cuda (so `per_gpu` jobs share a GPU and
    overlap their correctness phases; the lock files serialize timing on each node)."""

    def __init__(self, address: str | None, max_in_flight: int, per_gpu: int = 2,
                 job_timeout: Callable[[Job], float] | None = None, ray_module=None, *, settings: Settings) -> None:
        """`settings`: the batch command's; `job_timeout` (default: `default_job_timeout` of the
        course they name) a job's time limit."""
        self.address = address
        self.max_in_flight = max(1, max_in_flight)
        self.per_gpu = max(1, per_gpu)
        self.job_timeout = job_timeout or default_job_timeout(Course.find(settings))
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
        from grader.sandbox.launch import PACKAGE_PARENT

        if not ray.is_initialized():
            # the driver's grader and course folder for local workers; a cluster's nodes have their own install
            env = {"PYTHONPATH": os.pathsep.join(filter(None, [PACKAGE_PARENT, os.environ.get("PYTHONPATH")]))}
            for var in ("GRADER_COURSE", "GRADER_LOCK_DIR"):  # the reference folder travels in the context
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
                    ref = task.options(max_retries=0, **resources).remote(job.to_json(), pack_repo(Path(job.repo)))
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
                        data, log_text = ray.get(ref)
                        record = JobRecord.from_json(data, where=f"the Ray task's record of {job.label}")
                    except Exception as exc:  # the task or its node died: ours, not the student's
                        record, log_text = new_record(job, "infra_error",
                                                      f"the Ray task failed: {type(exc).__name__}: {exc}",
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

    def _finish(self, sched: Scheduler, job: Job, record: JobRecord, log_text: str) -> None:
        out = Path(job.out)
        log_file = log_path(out, job.folder, job.assignment)
        log_file.parent.mkdir(parents=True, exist_ok=True)
        with open(log_file, "a") as log:
            log.write(f"\n=== {now()} attempt {job.tries} of {job.label} on Ray node {record.node or '?'} ===\n"
                      f"{log_text}")
        store_record(out, record)
        sched.finish(job, record)

    def stop(self) -> None:
        self.stopping = True

    def join(self) -> None:
        pass  # run() cancels what is in flight as it returns
