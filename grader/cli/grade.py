"""`grader grade`: a whole class graded (GradeOptions read once, grade_setup -> run_grade),
from a lock, or from a roster fetched first (grader.cli.fetch). Reads course.toml
(grader.batch.course); its flags override it.

Exit codes: 0 every job graded (students failing checks is not an error of the batch); 1 some
job ended in infra_error after its retries, or nothing at all was graded (no student could be
fetched); 130 interrupted (everything finished so far is kept: run again with --resume); 2 for a
usage error or a malformed roster, lock or course file, with one line.
"""

from __future__ import annotations

import os
import signal
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any, List, Optional

import typer
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

from grader import spec as specs
from grader.cli.classfiles import load_course_or_fail
from grader.cli.common import ISOLATION_HELP, STYLE, UsageError, console, err, shown
from grader.cli.common import fail as _fail
from grader.cli.fetch import fetch_class
from grader.environment import has_gpu
from grader.sandbox import docker
from grader.settings import Settings, current

DEFAULT_JOBS_PER_GPU = 2


def resolve_slots(device: str, gpus: str, jobs: Optional[int], settings: Settings) -> tuple[list, str]:
    """One entry per pool slot: the CUDA_VISIBLE_DEVICES token of its GPU (None on the CPU), and
    the GPU model every result is keyed on (a class is graded on one model of GPU)."""
    if device == "cpu":
        n = jobs or os.cpu_count() or 1
        return [None] * max(1, n), "cpu-interpreter"
    import torch

    count = torch.cuda.device_count()
    if gpus == "all":
        chosen = list(range(count))
    else:
        try:
            chosen = [int(g) for g in gpus.split(",") if g.strip()]
        except ValueError:
            raise UsageError(f"--gpus must be 'all' or indices like 0,1, not {gpus!r}") from None
        wrong = [g for g in chosen if not 0 <= g < count]
        if wrong or not chosen:
            raise UsageError(f"--gpus {gpus}: this machine has GPUs 0..{count - 1}")
    models = {torch.cuda.get_device_name(i) for i in chosen}
    if len(models) > 1:
        raise UsageError(f"--gpus selects GPUs of different models ({', '.join(sorted(models))}): "
                         "their timings do not compare; grade a class on one model")
    visible = settings.visible_gpus
    tokens = [t.strip() for t in visible.split(",")] if visible else [str(i) for i in range(count)]
    n = jobs or DEFAULT_JOBS_PER_GPU * len(chosen)
    return [tokens[chosen[i % len(chosen)]] for i in range(max(1, n))], models.pop()


@dataclass(frozen=True)
class GradeOptions:
    """`grader grade`'s command line, read once (the fields are named as the options are)."""

    roster: Path | None = None
    lock_file: Path | None = None
    assignment: list[str] | None = None
    out: Path = Path("reports")
    device: str = "auto"
    gpus: str = "all"
    jobs: int | None = None
    resume: bool = False
    only: list[str] | None = None
    reference_dir: Path | None = None
    seed: int | None = None
    case: list[str] | None = None
    dtype: list[str] | None = None
    timeout: float | None = None
    isolation: str = "sandbox"
    job_timeout: float | None = None
    retries: int = 1
    executor: str = "local"
    address: str | None = None
    org: str | None = None
    prefix: str | None = None
    branch: str | None = None
    deadline: str | None = None
    course_file: Path | None = None
    similarity_threshold: float | None = None
    profile: bool = False  # after grading: each timed job's replays profiled (grader.judge.profiling)

    def validate(self) -> None:
        """The options that cannot work together, said before anything is read."""
        if (self.roster is None) == (self.lock_file is None):
            raise UsageError("give either --roster ROSTER or --lock LOCK")
        if self.similarity_threshold is not None and not 0 < self.similarity_threshold <= 1:
            raise UsageError("--similarity-threshold must be in (0, 1]")
        if self.executor not in ("local", "ray"):
            raise UsageError(f"--executor must be local or ray, not {self.executor!r}")
        if self.jobs is not None and self.jobs < 1:
            raise UsageError("--jobs must be at least 1")


@dataclass
class GradeSetup:
    """What a class is graded with: the assignments, the grading context, the pool's slots and
    the GPU model every result is keyed on, and the lock (None until a roster is fetched)."""

    names: list[str]
    ctx: Any  # grader.judge.context.GradingContext
    slots: list
    gpu_model: str
    lock: Any = None  # grader.batch.workspace.Lock


