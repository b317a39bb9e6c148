"""Where `grader check`'s outcome goes: one sink per output. results.json, report.html and the
terminal always; a GitHub Actions job summary, annotations and `result` output (`--ci github`) or
Classroom 50's result.json and release body (`--ci classroom50`) as the CI mode chooses
(grader.cli.check.sinks_for). Each sink is told the same things in the same order: `begin`
before the submission is opened, `started` once it is and the isolation is known, then either
`finished` with the graded run (as a batch stores and reads it back) or `not_run` with the error
that stopped the check. A hook that returns an exit code decides the command's.
"""

from __future__ import annotations

import errno
import json
import os
import stat
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from rich.markup import escape
from rich.table import Table

from grader.cli.common import STYLE, commands_stopped, console, err, in_actions, say, shown, shown_lines
from grader.device import Device
from grader.judge.feedback import (
    group_failures,
    points_line,
    points_words,
    run_total,
    smallest_failing,
    smallest_words,
    traceback_tail,
)
from grader.results import Outcome, RunResult, cents
from grader.safefiles import DIR_FLAGS
from grader.sanitize import strict_json, writable
from grader.settings import Settings
from grader.spec import Assignment, Course

if TYPE_CHECKING:  # the check imports these where it runs one, not when the CLI starts
    from grader.judge.context import GradingContext
    from grader.sandbox.isolation import Isolation
    from grader.sandbox.zygote import SandboxState
    from grader.submission import Submission

OUTPUT_DIR = Path(".grader")  # grader check's results and report, in the current folder, ignored by git


@dataclass
class CheckSetup:
    """What a check grades, as its sinks are told once it is known: the submission, the
    assignments chosen, the grading context, how workers are contained here, the folder kept
    for the next check (None: nothing is kept), and what the sandbox keeps for the check's
    session (its zygotes: the warm ones in the kept folder, the probed isolation)."""

    sub: Submission
    chosen: list[Assignment]
    ctx: GradingContext
    contained: Isolation
    keep: Path | None
    sandbox: SandboxState


class Sink:
    """One output of a check; every hook does nothing unless the sink says otherwise."""

    def begin(self) -> None:
        """Before the submission is opened; an exception here stops the check (not run)."""

    def started(self, setup: CheckSetup) -> None:
        """The submission is open and the isolation known; nothing is graded yet."""

    def finished(self, run: RunResult) -> int | None:
        """The graded run; an exit code where this output decides it."""
        return None

    def not_run(self, error: Exception, unreadable: bool) -> int | None:
        """The check stopped before grading (`unreadable`: the submission's own fault, which
        CI grades 0); an exit code where this output decides it."""
        return None


class JsonSink(Sink):
    """results.json, in Gradescope's format with our extra_data; its score in the course's points
    where the kit or autograder ships them (`points`: grader.kit.points.shipped_points)."""

    def __init__(self, path: Path, points: dict | None = None) -> None:
        self.path, self.points = path, points or {}

    def finished(self, run: RunResult) -> int | None:
        from grader.kit.points import gradebook

        data = run.to_gradescope(gradebook(run.assignments, self.points))
        text = json.dumps(strict_json(data), indent=2, default=str, allow_nan=False)
        write_output(self.path.parent, self.path.name, text)
        return None


class HtmlSink(Sink):
    """report.html, standing alone (grader.report)."""

    def __init__(self, folder: Path, points: dict | None = None) -> None:
        self.folder, self.points = folder, points or {}  # the course's shipped points (grader.kit.points)
        self.path = folder / "report.html"
        self.profiles: list = []  # --profile's (grader.judge.profiling.Profile), shown beside the speed

    def finished(self, run: RunResult) -> int | None:
        from grader.kit.points import gradebook
        from grader.report import render

        write_output(self.folder, self.path.name, render(run, self.profiles, gradebook(run.assignments, self.points)))
        return None


