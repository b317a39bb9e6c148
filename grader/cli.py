"""Command line: `grader check` for students and CI, `grader list` for everyone.

Exit codes: 0 every check that ran passed; 1 some check failed; 2 usage or infrastructure
error, with a one-line message.
"""

from __future__ import annotations

import secrets
import shlex
from pathlib import Path
from typing import List, Optional

import typer
from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from grader import spec as specs
from grader.results import BAD_OUTCOMES, RunResult, write_json_atomic
from grader.submission import SubmissionError, open_submission

app = typer.Typer(add_completion=False, no_args_is_help=True, help="Grade Triton kernel assignments.")
console = Console(highlight=False)
err = Console(stderr=True, highlight=False)

STYLE = {"passed": "green", "failed": "red", "error": "red", "timeout": "magenta", "crashed": "magenta",
         "skipped": "dim", "flagged": "bold yellow", "infra_error": "bold blue"}


class UsageError(Exception):
    pass


def resolve_device(device: str) -> str:
    import torch

    if device not in ("auto", "cuda", "cpu"):
        raise UsageError(f"--device must be auto, cuda or cpu, not {device!r}")
    has_gpu = torch.cuda.is_available()
    if device == "cuda" and not has_gpu:
        raise UsageError("--device cuda: no CUDA GPU is visible here (use --device cpu for the interpreter)")
    return ("cuda" if has_gpu else "cpu") if device == "auto" else device


def select_assignments(sub, names: list[str] | None) -> list[specs.Assignment]:
    if names:
        try:
            return [specs.get(n) for n in names]
        except specs.UnknownAssignment as exc:
            raise UsageError(exc.args[0]) from None
    if not specs.catalogue():
        raise UsageError(f"no course found: no assignments/ in {specs.COURSE_ROOT}. Run grader check inside your "
                         f"repository (the folder with {specs.KIT_MANIFEST}), or set GRADER_COURSE to the course folder")
    found = [s for s in specs.catalogue().values() if sub.has(s)]
    if not found:
        looked = ", ".join(sub.target(s)[0] for s in specs.catalogue().values())
        raise UsageError(f"no assignment found in {sub.root} (looked for {looked})")
    return found


@app.command()
def check(
    repo: Path = typer.Argument(Path("."), help="The submission's folder (your repo)."),
    assignment: Optional[List[str]] = typer.Option(None, "--assignment", "-a", help="Only these assignments (repeatable)."),
    json_file: Path = typer.Option(Path("reports/results.json"), "--json", help="Where to write results.json."),
    html_dir: Path = typer.Option(Path("reports"), "--html", help="Folder for report.html."),
    device: str = typer.Option("auto", help="auto (GPU if present), cuda, or cpu (Triton's interpreter)."),
    seed: Optional[int] = typer.Option(None, help="Seed for inputs and random shapes (default: a new one, printed)."),
    case: Optional[List[str]] = typer.Option(None, "--case", help="Only the named case(s), e.g. from a reproducer."),
    dtype: Optional[List[str]] = typer.Option(None, "--dtype", help="Only these dtypes: float32, float16, bfloat16."),
    timeout: Optional[float] = typer.Option(None, help="Seconds one call may take (default: the assignment's)."),
    isolation: str = typer.Option("sandbox", help="How student code is contained: sandbox (namespaces, no Docker), "
                                  "docker (a container per worker) or none. See docs/security.md."),
    ci: Optional[str] = typer.Option(None, "--ci", help="github: a job summary, annotations and GitHub Classroom's "
                                     "result output (default when GITHUB_ACTIONS=true); none: plain."),
) -> None:
    """Run the public checks on a submission and explain every failure."""
    from grader import sandbox
    from grader.grade import Options, count_steps, grade_submission
    from grader.plan import plan_calls

    try:
        sub = open_submission(repo)
        chosen = select_assignments(sub, assignment)
        resolved = resolve_device(device)
        for d in dtype or []:
            if d not in specs.DTYPES:
                raise UsageError(f"unknown dtype {d!r} (known: {', '.join(specs.DTYPES)})")
        seed = seed if seed is not None else secrets.randbelow(2**31)
        base = f"grader check {shlex.quote(str(repo))}" + ("" if device == "auto" else f" --device {device}")
        opts = Options(resolved, seed, case or None, dtype or None, timeout, reproducer=base, isolation=isolation,
                       hide=[str(json_file.resolve().parent), str(html_dir.resolve())])
        if case and not any(plan_calls(s, seed, opts.interpret, case, dtype) for s in chosen):
            raise UsageError(f"no case named {', '.join(case)} in {', '.join(s.name for s in chosen)}")
        if ci not in (None, "github", "none"):
            raise UsageError(f"--ci must be github or none, not {ci!r}")
        contained = sandbox.detect(isolation)
    except (UsageError, SubmissionError, sandbox.SandboxError) as exc:
        err.print(f"[red]error:[/red] {exc}")
        from grader import ci as github

        if github.enabled(ci if ci in ("github", "none") else None):
            github.report_error(str(exc))
        raise typer.Exit(2)
    for warning in contained.warnings:  # once per run, before any worker starts
        err.print(f"[yellow]warning:[/yellow] {escape(warning)}")

    mode = "GPU" if resolved == "cuda" else "CPU interpreter (TRITON_INTERPRET=1): no timing, no bf16"
    console.print(f"Checking [bold]{sub.root}[/bold]: {', '.join(s.name for s in chosen)} on {mode}, seed {seed}")
    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  console=console, transient=True) as bar:
        task = bar.add_task("starting", total=count_steps(chosen, opts))
        run = grade_submission(sub, chosen, opts, lambda text: bar.update(task, advance=1, description=text))

    write_json_atomic(run.to_gradescope(), json_file)
    from grader.report import write_report

    html = write_report(run, html_dir)
    print_summary(run)
    console.print(f"\nresults: {json_file}   report: {html}")
    from grader import ci as github

    if github.enabled(ci):
        github.report_github(run, sub.root, resolved, echo=lambda line: print(line, flush=True))
    if any(t.outcome == "infra_error" for t in run.tests):
        raise typer.Exit(2)
    raise typer.Exit(0 if run.all_passed else 1)