def grade_setup(options: GradeOptions, course, catalogue: specs.Course, settings: Settings) -> GradeSetup:
    """The options checked and resolved into a context, the pool's slots and the lock; a usage
    error (exit 2) where they cannot be. `course`: course.toml's; `catalogue`: the course folder."""
    from grader.batch.run import class_seed
    from grader.batch.workspace import LockError, read_lock
    from grader.judge.context import ContextError
    from grader.safefiles import OWN, UnsafeFolderError, trusted_folder

    try:
        options.validate()
        # the class folder is written by path from here on: refused where another user may change it
        try:
            os.close(trusted_folder(options.out, "class folder (--out)",
                                    "choose --out in a folder of yours that only you may write", kind=OWN))
        except OSError as exc:
            raise UsageError(f"cannot make the class folder {options.out}: {exc.strerror or exc}") from None
        names = options.assignment or course.order or list(catalogue.catalogue())
        for n in names:
            catalogue.get(n)
        if options.executor == "ray":
            import importlib.util

            if importlib.util.find_spec("ray") is None:
                raise UsageError("--executor ray needs Ray: pip install 'grader[ray]'")
        # the Ray cluster's GPUs; the driver has none
        remote = options.executor == "ray" and options.device == "cuda" and not has_gpu()
        ctx = resolve_context(options, names, class_seed(options.out, options.seed), remote, catalogue)
        if remote:
            slots, gpu_model = [None] * (options.jobs or 2), "GPUs of the Ray cluster"
        else:
            slots, gpu_model = resolve_slots(ctx.device, options.gpus, options.jobs, settings)
            if ctx.device == "cuda":  # the GPU locks another user may have planted: refused before any job
                from grader.judge.devicelock import refuse_unsafe_locks

                refuse_unsafe_locks(slots, settings)
        # said now, not by every job
        if ctx.isolation == "docker" and (problem := docker.missing(settings)) is not None:
            raise UsageError(problem)
        if not remote:  # a class is graded unattended: no weaker sandbox than asked (Ray's nodes detect their own)
            _isolation_as_asked(ctx.isolation, settings)
        lock = read_lock(options.lock_file) if options.lock_file is not None else None  # else fetched from the roster
        return GradeSetup(names, ctx, slots, gpu_model, lock)
    except specs.UnknownAssignment as exc:
        _fail(UsageError(exc.args[0]))
    except (UsageError, ContextError, LockError, UnsafeFolderError) as exc:
        _fail(exc)
    raise AssertionError("unreachable: _fail exits")


def resolve_context(options: GradeOptions, names: list[str], seed: int, remote: bool, catalogue: specs.Course):
    """The batch's grading context; a case or dtype that chooses nothing is a usage error."""
    from grader.judge.context import resolve

    ctx = resolve(options.device, seed, options.case, options.dtype, options.timeout, options.isolation,
                  hide=[options.out.resolve()], reference_dir=options.reference_dir, remote_gpu=remote,
                  reproducer="grader check .", partial_points=True, course=catalogue)
    unmatched = ctx.unmatched([catalogue.get(n) for n in names])  # a typo is said, never graded as nothing
    if unmatched:
        raise UsageError("\n".join(unmatched))
    if options.case or options.dtype:  # each assignment must have something to grade, else it would score 0 of nothing
        missing_cases = [n for n in names if not ctx.calls(catalogue.get(n))]
        if missing_cases:
            raise UsageError(f"--case/--dtype choose no case of {', '.join(missing_cases)}: "
                             "choose the assignments with -a")
    return ctx


def _isolation_as_asked(mode: str, settings: Settings) -> None:
    from grader.sandbox.isolation import SandboxError
    from grader.sandbox.process import as_asked
    from grader.sandbox.zygote import SandboxState

    try:  # probed here, before any job starts; the jobs' own sessions probe their own
        as_asked(mode, settings, SandboxState())
    except SandboxError as exc:
        raise UsageError(str(exc)) from None


