"""`grader check` for students and CI, `grader list` for everyone.

A check runs in stages: its options are read once (CheckOptions), `prepare` opens the submission
and resolves the grading context, `run_check` grades and returns the RunResult, and the outputs
are sinks (grader.cli.outputs) chosen by the CI mode: nothing in the grading writes an output.

Exit codes: 0 every check that ran passed; 1 some check failed; 2 usage or infrastructure
error, with a one-line message.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import stat
import time
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import List, Optional, Sequence

import typer
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from grader import spec as specs
from grader.cli.common import ISOLATION_HELP, UsageError, console, err, is_terminal, say, shown
from grader.cli.outputs import (
    OUTPUT_DIR,
    CheckSetup,
    Classroom50Sink,
    GitHubSink,
    HtmlSink,
    JsonSink,
    RunnerStopSink,
    Sink,
    TerminalSink,
    is_default_folder,
    output_folder,
)
from grader.device import Device
from grader.results import Outcome, RunResult
from grader.sanitize import one_line
from grader.settings import Settings
from grader.submission import SubmissionError, open_submission


class NothingToGrade(UsageError):
    """The submission holds none of the course's assignments: the student's problem, graded 0 in CI."""


class BrokenSpec(UsageError):
    """A course spec that breaks the contract (grader.spec.SpecError): its files and rules, said
    before anything runs as any unusable input is (exit 2; in CI, the check's error report)."""


def select_assignments(sub, names: list[str] | None, course: specs.Course) -> list[specs.Assignment]:
    try:
        catalogue = course.catalogue()
    except specs.SpecError as exc:
        raise BrokenSpec(str(exc)) from None
    if names:
        try:
            return [course.get(n) for n in names]
        except specs.UnknownAssignment as exc:
            raise UsageError(exc.args[0]) from None
    if not catalogue:
        raise UsageError(f"no course found: no assignments/ in {course.root}. Run grader check inside your "
                         f"repository (the folder with {specs.KIT_MANIFEST}), "
                         "or set GRADER_COURSE to the course folder")
    # a problem is graded: the student's outcome
    found = [s for s in catalogue.values() if sub.has(s) or sub.problem(s)]
    problems = toml_problems(sub, catalogue)
    if not found:
        # grader.toml's paths: one line each
        looked = ", ".join(one_line(sub.target(s)[0], 200) for s in catalogue.values())
        raise NothingToGrade(f"no assignment found in {sub.root} (looked for {looked})"
                         + "".join(f"\n  {p}" for p in problems))
    for p in problems:  # the rest is checked; what grader.toml names in vain is said, not skipped in silence
        say(err, f"[yellow]warning:[/yellow] {shown(p)}")
    return found


def toml_problems(sub, catalogue: dict) -> list[str]:
    """What the submission's grader.toml names that is not there: a module file that does not
    exist, an assignment that does not exist. (An entry of the wrong shape is that assignment's
    outcome, `Submission.problems`.)"""
    problems = []
    for name in [*sub.overrides, *sub.problems]:
        label = one_line(name, 60)
        if name not in catalogue:
            problems.append(f"grader.toml names [assignments.{label}], which is not an assignment "
                            f"(known: {', '.join(catalogue)})")
        elif "module" in sub.overrides.get(name,
                                           {}) and not sub.has(catalogue[name]) and not sub.problem(catalogue[name]):
            module = sub.overrides[name]["module"]
            problems.append(f"grader.toml sets [assignments.{label}] module = \"{one_line(module, 120)}\", "
                            f"but {one_line(sub.root / module, 200)} does not exist")
    return problems


# --ci: classroom50 and github write their platform's outputs; classmoji writes the plain output (Classmoji
# reads a command's exit code alone) but is a CI job as the others are; none is plain output
CI_MODES = ("classroom50", "github", "classmoji", "none")


@dataclass(frozen=True)
class CheckOptions:
    """`grader check`'s command line, read once: what preparing, grading and every output are given."""

    repo: Path = Path(".")
    assignments: list[str] | None = None
    json_file: Path = OUTPUT_DIR / "results.json"
    html_dir: Path = OUTPUT_DIR
    device: str = "auto"
    seed: int | None = None
    cases: list[str] | None = None
    dtypes: list[str] | None = None
    timeout: float | None = None
    isolation: str = "sandbox"
    jobs: int | None = None
    ci: str | None = None  # --ci as given
    ci_mode: str | None = None  # the CI output written: classroom50, github or None (grader.kit.classroom50.mode)
    profile_store: Path | None = None  # --profile: where the replay's records are kept for it (grader.judge.profiling)

    @classmethod
    def parse(cls, repo: Path, assignment: list[str] | None, json_file: Path | None, html_dir: Path | None, device: str,
              seed: int | None, case: list[str] | None, dtype: list[str] | None, timeout: float | None, isolation: str,
              jobs: int | None, ci: str | None) -> "CheckOptions":
        """The options with their defaults; an option that cannot work is said by `validate`, once
        the outputs of an earlier check are cleared."""
        from grader.kit import classroom50

        return cls(repo, assignment, json_file or OUTPUT_DIR / "results.json", html_dir or OUTPUT_DIR, device, seed,
                   case, dtype, timeout, isolation, jobs, ci, classroom50.mode(ci if ci in CI_MODES else None))

    def validate(self) -> None:
        if self.ci not in (None, *CI_MODES):
            raise UsageError(f"--ci must be {', '.join(CI_MODES[:-1])} or none, not {self.ci!r}")
        if self.jobs is not None and self.jobs < 1:
            raise UsageError(f"--jobs must be 1 or more, not {self.jobs}")

    def in_ci(self, settings: Settings) -> bool:
        """This check is a CI job: a --ci mode of a platform (classroom50, github, classmoji), or
        `settings` found CI (its variables, or a runner's work folder around the working
        directory, where a platform passed none of them). A CI job never grades with a weaker
        sandbox than asked and keeps nothing warm after it."""
        return self.ci_mode is not None or self.ci == "classmoji" or settings.in_ci

    @property
    def reproducer(self) -> str:
        """The start of every reproducer: in CI the one the student pastes in their own clone (no
        path of the runner's)."""
        where = "." if self.ci_mode is not None or self.ci == "classmoji" else shlex.quote(str(self.repo))
        return f"grader check {where}" + ("" if self.device == "auto" else f" --device {self.device}")


class CheckNotRun(Exception):
    """The check stopped before grading: `error` says why (one line, exit 2 unless a sink says
    otherwise); `unreadable` when it is the submission's own fault, which CI grades 0."""

    def __init__(self, error: Exception, unreadable: bool) -> None:
        super().__init__(str(error))
        self.error, self.unreadable = error, unreadable


def sinks_for(options: CheckOptions, settings: Settings, course: specs.Course) -> list[Sink]:
    """The outputs of a check of `course`: results.json, report.html and the terminal always, and
    the CI mode's; in this order, so the files exist before anything points at them."""
    from grader.kit.points import shipped_points

    points = shipped_points(course)  # a kit's or an autograder's: course.toml's points, {} elsewhere
    html = HtmlSink(options.html_dir, points)
    ci = options.in_ci(settings)
    sinks: list[Sink] = [JsonSink(options.json_file, points), html,
                         TerminalSink(settings, ci, options.json_file, html, points)]
    if options.ci_mode == "classroom50":
        sinks.append(Classroom50Sink(options.repo, options.assignments, course))
    elif options.ci_mode == "github":
        sinks.append(GitHubSink(options.repo, course))
    elif ci:  # Classmoji's command grader, or a plain CI job: a stop the runner caused says so, annotated
        sinks.append(RunnerStopSink("classmoji" if options.ci == "classmoji" else "ci"))
    return sinks


def prepare(options: CheckOptions, settings: Settings, course: specs.Course, sinks: Sequence[Sink] = ()) -> CheckSetup:
    """Everything before grading: the outputs of an earlier check cleared, the options checked,
    the submission opened, the assignments chosen, the grading context resolved, the cache and
    the sandbox made ready. CheckNotRun where any of it cannot be."""
    from grader.judge.context import ContextError
    from grader.judge.runcache import CacheSettingError
    from grader.kit.classroom50 import Classroom50Error
    from grader.safefiles import UnsafeFolderError
    from grader.sandbox.isolation import SandboxError

    try:
        # before anything can fail: no earlier (or committed) result survives this check
        fresh_outputs(options.json_file, options.html_dir)
        options.validate()
        for sink in sinks:
            sink.begin()
        sub = open_submission(options.repo)
        return _setup(options, settings, course, sub, select_assignments(sub, options.assignments, course))
    except (UsageError, ContextError, SubmissionError, SandboxError, CacheSettingError, OutputFolderError,
            Classroom50Error, UnsafeFolderError) as exc:
        unreadable = isinstance(exc, NothingToGrade) or (isinstance(exc, SubmissionError)
                                                         and Path(options.repo).is_dir())
        raise CheckNotRun(exc, unreadable) from exc


def _setup(options: CheckOptions, settings: Settings, course: specs.Course, sub,
           chosen: list[specs.Assignment]) -> CheckSetup:
    """The grading context of the chosen assignments, the kept cache and warm zygote, the sandbox."""
    from grader.judge.context import resolve
    from grader.judge.runcache import check_cache_folder, check_cache_limit
    from grader.sandbox.process import as_asked, detect
    from grader.sandbox.zygote import SandboxState

    keep = usable_cache(check_cache_folder(settings))  # what the next check on this machine reuses
    ctx = resolve(options.device, options.seed, options.cases, options.dtypes, options.timeout, options.isolation,
                  hide=[options.json_file.resolve().parent, options.html_dir.resolve(), *([keep] if keep else [])],
                  reproducer=options.reproducer, partial_points=True, course=course)
    unmatched = ctx.unmatched(chosen)  # never dropped in silence: a typo would pass as a check of nothing
    if unmatched:
        raise UsageError("\n".join(unmatched))
    if (options.cases or options.dtypes) and not any(ctx.calls(s) for s in chosen):
        raise UsageError(f"--case and --dtype together choose no case of {', '.join(s.name for s in chosen)}")
    if options.profile_store is not None:  # --profile: the replay's records kept for the profile after grading
        ctx = replace(ctx, replay_store=str(options.profile_store))
    if ctx.device == Device.CUDA:  # the GPU locks another user may have planted: refused now, not mid-grading
        from grader.judge.devicelock import refuse_unsafe_locks

        refuse_unsafe_locks([ctx.gpu], settings)
    sandbox = SandboxState()  # the check's session's: its workers, the probe and the replays fork from its zygotes
    if keep is not None:  # workers forked at once by a zygote that outlives this command
        sandbox.keep_warm(keep / "warm", settings.warm.keep_seconds)
        ctx = replace(ctx, durations=str(keep / "durations.json"))
    # in CI nothing less than the isolation asked for will do; on a student's own machine it may
    # fall back, said first (by the terminal's sink)
    ci = options.in_ci(settings)
    contained = as_asked(ctx.isolation, settings, sandbox) if ci else detect(ctx.isolation, settings, sandbox)
    if keep is not None and ctx.device == Device.CUDA:  # input sets, kernels: the interpreter times, compiles nothing
        # a CI runner may check every student's repository in turn: no student's kernels are kept there
        shared_runner = ci
        ctx = ctx.kept_between_checks(keep, check_cache_limit(settings), options.seed is not None,
                                      own_uid=not contained.user_switch,
                                      kernels_of=None if shared_runner else sub.identity())
    return CheckSetup(sub, chosen, ctx, contained, keep, sandbox)


def run_check(options: CheckOptions, settings: Settings, course: specs.Course, sinks: Sequence[Sink] = (),
              progress=None) -> RunResult:
    """Grade a submission as `options` ask and return the run as a batch would store and read it
    back (results.json, the report and the summary come from that form, so a check shows whatever
    a batch would lose). Each sink is told when the check begins and starts; the outcome is theirs
    to write (`finished`). `progress(total)`: a context giving the step callback. CheckNotRun:
    nothing was graded."""
    from grader.judge.grade import count_steps
    from grader.judge.session import open_session

    setup = prepare(options, settings, course, sinks)
    for sink in sinks:
        sink.started(setup)
    jobs = check_jobs(options.jobs, setup.ctx.device, len(setup.chosen))
    with (progress or _no_progress)(count_steps(setup.chosen, setup.ctx)) as step:
        run = open_session(setup.ctx, settings, course, setup.sandbox).grade(setup.sub, setup.chosen, step, jobs=jobs)
    return RunResult.from_json(run.to_json())


def exit_code(run: RunResult) -> int:
    """0 every check that ran passed, 1 some failed, 2 an infra_error."""
    if any(t.outcome == Outcome.INFRA_ERROR for t in run.tests):
        return 2
    return 0 if run.all_passed else 1


def check(
    repo: Path = typer.Argument(Path("."), help="The submission's folder (your repo)."),
    assignment: Optional[List[str]] = typer.Option(None, "--assignment", "-a",
                                                   help="Only these assignments (repeatable)."),
    json_file: Optional[Path] = typer.Option(None, "--json",
                                             help=f"Where to write results.json (default: {OUTPUT_DIR}/results.json)."),
    html_dir: Optional[Path] = typer.Option(None, "--html", help=f"Folder for report.html (default: {OUTPUT_DIR}/)."),
    device: str = typer.Option("auto", help="auto (GPU if present), cuda, or cpu (Triton's interpreter)."),
    seed: Optional[int] = typer.Option(None, help="Seed for inputs and random shapes (default: a new one, printed)."),
    case: Optional[List[str]] = typer.Option(None, "--case", help="Only the named case(s), e.g. from a reproducer."),
    dtype: Optional[List[str]] = typer.Option(None, "--dtype", help="Only these dtypes: float32, float16, bfloat16."),
    timeout: Optional[float] = typer.Option(None, help="Seconds one call may take (default: the assignment's)."),
    isolation: str = typer.Option("sandbox", help=ISOLATION_HELP),
    jobs: Optional[int] = typer.Option(None, "--jobs", "-j",
                                       help="Assignments graded at once (default: one per CPU core "
                                       "in the interpreter, one on a GPU)."),
    ci: Optional[str] = typer.Option(None, "--ci", help="classroom50: result.json, release-body.md and a commit status "
                                     "for Classroom 50 (default in GitHub Actions when CLASSROOM and SUBMISSION_TAG "
                                     "are set); github: a job summary, annotations and the classroom-resources result "
                                     "output (default otherwise in GitHub Actions); classmoji: plain output for "
                                     "Classmoji's command grader, whose environment says nothing of CI; none: plain. "
                                     "Every CI job (any of these in CI) refuses a weaker sandbox and keeps nothing "
                                     "warm."),
    profile: bool = typer.Option(False, "--profile", help="After grading, profile your kernels and the reference's "
                                 "with Nsight Compute on the GPU and say what explains the gap (never changes a "
                                 "grade)."),
) -> None:
    """Run the public checks on a submission and explain every failure."""
    from grader.settings import from_environment

    settings = from_environment()  # read once: the session grades with these
    course = specs.Course.find(settings)  # and this course, found once
    options = CheckOptions.parse(repo, assignment, json_file, html_dir, device, seed, case, dtype, timeout, isolation,
                                 jobs, ci)
    if options.in_ci(settings):  # a CI job's machine is thrown away: no process of ours outlives the job
        settings = settings.for_ci()
    sinks = sinks_for(options, settings, course)
    store = None
    if profile:  # only asked for: nothing of the profile is imported or kept otherwise
        import tempfile

        store = Path(tempfile.mkdtemp(prefix="grader-profile-records-"))
        options = replace(options, profile_store=store)
    try:
        try:
            run = run_check(options, settings, course, sinks, progress=_progress)
        except CheckNotRun as stop:
            codes = [sink.not_run(stop.error, stop.unreadable) for sink in sinks]
            raise typer.Exit(next((c for c in codes if c is not None), 2)) from None
        except specs.CourseCodeError as exc:  # the assignment is broken: its one line, and each CI sink's stop
            for sink in sinks:
                sink.not_run(exc, False)
            raise typer.Exit(2) from None
        profiles = _profiles(run, options, settings, course, store) if store is not None else []
    finally:
        if store is not None:
            shutil.rmtree(store, ignore_errors=True)
    for sink in sinks:
        if isinstance(sink, HtmlSink):
            sink.profiles = profiles
    codes = [_finished(sink, run) for sink in sinks]
    if profiles:
        _say_profiles(profiles)
    raise typer.Exit(next((c for c in codes if c is not None), exit_code(run)))


def _finished(sink: Sink, run: RunResult) -> int | None:
    """The sink's outcome written; where the machine ran out of disk or memory, that said in one
    line (exit 2) and the next sink still written: the terminal shows what was graded."""
    from grader.judge.grade import exhausted
    from grader.safefiles import UnsafeFolderError

    try:
        return sink.finished(run)
    except UnsafeFolderError as exc:  # changed since the check began
        err.print(f"[red]error:[/red] {escape(str(exc))}")
        return 2
    except (OSError, MemoryError) as exc:
        cause = exhausted(exc)
        if cause is None:
            raise
        err.print(f"[red]error:[/red] the machine ran out of {cause} writing this check's results "
                  f"({escape(one_line(str(exc), 200))}): free some and check again")
        return 2


def _profiles(run: RunResult, options: CheckOptions, settings: Settings, course: specs.Course, store: Path) -> list:
    """--profile, after grading: each timed assignment's profile, or why there is none (said on
    stderr at once, in one line: the check goes on)."""
    from grader.judge import profiling

    why = profiling.unavailable(Device.CUDA if run.environment.get("mode") == "gpu" else Device.CPU,
                                options.isolation)
    if why:
        err.print(f"[yellow]--profile:[/yellow] {escape(why)}")
        return []
    err.print("Profiling the replays of your kernels and the reference's with Nsight Compute...")
    profiles = profiling.profile_run(run, course, store, options.isolation, None, settings)
    if not profiles:
        err.print("[yellow]--profile:[/yellow] no profile: no assignment of this check was timed")
    return profiles


def _say_profiles(profiles: list) -> None:
    from grader.profile.explain import lines

    for p in profiles:
        if p.explanation is None:
            err.print(f"[yellow]--profile:[/yellow] {escape(p.why_not)}")
            continue
        for line in lines(p.assignment, p.explanation):
            console.print(escape(line))


PIPED_PROGRESS_EVERY = 10.0  # seconds between two progress lines where no live bar can be drawn


@contextmanager
def _progress(total: int):
    """A step callback: a live bar on a terminal; piped (a file, a CI log), where a bar shows
    nothing until the end, a line at the start and then at most one every PIPED_PROGRESS_EVERY
    seconds, so a check that takes minutes in the interpreter is never silent."""
    if is_terminal(console):  # a terminal for real: FORCE_COLOR in a CI log draws no bar
        with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                      console=console, transient=True) as bar:
            task = bar.add_task("starting", total=total)
            yield lambda text: bar.update(task, advance=1, description=text)
        return
    started = time.monotonic()
    state = {"done": 0, "said": started}
    console.print(f"  [0/{total}] starting the workers", soft_wrap=True, markup=False)

    def step(text: str) -> None:
        state["done"] += 1
        now = time.monotonic()
        if now - state["said"] >= PIPED_PROGRESS_EVERY:
            state["said"] = now
            console.print(f"  [{state['done']}/{total}, {now - started:.0f} s] {one_line(text, 200)}", soft_wrap=True,
                          markup=False)

    yield step


