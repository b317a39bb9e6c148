"""A batch: a class x assignments planned as jobs (reusing what `--resume` may keep), run by
an executor (grader.batch.executors), then the class view written (grader.batch.classview).

Nothing is lost: a job process writes its record the moment its job ends; Ctrl-C stops the
jobs in flight, keeps every finished one and still writes the class view; `--resume` skips a
job whose record is a real grade with the same key (grader.batch.jobs.job_key).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Callable

from grader.batch.jobs import Job, job_key, new_record, now
from grader.batch.record import JobRecord, RecordError
from grader.batch.store import MANIFEST, is_reusable, read_json, read_record, record_path, repair_students, store_record
from grader.judge.context import GradingContext
from grader.results import write_json_atomic
from grader.settings import Settings
from grader.spec import Course


@dataclass
class BatchOptions:
    """How a class is run (the grading itself is the context's: one for every job)."""

    out: Path
    assignments: list[str]
    context: GradingContext
    slots: list[str | None]  # one GPU per pool slot (None on the CPU)
    gpu_model: str
    resume: bool = False
    only: list[str] | None = None
    retries: int = 1
    executor: str = "local"
    address: str | None = None
    per_gpu: int = 2
    job_timeout: float | None = None
    course: object = None  # grader.batch.course.CourseConfig: points, late policy (the class view applies them)
    similarity_threshold: float | None = None
    # the command's (grader.settings): the executors' warm starts and threads; given by name, never defaulted
    settings: Settings = field(kw_only=True)
    catalogue: Course | None = None  # grader.spec.Course: the course folder whose assignments are graded


def class_seed(out: Path, given: int | None) -> int:
    """The seed a class is graded with: the one given, else the one its folder was graded with
    before (so a later run grades the same shapes and inputs), else a new secret one."""
    import secrets

    if given is not None:
        return given
    stored = (read_json(Path(out) / MANIFEST) or {}).get("seed")
    return stored if isinstance(stored, int) else secrets.randbelow(2**31)


@dataclass
class BatchPlan:
    jobs: list[Job]
    reused: list[Job]
    seed: int
    broken: list[str] = field(default_factory=list)
    refused: list[str] = field(default_factory=list)  # kept records --resume could not use: graded again


def plan_batch(lock, opts: BatchOptions) -> BatchPlan:
    """Every (fetched student, assignment) job; with --resume, those with a reusable grade apart."""
    from grader.batch.workspace import ensure_checkout

    out = Path(opts.out).resolve()
    ctx = replace(opts.context, replay_store=str(out / "replay"))  # the records `grader verify` re-times
    plan = BatchPlan([], [], ctx.seed)
    for p in lock.students:
        if p.status != "fetched" or (opts.only and p.student not in opts.only):
            continue
        try:
            repo = str(ensure_checkout(lock, p))
        except Exception as exc:  # the cache was removed or damaged after fetch
            repo, why = "", (f"the checkout of {p.student} in the workspace is missing or damaged ({exc}): run grader "
                             f"fetch again")
            plan.broken.append(why)
        for name in opts.assignments:
            assert opts.catalogue is not None  # the command gives the course folder it grades
            spec = opts.catalogue.get(name)
            job = Job(p.student, p.folder, name, repo, p.repo, p.commit, job_key(p.commit, spec, opts.gpu_model, ctx),
                      str(out), ctx.to_json(), notes=list(p.notes))
            if not repo:
                store_record(out, new_record(job, "infra_error", plan.broken[-1]))
            elif opts.resume and _reusable(record_path(out, p.folder, name), job.key, plan.refused, p.student):
                plan.reused.append(job)
            else:
                plan.jobs.append(job)
    return plan


def _reusable(path: Path, key: dict, refused: list[str], student: str) -> bool:
    """A stored real grade with this key; a malformed record, or a file in its place that is no
    plain file (a link, a FIFO, a device, too large), is graded again (its job's new record
    replaces it), said in one line in `refused`."""
    try:
        return is_reusable(read_record(path), key)
    except RecordError as exc:
        refused.append(f"{student} {path.stem}: the kept record is not used ({exc}): graded again")
        return False


def make_executor(opts: BatchOptions, slots: list[str | None]):
    from grader.batch.executors import LocalExecutor, RayExecutor, default_job_timeout

    assert opts.catalogue is not None  # the command gives the course folder it grades
    timeout = (lambda job: opts.job_timeout) if opts.job_timeout else default_job_timeout(opts.catalogue)
    if opts.executor == "ray":
        return RayExecutor(opts.address, max_in_flight=len(slots), per_gpu=opts.per_gpu, job_timeout=timeout,
                           settings=opts.settings)
    return LocalExecutor(slots, job_timeout=timeout, settings=opts.settings)


def run_batch(lock, opts: BatchOptions, plan: BatchPlan, on_event: Callable[[str, Job, JobRecord | None], None],
              executor=None) -> dict:
    """Run the plan, then write the class view. Ctrl-C (KeyboardInterrupt) stops the jobs in
    flight, keeps every finished one and still writes the class view; returns this run's entry
    of the manifest."""
    from grader.batch.classview import write_class_outputs
    from grader.batch.executors import Scheduler
    from grader.batch.grades import class_grades
    from grader.judge.runcache import RunCache

    out = Path(opts.out).resolve()
    manifest = read_json(out / MANIFEST) or {}
    manifest["seed"] = plan.seed
    manifest["assignments"] = list(dict.fromkeys([*manifest.get("assignments", []), *opts.assignments]))
    manifest["lock"] = str(lock.root)
    entry = {"started": now(), "device": opts.context.device, "isolation": opts.context.isolation,
             "gpu_model": opts.gpu_model, "slots": opts.slots,
             "executor": opts.executor, "jobs": len(plan.jobs), "reused": len(plan.reused), "only": opts.only}
    manifest.setdefault("runs", []).append(entry)
    write_json_atomic(manifest, out / MANIFEST)

    executor = executor or make_executor(opts, opts.slots)
    # jobs on this host share one run cache (inputs, roofline, the reference's compiled kernels);
    # a Ray job on another node makes its own
    cache = RunCache.temporary() if opts.executor == "local" and opts.context.device == "cuda" else None
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
        entry.update(finished=now(), wall_s=round(time.time() - started, 1),
                     graded=sum(r.status == "graded" for r in done),
                     infra_error=sum(r.status == "infra_error" for r in done),
                     not_run=len(plan.jobs) - len(done))
        if sched.course_errors:  # the course's own, once per assignment (grader.spec.CourseCodeError)
            entry["course_errors"] = dict(sched.course_errors)
        write_json_atomic(manifest, out / MANIFEST)
        repair_students(out, [p.folder for p in lock.students if p.status == "fetched"])
        view = write_class_outputs(out, lock, manifest["assignments"], manifest, opts.course, opts.similarity_threshold,
                               catalogue=opts.catalogue)
        entry["class_errors"] = view.errors  # what of the class view could not be written (the rest was)
        entry["not_compared"] = not_compared(view)  # a review aid that did not run: said, costs no grade
        entry["partial"] = view.partial  # some grade is of --case/--dtype: the chosen cases' share, marked partial
        entry["grades"] = class_grades(view)  # each student's grade as every gradebook has it, for the summary
        if cache:
            cache.remove()
    return entry


def not_compared(view) -> list[str]:
    """Each assignment whose similarity did not run, and why (copydetect missing, a failure): the
    console says it as the dashboard does, instead of counts that read as if it ran."""
    per = (view.similarity_meta or {}).get("per_assignment", {})
    return [f"similarity of {a} not compared: {' '.join(str(c['error']).split())[:400]}"
            for a, c in per.items() if c.get("error")]