def grade(
    roster: Optional[Path] = typer.Option(None, "--roster",
                                          help="Grade from a roster (fetched first into OUT/workspace)."),
    lock_file: Optional[Path] = typer.Option(None, "--lock", help="Grade the commits pinned by `grader fetch`."),
    assignment: Optional[List[str]] = typer.Option(None, "--assignment", "-a",
                                                   help="Only these assignments (default: all)."),
    out: Path = typer.Option(Path("reports"), "--out",
                             help="The class folder: students/, index.html, grades.csv, summary.json."),
    device: str = typer.Option("auto", help="auto (GPU if present), cuda, or cpu (Triton's interpreter)."),
    gpus: str = typer.Option("all", help="GPUs to spread jobs over: all, or indices like 0,1."),
    jobs: Optional[int] = typer.Option(None, help="Jobs at once (default: 2 per GPU, or one per CPU core)."),
    resume: bool = typer.Option(False, help="Skip jobs already graded at the same commit, spec, grader version and "
                                            "GPU model."),
    only: Optional[List[str]] = typer.Option(None, "--only", help="Regrade only these students (repeatable)."),
    reference_dir: Optional[Path] = typer.Option(None, "--reference-dir",
                                                 help="The private reference kernels (default: COURSE/reference)."),
    seed: Optional[int] = typer.Option(None,
                                       help="Seed for the class (default: the one stored in OUT, else a new one)."),
    case: Optional[List[str]] = typer.Option(None, "--case", help="Only the named case(s): for a quick dry run."),
    dtype: Optional[List[str]] = typer.Option(None, "--dtype", help="Only these dtypes."),
    timeout: Optional[float] = typer.Option(None, help="Seconds one call may take (default: the assignment's)."),
    isolation: str = typer.Option("sandbox", help=ISOLATION_HELP + " Every record says which ran."),
    job_timeout: Optional[float] = typer.Option(None,
                                                help="Seconds one job may take before it is killed (default: from the "
                                                     "plan)."),
    retries: int = typer.Option(1, help="Times an infra_error job is tried again in this run."),
    executor: str = typer.Option("local", help="local (a pool on this machine) or ray (a Ray cluster)."),
    address: Optional[str] = typer.Option(None, help="Ray: the cluster's address (default: a local Ray instance)."),
    org: Optional[str] = typer.Option(None, help="With a Classroom roster: the organization."),
    prefix: Optional[str] = typer.Option(None, help="With a Classroom roster: the assignment's repo prefix."),
    branch: Optional[str] = typer.Option(None, help="With --roster: the branch to grade."),
    deadline: Optional[str] = typer.Option(None, help="With --roster: pin the last commit dated on or before this."),
    course_file: Optional[Path] = typer.Option(None, "--course",
                                               help="The course file: assignments, points, late policy "
                                               "(default: COURSE/course.toml if there is one)."),
    similarity_threshold: Optional[float] = typer.Option(None, "--similarity-threshold",
                                                         help="List pairs of submissions at "
                                                         "least this similar on the dashboard (default: course.toml's, "
                                                         "else 0.6)."),
    profile: bool = typer.Option(False, "--profile", help="After grading, profile each timed job's kernels and the "
                                 "reference's with Nsight Compute and say what explains the gap (grades unchanged)."),
) -> None:
    """Grade a whole class: per-student reports, a dashboard, gradebooks; resumable."""
    options = GradeOptions(**locals())  # every parameter, by its name
    settings = current()  # read once: the batch's executors and sandbox work with these
    raise typer.Exit(run_grade(options, settings))



def run_grade(options: GradeOptions, settings: Settings) -> int:
    """Grade the class as `options` ask with the command's `settings`, say how it went, and
    return the exit code."""
    from grader.batch.run import BatchOptions, plan_batch

    catalogue = specs.Course.find(settings)
    course = load_course_or_fail(options.course_file, catalogue)
    setup = grade_setup(options, course, catalogue, settings)
    names, ctx = setup.names, setup.ctx
    lock = setup.lock
    if options.roster is not None:
        lock = fetch_class(options.roster, options.out / "workspace", options.deadline, options.org, options.prefix,
                           options.branch, 8, course, names, catalogue=catalogue)
    known = {p.student for p in lock.students}
    missing = [s for s in options.only or [] if s not in known]
    if missing:
        _fail(UsageError(f"--only: no student {', '.join(map(repr, missing))} in the lock "
                         f"(it has {len(known)} students)"))
    for n in names:
        if not ctx.reference_module(catalogue.get(n)).is_file() and ctx.device == "cuda":
            console.print(f"[yellow]no reference kernel for {n}: speed is reported against torch and not "
                          "scored[/yellow]")

    opts = BatchOptions(options.out.resolve(), names, ctx, setup.slots, setup.gpu_model, options.resume,
                        options.only or None, options.retries, options.executor, options.address,
                        job_timeout=options.job_timeout, course=course,
                        similarity_threshold=options.similarity_threshold, settings=settings, catalogue=catalogue)
    plan = plan_batch(lock, opts)
    slots = setup.slots
    where = "CPU interpreter (no timing, no bf16)" if ctx.device == "cpu" else f"{setup.gpu_model} x{len(set(slots))}"
    console.print(f"Grading {len(plan.jobs)} jobs ({len(plan.reused)} already graded, kept) on {where}, "
                  f"{len(slots)} at once ({options.executor}, isolation {ctx.isolation}), seed {plan.seed}")
    for line in plan.broken:
        console.print(f"[red]{shown(line, 500)}[/red]")
    for line in plan.refused:
        console.print(f"[yellow]{shown(line, 500)}[/yellow]")
    entry, warnings = _graded_with_progress(lock, opts, plan)
    code = _graded_exit(options.out, lock, plan, entry, warnings)
    if options.profile:  # after the grades are written: a profile changes none of them
        _profile_class(options.out, names, catalogue, ctx, settings)
    return code