def print_summary(run: RunResult) -> None:
    """One compact table per assignment (cases x dtypes), then every distinct failure in full."""
    for a in run.assignments:
        table = Table(title=f"{a.name} ({a.module}): {a.score:g} / {a.max_score:g} points", title_justify="left")
        dtypes = list(dict.fromkeys(t.dtype for t in a.tests if t.kind == "correctness"))
        table.add_column("case")
        table.add_column("shape")
        for d in dtypes:
            table.add_column(d)
        rows: dict[str, dict] = {}
        for t in a.tests:
            if t.kind == "correctness":
                row = rows.setdefault(t.case, {"shape": t.shape or ""})
                row[t.dtype] = t.outcome
                row["shape"] = row["shape"] or t.shape or ""
        for case, row in rows.items():
            cells = [f"[{STYLE[row[d]]}]{row[d]}[/]" if d in row else "" for d in dtypes]
            table.add_row(escape(case), escape(row["shape"]), *cells)
        console.print(table)
        for t in a.tests:
            if t.kind != "correctness":
                points = f" ({t.score:g}/{t.max_score:g})" if t.outcome != "skipped" else ""
                outcome = f"{t.outcome} ({t.severity})" if t.outcome == "flagged" and t.severity else t.outcome
                console.print(f"  {t.kind} - {escape(t.name)}: [{STYLE[t.outcome]}]{outcome}[/]{points}: {escape(_short(t.message, 300))}")
        if a.skipped_points:
            console.print(f"  [dim]{a.skipped_points:g} of these points can only be earned on a GPU (graded there).[/dim]")
        for note in a.notes:
            console.print(f"  [yellow]{escape(note)}[/yellow]")
    bad = [t for t in run.tests if t.outcome in BAD_OUTCOMES]
    if bad:
        console.print("\n[bold]What went wrong[/bold]")
        seen = set()
        for t in bad:
            key = (t.assignment, t.message)
            if key in seen:
                continue
            seen.add(key)
            console.print(f"[{STYLE[t.outcome]}]{t.outcome}[/] {t.assignment} {escape(t.name)}: {escape(t.message)}")
            if t.traceback:
                console.print(f"[dim]{escape(_last_lines(t.traceback, 8))}[/dim]")
            elif t.output and t.outcome in ("crashed", "timeout"):
                console.print(f"[dim]{escape(_last_lines(t.output, 8))}[/dim]")
            if t.reproducer:
                console.print(f"  reproduce: [cyan]{escape(t.reproducer)}[/cyan]")
    gpu_only = f" ({run.skipped_points:g} of them can only be earned on a GPU)" if run.skipped_points else ""
    console.print(f"\n[bold]Score: {run.score:g} / {run.max_score:g}[/bold]{gpu_only}")


def _short(text: str, limit: int = 160) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _last_lines(text: str, n: int) -> str:
    return "\n".join("  " + line for line in text.strip().splitlines()[-n:])


@app.command("list")
def list_assignments() -> None:
    """Show the assignments, their interfaces and points."""
    table = Table(title="Assignments")
    for col in ("name", "module", "interface", "points", "cases"):
        table.add_column(col)
    for s in specs.catalogue().values():
        perf = f" + {s.performance_points:g} speed" if s.performance_points else ""
        hidden = f" + {s.hidden_count} hidden" if s.hidden_count else ""
        table.add_row(s.name, s.module, s.signature, f"{s.correctness_points:g} correctness{perf}",
                      f"{len(s.public_cases)} named{hidden} + random, {', '.join(s.dtypes)}")
    console.print(table)


from grader.ta import register as _register_ta_commands  # noqa: E402  (fetch, grade: they use the helpers above)

_register_ta_commands(app)

from grader.lifecycle import register as _register_lifecycle_commands  # noqa: E402  (release, gradescope)

_register_lifecycle_commands(app)


def main() -> None:
    app()