class TerminalSink(Sink):
    """What a student reads: the isolation's warnings, the line that says what is checked, the
    summary, where the files are and what is kept for the next check; an error in one line."""

    def __init__(self, settings: Settings, ci: bool, json_file: Path, html: HtmlSink,
                 points: dict | None = None) -> None:
        self.settings, self.ci, self.json_file, self.html = settings, ci, json_file, html
        self.points = points or {}  # the course's shipped points (grader.kit.points)
        self.setup: CheckSetup | None = None

    def started(self, setup: CheckSetup) -> None:
        self.setup = setup
        for warning in setup.contained.warnings:  # once per run, before any worker starts
            err.print(f"[yellow]warning:[/yellow] {escape(warning)}")
            if self.ci or in_actions():  # a CI run that lost a layer says so where its log is read, not only on stderr
                from grader.kit.annotations import command

                print(command("warning", warning, title="Weaker sandbox"), flush=True)
        ctx = setup.ctx
        mode = "GPU" if ctx.device == Device.CUDA else "CPU interpreter (TRITON_INTERPRET=1): no timing, no bf16"
        console.print(f"Checking [bold]{shown(setup.sub.root)}[/bold]: {', '.join(s.name for s in setup.chosen)} "
                      f"on {mode}, seed {ctx.seed}")

    def finished(self, run: RunResult) -> int | None:
        with commands_stopped(console, self.ci or in_actions()):  # messages, tracebacks, output: the student's
            print_summary(run, self.points)
        own = self.html.folder.resolve() == OUTPUT_DIR.resolve()
        kept = f"   ({OUTPUT_DIR}/ keeps its own .gitignore: nothing to commit)" if own else ""
        console.print(f"\nresults: {self.json_file}   report: {self.html.path}{kept}")
        setup = self.setup
        keep = setup.keep if setup is not None else None
        if setup is not None and keep is not None:
            warm = self.settings.warm
            what = ["the performance inputs and compiled kernels"] if setup.ctx.cache else []
            judge = warm.resident and not self.ci and sys.platform.startswith("linux")  # grader.resident
            if warm.keep_seconds > 0 and (warm.fork_server or judge):
                starts = [s for s, on in (("a warm worker start", warm.fork_server), ("a warm judge", judge)) if on]
                what.append(f"{' and '.join(starts)} for {warm.keep_seconds:g} s")
            if what:
                console.print(f"[dim]kept for the next check: {' and '.join(what)}, in {keep} "
                              f"(GRADER_CACHE_GB=0 keeps nothing)[/dim]")
        return None

    def not_run(self, error: Exception, unreadable: bool) -> int | None:
        say(err, f"[red]error:[/red] {shown_lines(error)}")
        return None


def _echo(line: str) -> None:
    print(line, flush=True)


class GitHubSink(Sink):
    """`--ci github`: the job summary, the annotations and Points notice, and the `result` output."""

    def __init__(self, repo: Path, course: Course) -> None:
        self.repo, self.course = repo, course  # the grader.spec.Course checked (its hidden cases are counted)
        self.setup: CheckSetup | None = None

    def started(self, setup: CheckSetup) -> None:
        self.setup = setup

    def finished(self, run: RunResult) -> int | None:
        from grader.kit import github

        assert self.setup is not None, "finished before started"
        github.report_github(run, self.setup.sub.root, self.setup.ctx.device, echo=_echo, catalogue=self.course)
        return None

    def not_run(self, error: Exception, unreadable: bool) -> int | None:
        from grader.kit import github, stops

        if stops.stops_every_push(error):  # not the student's fault: said so first, with the staff's fix
            github.report_stop(error, "github", echo=_echo)
        else:
            github.report_error(str(error))
        return None


class RunnerStopSink(Sink):
    """A CI job with plain output (`--ci classmoji`, or `--ci none` where the grader found CI):
    a stop the runner caused (grader.kit.stops) is an `::error` annotation on the run's page,
    and the job summary where the platform passed its file; nothing else of GitHub's is written."""

    def __init__(self, platform: str) -> None:
        self.platform = platform  # classmoji or ci: which fix the staff are given

    def not_run(self, error: Exception, unreadable: bool) -> int | None:
        from grader.kit import github, stops

        if stops.stops_every_push(error):
            github.report_stop(error, self.platform, echo=_echo, payload=False)
        return None


class Classroom50Sink(Sink):
    """`--ci classroom50`: result.json, release-body.md and the outputs; graded, the exit is 0
    whatever failed (2 for an infra_error: no score released)."""

    def __init__(self, repo: Path, names: list[str] | None, course: Course) -> None:
        self.repo, self.names, self.course = repo, names, course  # the grader.spec.Course checked
        self.setup: CheckSetup | None = None

    def begin(self) -> None:
        from grader.kit import classroom50

        classroom50.remove_stale(self.repo)  # a result.json of an earlier run is never taken for this one's
        classroom50.runner_fields()

    def started(self, setup: CheckSetup) -> None:
        self.setup = setup

    def finished(self, run: RunResult) -> int | None:
        from grader.kit import classroom50

        assert self.setup is not None, "finished before started"
        return classroom50.report(run, self.setup.sub.root, self.setup.ctx.device, echo=_echo, catalogue=self.course)

    def not_run(self, error: Exception, unreadable: bool) -> int | None:
        from grader.kit import classroom50

        if unreadable:  # the student's problem: a grade of 0 that says why, exit 0
            names = self.names or list(self.course.catalogue())
            # said of the student's clone, not the runner's path
            reason = str(error).replace(str(Path(self.repo).resolve()), ".")
            ungraded = classroom50.ungraded(names, reason, catalogue=self.course)
            return classroom50.report(ungraded, Path(self.repo), Device.CPU, echo=_echo, catalogue=self.course)
        classroom50.report_error(str(error), self.repo, echo=_echo, cause=error)
        return None


def is_default_folder(folder: Path) -> bool:
    """`folder` is grader check's own output folder (OUTPUT_DIR), not one the user chose."""
    return os.path.abspath(folder) == os.path.abspath(OUTPUT_DIR)


OUTPUT_FIX = ("write the results in a folder of yours that only you may write: run grader check from one, "
              "or choose one with --json and --html")