def _profile_class(out: Path, names: list[str], catalogue: specs.Course, ctx, settings: Settings) -> None:
    """--profile: every job of `names` timed by replay in the class folder `out`, profiled from the
    records the batch kept (OUT/replay), each said in the terminal under its student; or, in one
    line, why there is no profile."""
    from grader.batch.store import read_json
    from grader.judge import profiling
    from grader.profile.explain import lines
    from grader.sanitize import one_line

    why = profiling.unavailable(ctx.device, ctx.isolation)
    if why:
        err.print(f"[yellow]--profile:[/yellow] {escape(why)}")
        return
    students = Path(out) / "students"
    for folder in sorted(p for p in students.iterdir() if p.is_dir() and not p.is_symlink()) \
            if students.is_dir() else []:
        for name in names:
            record = read_json(folder / "jobs" / f"{name}.json") or {}
            tests = (record.get("result") or {}).get("tests") or []
            perf = next((t.get("details") for t in tests if isinstance(t, dict) and t.get("kind") == "performance"
                         and isinstance(t.get("details"), dict) and t["details"].get("timed_by")), None)
            if perf is None:
                continue
            who = one_line(record.get("student") or folder.name, 80)
            p = profiling.profile_assignment(catalogue.get(name), perf, Path(out) / "replay", ctx.isolation,
                                             ctx.gpu, settings)
            if p.explanation is None:
                err.print(f"[yellow]--profile:[/yellow] {escape(who)}: {escape(p.why_not)}")
                continue
            for line in lines(f"{name} ({who})", p.explanation):
                console.print(escape(line))


def _graded_with_progress(lock, opts, plan) -> tuple[dict, dict[str, None]]:
    """Run the plan under a progress bar, each job's line as it ends; the run's manifest entry
    and the sandbox warnings the jobs' records carry, each once."""
    from grader.batch.run import run_batch

    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                  TextColumn("{task.fields[counts]}"),
                  TimeElapsedColumn(), TextColumn("ETA"), TimeRemainingColumn(), console=console,
                  transient=False) as bar:
        task = bar.add_task("grading", total=len(plan.jobs), counts="")
        counts = {"graded": 0, "infra_error": 0, "retried": 0}
        warnings: dict[str, None] = {}  # what each job's sandbox could not do here, said once at the end
        guard = threading.Lock()

        def on_event(kind: str, job, record) -> None:
            with guard:
                if kind == "start":
                    return
                if kind == "retry":
                    counts["retried"] += 1
                    bar.console.print(f"  [bold blue]infra_error[/bold blue] {shown(job.label)}: "
                                      f"{shown(record.error, 500)} (trying again)")
                elif kind == "not_run":  # after its assignment's course error
                    return
                elif kind == "done" and record.extra.get("course_error"):
                    counts["course_error"] = counts.get("course_error", 0) + 1
                    rest = ("none of its other jobs is run" if record.extra.get("course_error_stops", True)
                            else f"{shown(job.label)}; its property check raised on this result")
                    bar.console.print(f"  [red]course error[/red] {shown(job.assignment)}: {shown(record.error, 600)} "
                                      f"({rest})")
                    bar.advance(task)
                elif kind == "done":
                    isolation = (record.environment or {}).get("isolation") or {}
                    warnings.update(dict.fromkeys(isolation.get("warnings") or []))
                    counts[record.status] += 1
                    bar.console.print("  " + _job_line(job, record, opts.course))
                    bar.advance(task)
                bar.update(task, counts=", ".join(f"{v} {k}" for k, v in counts.items() if v))

        # a TERM stops as cleanly as Ctrl-C; and Ctrl-C always does, even where the shell that
        # started us in the background left SIGINT ignored (Python then installs no handler)
        previous = {sig: signal.signal(sig, _interrupt) for sig in (signal.SIGTERM, signal.SIGINT)}
        try:
            entry = run_batch(lock, opts, plan, on_event)
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
    return entry, warnings


