"""`grader verify OUT STUDENT ASSIGNMENT`: re-time a stored speed figure from the records its job
kept (grader.batch.verify) and say whether it holds.

Exit codes: 0 the figure holds (within 3%, the student's replayed result right); 1 it does not;
2 it cannot be verified here (no such job, not timed by replay, records missing, no GPU), with
the reason.
"""

from __future__ import annotations

from pathlib import Path

import typer

from grader.cli.common import console, fail, shown


def verify(
    out: Path = typer.Argument(..., help="The graded class folder (grader grade --out)."),
    student: str = typer.Argument(..., help="The student, as the roster names them (or their folder's name)."),
    assignment: str = typer.Argument(..., help="The assignment whose speed figure is re-timed."),
) -> None:
    """Re-time a graded speed figure on this machine's GPU from the records the grade kept."""
    from grader.batch.verify import VerifyError
    from grader.batch.verify import verify as run_verify
    from grader.settings import current
    from grader.spec import Course

    settings = current()  # read once: the replay processes start with these
    try:
        got = run_verify(out, student, assignment, Course.find(settings), settings)
    except VerifyError as exc:
        fail(exc)
        return
    for line in got.lines:
        console.print(shown(line))
    console.print(f"stored ratio {got.stored_ratio:.3f} (on {shown(got.stored_gpu)}); re-timed {got.ratio:.3f} "
                  f"(on {shown(got.gpu)}): {got.ratio / got.stored_ratio - 1:+.1%}")
    if got.wrong:
        console.print(f"[red]the student's replayed result is wrong here:[/red] {shown(got.wrong)}")
    if got.holds:
        console.print("[green]the figure holds[/green]")
        raise typer.Exit(0)
    console.print("[red]the figure does not hold[/red]")
    raise typer.Exit(1)


def register(app: typer.Typer) -> None:
    app.command()(verify)