def output_folder(folder: Path) -> int:
    """A descriptor on output folder `folder` (made where missing), or UnsafeFolderError: it, and
    every folder on its way, is one no other user may change (grader.safefiles.trusted_folder,
    kind OWN: a student's repo checked as root, a folder under /tmp another user made, are
    refused). The default folder `.grader/` lies in the repo checked, so it may be a committed
    link or file: it is opened relative to its pinned parent and never followed; whatever else
    lies there is removed and a fresh folder made."""
    from grader.safefiles import OWN, make_folder, trusted_folder

    if not is_default_folder(folder):
        return trusted_folder(folder, "output folder", OUTPUT_FIX, kind=OWN)
    parent = trusted_folder(os.path.dirname(os.path.abspath(folder)), "output folder's parent", OUTPUT_FIX, kind=OWN)
    try:
        for _ in range(3):
            try:
                return os.open(folder.name, DIR_FLAGS, dir_fd=parent)
            except FileNotFoundError:
                os.close(make_folder(folder.name, 0o755, parent))
            except OSError as exc:
                if exc.errno not in (errno.ELOOP, errno.ENOTDIR):
                    raise
                os.unlink(folder.name, dir_fd=parent)  # a link or a file: removed, never followed
        raise OSError(errno.ELOOP, f"{folder} keeps changing")
    finally:
        os.close(parent)


def write_output(folder: Path, name: str, text: str) -> None:
    """`name` in output folder `folder` holds `text`: written relative to the folder's pinned
    descriptor (`output_folder`) into a file made for it, then renamed over `name` (a link or a
    file planted as `name` is replaced, never written through). The default folder keeps itself
    out of the student's commits (its own .gitignore: `*`), so a check leaves no untracked files
    behind; a folder the user chose is theirs."""
    from grader.safefiles import write_atomic

    fd = output_folder(folder)
    try:
        if is_default_folder(folder):
            try:
                kept = stat.S_ISREG(os.stat(".gitignore", dir_fd=fd, follow_symlinks=False).st_mode)
            except FileNotFoundError:
                kept = False
            if not kept:
                write_atomic(fd, ".gitignore", b"# written by grader check: its results, never committed\n*\n")
        write_atomic(fd, name, writable(text).encode("utf-8"))
    finally:
        os.close(fd)


def print_summary(run: RunResult, course: dict | None = None) -> None:
    """One compact table per assignment (cases x dtypes), then every distinct failure in full.
    `course`: the course's shipped points (grader.kit.points), which the Score line is out of."""
    from grader.kit import points as course_points

    course = course or {}
    for a in run.assignments:
        if a.headline:  # one cause explains everything: say it first
            console.print(f"[bold red]{shown(a.name)}:[/bold red] [bold]{shown(a.headline)}[/bold]")
        # a line, not a title wrapped to the table
        scaled = (f" = {course_points.scaled(a, a.score, course):g} / {course_points.out_of(a, course):g} in the "
                  "course's points" if a.name in course else "")
        console.print(f"[bold]{shown(a.name)}[/bold] ({shown(a.module)}): {points_line(a)}{scaled}")
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
                points = points_words(t)
                outcome = f"{t.outcome} ({t.severity})" if t.outcome == Outcome.FLAGGED and t.severity else t.outcome
                console.print(f"  {t.kind} - {shown(t.name)}: [{STYLE[t.outcome]}]{outcome}[/]{points}: "
                              f"{shown(t.message, 300)}")
        if a.skipped_points:
            console.print(f"  [dim]{a.skipped_points:g} of these points can only be earned on a GPU "
                          "(graded there).[/dim]")
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
            if (small := smallest_failing(t)) and (words := smallest_words(t)):  # the least failing size found
                console.print(f"  {shown(words)}")
                console.print(f"  reproduce it: [cyan]{shown(small.reproducer)}[/cyan]")
    partial = [a for a in run.assignments if a.partial]
    if any(a.name in course for a in run.assignments):  # the course counts them in its own points: those first
        score = course_points.total(run.assignments, lambda a: a.score, course)
        top = sum(cents(course_points.out_of(a, course)) for a in run.assignments) / 100
        lacks = [*(["partial run"] if partial else []), *(["CPU only"] if run.gpu_points_not_graded else [])]
        console.print(f"\n[bold]Score: {score:g} / {top:g}[/bold] in the course's points (course.toml's"
                      f"{'; ' + '; '.join(lacks) if lacks else ''}; no late penalty in a check: the course applies "
                      f"it at grading). The checks count {run.score:g} / {run_total(run.assignments):g} of the "
                      "assignments' own points.")
    elif partial:
        console.print(f"\n[bold]Score: {run.score:g} / {run_total(run.assignments):g}[/bold] "
                      "(partial run: only the cases chosen with --case/--dtype ran; the others earn nothing here)")
    else:
        gpu_only = f" ({run.skipped_points:g} of them can only be earned on a GPU)" if run.skipped_points else ""
        console.print(f"\n[bold]Score: {run.score:g} / {run.max_score:g}[/bold]{gpu_only}")


def _last_lines(text: str, n: int) -> str:
    return "\n".join("  " + line for line in text.strip().splitlines()[-n:])