def _graded_exit(out: Path, lock, plan, entry: dict, warnings: dict[str, None]) -> int:
    """The summary, the class's errors and the sandbox's warnings; the exit code."""
    _print_summary(out, lock, entry)
    for line in entry.get("class_errors") or []:
        err.print(f"[red]error:[/red] {shown(line, 600)}")
    for line in entry.get("not_compared") or []:  # a review aid that did not run: no error, but said
        err.print(f"[yellow]warning:[/yellow] {shown(line, 600)}")
    for warning in warnings:  # from the jobs' own records: what contained them (each job's probe, not a guess here)
        err.print(f"[yellow]warning:[/yellow] {shown(warning)}")
    if entry.get("interrupted"):
        return 130
    for name, error in (entry.get("course_errors") or {}).items():  # the course's, not any student's: exit 2
        err.print(f"[red]error:[/red] {shown(error, 600)} ({shown(name)}: nothing of it was graded)")
    if entry.get("course_errors"):
        return 2
    if not entry["graded"] and not entry["reused"]:  # a run that graded nothing is not a success
        fetched = sum(p.status == "fetched" for p in lock.students)
        why = "no student could be fetched" if not fetched else "no job was graded"
        err.print(f"[red]error:[/red] nothing was graded: {why} ({len(lock.students)} in the roster)")
        return 1
    return 1 if entry["infra_error"] or entry["not_run"] or plan.broken or entry.get("class_errors") else 0


def _interrupt(signum, frame):
    raise KeyboardInterrupt


def _job_line(job, record, course=None) -> str:
    """The job's points as it ends: in course.toml's points for the assignment where it scales them
    (the grade with a review and the late penalty is the summary's, after the class view)."""
    from collections import Counter

    from grader.batch.course import exact
    from grader.results import AssignmentResult, Outcome

    if record.status != "graded":  # a job status, shown in the infra_error outcome's style
        return f"[{STYLE[Outcome.INFRA_ERROR]}]infra_error[/] {shown(job.label)}: {shown(record.error, 500)}"

    result = AssignmentResult.from_json(record.result)
    outcomes = Counter(t.outcome for t in result.tests)
    words = ", ".join(f"[{STYLE[o]}]{n} {o}[/]" for o, n in outcomes.items() if o != Outcome.SKIPPED)
    # a partial run: out of all its points
    top = result.partial["assignment_points"] if result.partial else result.max_score
    score: float = result.score
    if course is not None and job.assignment in course.points and top:
        scaled, points = course.scale(job.assignment, exact(score), exact(top))
        score, top = round(float(scaled), 4), float(points)
    partial = ", partial run" if result.partial else ""
    cpu = ", CPU only" if result.gpu_points_not_graded else ""
    return f"{shown(job.label)}: {score:g} / {top:g}{partial}{cpu} ({words}) in {record.seconds:.0f} s"


SUMMARY_GRADES = 60  # the most grades the summary lists one a line


def _print_summary(out: Path, lock, entry: dict) -> None:
    unfetched = [p for p in lock.students if p.status != "fetched"]
    console.print(f"\n[bold]{entry['graded']} jobs graded[/bold], {entry['infra_error']} infra errors, "
                  f"{entry['reused']} kept from before, in {entry['wall_s']:.0f} s")
    for p in unfetched:
        console.print(f"  [red]unfetched[/red] {shown(p.student)}: {shown(p.reason, 500)}")
    if entry.get("interrupted"):
        console.print(f"[yellow]Interrupted: {entry['not_run']} jobs not finished. Everything graded so far is kept; "
                      "run the same command with --resume to finish.[/yellow]")
    if entry.get("partial"):
        console.print("[yellow]Partial run (--case/--dtype): each score is the chosen cases' share of the assignment's "
                      "points, as grader check counts it, and no grade: the gradebooks name those columns "
                      "'(partial run)'. Grade without --case/--dtype for the grades.[/yellow]")
    grades = entry.get("grades") or []
    if grades and len(grades) <= SUMMARY_GRADES:  # a larger class reads them in grades.csv
        console.print("[bold]Grades[/bold] (as every gradebook, report and publish has them):")
        for g in grades:
            console.print(f"  {shown(g.student, 80)} {shown(g.assignment, 80)}: {shown(g.headline(), 200)}")
    # no gradebook where course.toml refused an incomplete grade (its error line is above)
    book = out / "grades.csv" if (out / "grades.csv").is_file() else "none written"
    console.print(f"dashboard: {out / 'index.html'}   gradebook: {book}   summary: {out / 'summary.json'}")


def register(app: typer.Typer) -> None:
    app.command("grade")(grade)
