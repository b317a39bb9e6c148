"""`grader check` for students and CI, `grader list` for everyone.

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
from pathlib import Path
from typing import List, Optional

import typer
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from grader import spec as specs
from grader.cli.common import (
    ISOLATION_HELP,
    STYLE,
    UsageError,
    commands_stopped,
    console,
    err,
    in_actions,
    say,
    shown,
    shown_lines,
)
from grader.judge.feedback import group_failures, points_line, run_total, smallest_words, traceback_tail
from grader.results import Outcome, RunResult, write_json_atomic, write_text_atomic
from grader.sanitize import one_line
from grader.submission import SubmissionError, open_submission

OUTPUT_DIR = Path(".grader")  # grader check's results and report, in the current folder, ignored by git


class NothingToGrade(UsageError):
    """The submission holds none of the course's assignments: the student's problem, graded 0 in CI."""


def select_assignments(sub, names: list[str] | None) -> list[specs.Assignment]:
    if names:
        try:
            return [specs.get(n) for n in names]
        except specs.UnknownAssignment as exc:
            raise UsageError(exc.args[0]) from None
    catalogue = specs.catalogue()
    if not catalogue:
        raise UsageError(f"no course found: no assignments/ in {specs.course_root()}. Run grader check inside your "
                         f"repository (the folder with {specs.KIT_MANIFEST}), or set GRADER_COURSE to the course "
                         f"folder")
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
                                     "output Classmoji reads (default otherwise in GitHub Actions); none: plain."),
) -> None:
    """Run the public checks on a submission and explain every failure."""
    from grader.judge.context import ContextError, resolve
    from grader.judge.grade import count_steps
    from grader.judge.runcache import CacheSettingError, check_cache_folder, check_cache_limit
    from grader.judge.session import open_session
    from grader.kit import classroom50
    from grader.sandbox import zygote
    from grader.sandbox.isolation import SandboxError
    from grader.sandbox.process import as_asked, detect
    from grader.settings import from_environment

    settings = from_environment()  # read once: the session below grades with these
    json_file = json_file or OUTPUT_DIR / "results.json"
    html_dir = html_dir or OUTPUT_DIR
    ci_mode = classroom50.mode(ci if ci in ("github", "classroom50", "none") else None)
    try:
        # before anything can fail: no earlier (or committed) result survives this check
        fresh_outputs(json_file, html_dir)
        if ci not in (None, "github", "classroom50", "none"):
            raise UsageError(f"--ci must be classroom50, github or none, not {ci!r}")
        if jobs is not None and jobs < 1:
            raise UsageError(f"--jobs must be 1 or more, not {jobs}")
        if ci_mode == "classroom50":  # a result.json of an earlier run is never taken for this one's
            classroom50.remove_stale(repo)
            classroom50.runner_fields()
        sub = open_submission(repo)
        chosen = select_assignments(sub, assignment)
        # in CI the reproducer is what the student pastes in their own clone: no path of the runner's
        where = "." if ci_mode is not None else shlex.quote(str(repo))
        base = f"grader check {where}" + ("" if device == "auto" else f" --device {device}")
        keep = usable_cache(check_cache_folder(settings))  # what the next check on this machine reuses
        ctx = resolve(device, seed, case, dtype, timeout, isolation,
                      hide=[json_file.resolve().parent, html_dir.resolve(), *([keep] if keep else [])],
                      reproducer=base, partial_points=True)
        unmatched = ctx.unmatched(chosen)  # never dropped in silence: a typo would pass as a check of nothing
        if unmatched:
            raise UsageError("\n".join(unmatched))
        if (case or dtype) and not any(ctx.calls(s) for s in chosen):
            raise UsageError(f"--case and --dtype together choose no case of {', '.join(s.name for s in chosen)}")
        if keep is not None:  # workers forked at once by a zygote that outlives this command
            zygote.keep_warm(keep / "warm", settings.warm.keep_seconds)
        # in CI nothing less than the isolation asked for will do; on a student's own machine it may
        # fall back, said first (below)
        contained = as_asked(ctx.isolation) if ci_mode is not None else detect(ctx.isolation)
        # input sets and kernels: the interpreter times and compiles nothing
        if keep is not None and ctx.device == "cuda":
            from grader.kit import github

            # a CI runner may check every student's repository in turn: no student's kernels are kept there
            shared_runner = ci_mode is not None or settings.in_ci
            ctx = ctx.kept_between_checks(keep, check_cache_limit(settings), seed is not None,
                                          own_uid=not contained.user_switch,
                                          kernels_of=None if shared_runner else sub.identity())
    except (UsageError, ContextError, SubmissionError, SandboxError, CacheSettingError, OutputFolderError,
            classroom50.Classroom50Error) as exc:
        say(err, f"[red]error:[/red] {shown_lines(exc)}")
        from grader.kit import github

        unreadable = isinstance(exc, NothingToGrade) or (isinstance(exc, SubmissionError) and Path(repo).is_dir())
        if ci_mode == "classroom50" and unreadable:  # the student's problem: a grade of 0 that says why, exit 0
            names = assignment or list(specs.catalogue())
            # said of the student's clone, not the runner's path
            reason = str(exc).replace(str(Path(repo).resolve()), ".")
            raise typer.Exit(classroom50.report(classroom50.ungraded(names, reason), Path(repo), "cpu",
                                                echo=lambda line: print(line, flush=True))) from None
        if ci_mode == "classroom50":
            classroom50.report_error(str(exc), repo, echo=lambda line: print(line, flush=True))
        elif ci_mode == "github":
            github.report_error(str(exc))
        raise typer.Exit(2) from None
    for warning in contained.warnings:  # once per run, before any worker starts
        err.print(f"[yellow]warning:[/yellow] {escape(warning)}")
        # a CI run that lost a layer says so where its log is read, not only on stderr
        if ci_mode is not None or in_actions():
            from grader.sanitize import for_annotation

            print(f"::warning title=Weaker sandbox::{for_annotation(warning)}", flush=True)

    mode = "GPU" if ctx.device == "cuda" else "CPU interpreter (TRITON_INTERPRET=1): no timing, no bf16"
    console.print(f"Checking [bold]{shown(sub.root)}[/bold]: {', '.join(s.name for s in chosen)} on {mode}, seed "
                  f"{ctx.seed}")
    with _progress(count_steps(chosen, ctx)) as step:
        run = open_session(ctx, settings).grade(sub, chosen, step, jobs=check_jobs(jobs, ctx.device, len(chosen)))
    # what a batch stores and reads back: results.json, the report and the summary come from that
    # form here too, so a check shows whatever a batch would lose
    run = RunResult.from_json(run.to_json())

    for folder in {json_file.parent, html_dir}:
        ignored_by_git(folder)
    write_json_atomic(run.to_gradescope(), json_file)
    from grader.report import write_report

    html = write_report(run, html_dir)
    from grader.kit import github

    with commands_stopped(console, ci_mode is not None or in_actions()):  # messages, tracebacks, output: the student's
        print_summary(run)
    kept = (f"   ({OUTPUT_DIR}/ keeps its own .gitignore: nothing to commit)"
            if html_dir.resolve() == OUTPUT_DIR.resolve() else "")
    console.print(f"\nresults: {json_file}   report: {html}{kept}")
    if keep is not None:
        kept_next = ["the performance inputs and compiled kernels"] if ctx.cache else []
        if settings.warm.keep_seconds > 0 and settings.warm.fork_server:
            kept_next.append(f"a warm worker start for {settings.warm.keep_seconds:g} s")
        if kept_next:
            console.print(f"[dim]kept for the next check: {' and '.join(kept_next)}, in {keep} "
                          f"(GRADER_CACHE_GB=0 keeps nothing)[/dim]")
    from grader.kit import github

    if ci_mode == "classroom50":  # graded: exit 0 whatever failed (2 for an infra_error: no score released)
        raise typer.Exit(classroom50.report(run, sub.root, ctx.device, echo=lambda line: print(line, flush=True)))
    if ci_mode == "github":
        github.report_github(run, sub.root, ctx.device, echo=lambda line: print(line, flush=True))
    if any(t.outcome == Outcome.INFRA_ERROR for t in run.tests):
        raise typer.Exit(2)
    raise typer.Exit(0 if run.all_passed else 1)


PIPED_PROGRESS_EVERY = 10.0  # seconds between two progress lines where no live bar can be drawn


@contextmanager
def _progress(total: int):
    """A step callback: a live bar on a terminal; piped (a file, a CI log), where a bar shows
    nothing until the end, a line at the start and then at most one every PIPED_PROGRESS_EVERY
    seconds, so a check that takes minutes in the interpreter is never silent."""
    if console.is_terminal:
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


WORKER_MEMORY = 2 << 30  # what one interpreter worker may take (torch, Triton, the interpreted case's tensors)


def check_jobs(asked: int | None, device: str, assignments: int) -> int:
    """How many assignments a check grades at once: as asked; else in the interpreter one per
    core (each worker interprets on one core) while memory allows, on a GPU one (its phases
    share one device)."""
    if asked is not None:
        return asked
    if device != "cpu":
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
    check without it is slower, not wrong."""
    if folder is None:
        return None
    from grader.sandbox.files import private_folder

    try:
        return private_folder(folder)
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
    try:
        for folder in {json_file.parent, html_dir}:
            if _is_default(folder) and (folder.is_symlink() or (os.path.lexists(folder) and not folder.is_dir())):
                folder.unlink()
        for stale in (json_file, html_dir / "report.html"):
            # lstat alone: a link is never followed, not even to ask what it leads to (a link to
            # a file this user may not reach would raise here)
            if os.path.lexists(stale) and stat.S_ISDIR(os.lstat(stale).st_mode):
                if not _is_default(stale.parent):
                    raise OutputFolderError(f"{stale} is a folder: it cannot be replaced by the results")
                shutil.rmtree(stale)
            elif os.path.lexists(stale):
                stale.unlink()
    except OSError as exc:
        raise OutputFolderError(f"cannot clear the output folder: {exc}") from None