@contextmanager
def _no_progress(total: int):
    yield lambda text: None


WORKER_MEMORY = 2 << 30  # what one interpreter worker may take (torch, Triton, the interpreted case's tensors)


def check_jobs(asked: int | None, device: Device, assignments: int) -> int:
    """How many assignments a check grades at once: as asked; else in the interpreter one per
    core (each worker interprets on one core) while memory allows, on a GPU one (its phases
    share one device)."""
    if asked is not None:
        return asked
    if device != Device.CPU:
        return 1
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    return max(1, min(cores, assignments, available_memory() // WORKER_MEMORY))


def available_memory() -> int:
    """Bytes this machine can still give (MemAvailable); where it cannot say, enough for one."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return WORKER_MEMORY


def usable_cache(folder: Path | None) -> Path | None:
    """The check's cache folder if it can be made ours alone (0700); else None, said once: a
    check without it is slower, not wrong. One that another user may change (it, or a folder on
    its way, is theirs or theirs to write: grader.safefiles.trusted_folder) is refused, exit 2:
    the warm judge and worker start import from it."""
    if folder is None:
        return None
    from grader.safefiles import trusted_folder

    try:
        os.close(trusted_folder(folder, "kept cache (GRADER_CACHE_DIR)",
                                "set GRADER_CACHE_DIR to a folder of yours that only you may write, such as "
                                "~/.cache/grader, or GRADER_CACHE_GB=0 to keep nothing"))
        return folder
    except OSError as exc:
        err.print(f"[yellow]warning:[/yellow] nothing is kept for the next check ({escape(str(exc))}); "
                  "set GRADER_CACHE_DIR to a writable folder, or GRADER_CACHE_GB=0")
        return None


class OutputFolderError(Exception):
    """The output folder cannot be made (one line, exit 2)."""


def fresh_outputs(json_file: Path, html_dir: Path) -> None:
    """Clear the way for this check's results. The default folder `.grader/` lies in the
    student's repo, so it may have been committed as anything: a link (to a TA's file, which a
    check would overwrite), a file, a folder holding forged results. It is never followed: a
    link or a non-folder there is removed and a fresh folder made. In every output folder the
    results.json and report.html of an earlier check are removed first (a link is removed, not
    followed), so a check that stops half way leaves nothing that looks like its result."""
    for folder in {json_file.parent, html_dir}:  # refused (exit 2) where another user may change it
        try:
            os.close(output_folder(folder))
        except OSError as exc:
            raise OutputFolderError(f"cannot make the output folder {folder}: {exc.strerror or exc}") from None
    try:
        for folder in {json_file.parent, html_dir}:
            if is_default_folder(folder) and (folder.is_symlink() or (os.path.lexists(folder) and not folder.is_dir())):
                folder.unlink()
        for stale in (json_file, html_dir / "report.html"):
            # lstat alone: a link is never followed, not even to ask what it leads to (a link to
            # a file this user may not reach would raise here)
            if os.path.lexists(stale) and stat.S_ISDIR(os.lstat(stale).st_mode):
                if not is_default_folder(stale.parent):
                    raise OutputFolderError(f"{stale} is a folder: it cannot be replaced by the results")
                shutil.rmtree(stale)
            elif os.path.lexists(stale):
                stale.unlink()
    except OSError as exc:
        raise OutputFolderError(f"cannot clear the output folder: {exc}") from None


def list_assignments(
    as_json: bool = typer.Option(False, "--json", help="Print the assignments as JSON (for scripts)."),
) -> None:
    """Show the assignments, their interfaces and points."""
    from grader.settings import current

    rows = [assignment_info(s) for s in specs.Course.find(current()).catalogue().values()]
    if as_json:
        print(json.dumps(rows, indent=2))
        return
    table = Table(title="Assignments")
    for col in ("name", "module", "interface", "points", "cases"):
        table.add_column(col, no_wrap=True)
    for r in rows:
        table.add_row(r["name"], r["module"], r["interface"], r["points_words"], r["cases_words"])
    cols = ("name", "module", "interface", "points_words", "cases_words")
    needed = sum(max(len(r[c]) for r in rows) + 3 for c in cols) + 1  # a cell's text, its padding and border
    if is_terminal(console) and needed <= console.width:
        console.print(table)
        return
    # piped, or a terminal too narrow for the table: one block per assignment, nothing cut
    for r in rows:
        print(f"{r['name']}: {r['title']}")
        for key in ("module", "interface", "points", "cases"):
            print(f"  {key + ':':<10} {r[key + '_words'] if key in ('points', 'cases') else r[key]}")


def assignment_info(s: specs.Assignment) -> dict:
    """One assignment as `grader list` shows it, words and figures."""
    perf = f" + {s.performance_points:g} speed" if s.performance_points else ""
    hidden = f" + {s.hidden_count} hidden" if s.hidden_count else ""
    return {"name": s.name, "title": s.title, "module": s.module, "function": s.function, "interface": s.signature,
            "correctness_points": s.correctness_points, "performance_points": s.performance_points,
            "named_cases": [c.name for c in s.public_cases], "hidden_cases": s.hidden_count, "dtypes": list(s.dtypes),
            "points_words": f"{s.correctness_points:g} correctness{perf}",
            "cases_words": f"{len(s.public_cases)} named{hidden} + random, {', '.join(s.dtypes)}"}


def register(app: typer.Typer) -> None:
    app.command()(check)
    app.command("list")(list_assignments)