def _is_default(folder: Path) -> bool:
    return os.path.abspath(folder) == os.path.abspath(OUTPUT_DIR)


def ignored_by_git(folder: Path) -> None:
    """The default output folder keeps itself out of the student's commits (its own .gitignore:
    `*`), so a check leaves no untracked files behind. A folder the user chose is theirs.
    Written through a temp file and a rename: a committed link there is replaced, not followed."""
    if _is_default(folder):
        if folder.is_symlink() or (os.path.lexists(folder) and not folder.is_dir()):
            folder.unlink()  # made a link again since the check began: replaced, never followed
        folder.mkdir(parents=True, exist_ok=True)
        marker = folder / ".gitignore"
        if marker.is_symlink() or not marker.is_file():
            write_text_atomic("# written by grader check: its results, never committed\n*\n", marker)


def print_summary(run: RunResult) -> None:
    """One compact table per assignment (cases x dtypes), then every distinct failure in full."""
    for a in run.assignments:
        if a.headline:  # one cause explains everything: say it first
            console.print(f"[bold red]{shown(a.name)}:[/bold red] [bold]{shown(a.headline)}[/bold]")
        # a line, not a title wrapped to the table
        console.print(f"[bold]{shown(a.name)}[/bold] ({shown(a.module)}): {points_line(a)}")
        table = Table()
        dtypes = list(dict.fromkeys(t.dtype for t in a.tests if t.kind == "correctness"))
        table.add_column("case")
        table.add_column("shape")
        for d in dtypes:
            table.add_column(d or "")
        rows: dict[str, dict] = {}
        for t in a.tests:
            if t.kind == "correctness":
                row = rows.setdefault(t.case or "", {"shape": t.shape or ""})
                row[t.dtype] = t.outcome
                row["shape"] = row["shape"] or t.shape or ""
        for case, row in rows.items():
            cells = [f"[{STYLE[row[d]]}]{row[d]}[/]" if d in row else "" for d in dtypes]
            table.add_row(shown(case), shown(row["shape"]), *cells)
        if rows:  # no case ran (not submitted, no import): the one result below says why
            console.print(table)
        for t in a.tests:
            if t.kind != "correctness":
                points = f" ({t.score:g}/{t.max_score:g})" if t.outcome != Outcome.SKIPPED else ""
                outcome = f"{t.outcome} ({t.severity})" if t.outcome == Outcome.FLAGGED and t.severity else t.outcome
                console.print(f"  {t.kind} - {shown(t.name)}: [{STYLE[t.outcome]}]{outcome}[/]{points}: "
                              f"{shown(t.message, 300)}")
        if a.skipped_points:
            console.print(f"  [dim]{a.skipped_points:g} of these points can only be earned on a GPU (graded "
                          f"there).[/dim]")
        for note in a.notes:
            console.print(f"  [yellow]{shown(note)}[/yellow]")
    groups = group_failures(run.tests)
    if groups:
        console.print("\n[bold]What went wrong[/bold]")
        for g in groups:  # each diagnosis once, with the cases it concerns
            t = g.first
            if len(g.tests) == 1:
                console.print(f"[{STYLE[t.outcome]}]{t.outcome}[/] {shown(t.assignment)} {shown(t.name)}: "
                              f"{shown(t.message)}")
            else:
                console.print(f"[{STYLE[t.outcome]}]{t.outcome}[/] {shown(t.assignment)}, {len(g.tests)} checks "
                              f"({shown(g.cases)}): {shown(g.diagnosis)}")
            if t.traceback:
                if tail := traceback_tail(t):
                    console.print(f"[dim]{shown_lines(_last_lines(tail, 8))}[/dim]")
            elif t.output and t.outcome in (Outcome.CRASHED, Outcome.TIMEOUT):
                console.print(f"[dim]{shown_lines(_last_lines(t.output, 8))}[/dim]")
            if t.reproducer:
                console.print(f"  reproduce: [cyan]{shown(t.reproducer)}[/cyan]")
            if small := smallest_words(t):  # the same failure at the least size the search found
                console.print(f"  {shown(small)}")
                console.print(f"  reproduce it: [cyan]{shown(t.details['smallest_failing']['reproducer'])}[/cyan]")
    partial = [a for a in run.assignments if a.partial]
    if partial:
        console.print(f"\n[bold]Score: {run.score:g} / {run_total(run.assignments):g}[/bold] (partial run: only the "
                      "cases chosen with --case/--dtype ran; the others earn nothing here)")
    else:
        gpu_only = f" ({run.skipped_points:g} of them can only be earned on a GPU)" if run.skipped_points else ""
        console.print(f"\n[bold]Score: {run.score:g} / {run.max_score:g}[/bold]{gpu_only}")


def _last_lines(text: str, n: int) -> str:
    return "\n".join("  " + line for line in text.strip().splitlines()[-n:])


def list_assignments(
    as_json: bool = typer.Option(False, "--json", help="Print the assignments as JSON (for scripts)."),
) -> None:
    """Show the assignments, their interfaces and points."""
    rows = [assignment_info(s) for s in specs.catalogue().values()]
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
    if console.is_terminal and needed <= console.width:
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
