"""The workflow commands a check prints into the GitHub Actions log (`::error`, `::warning`,
`::notice`), for `--ci github` (grader.kit.github), `--ci classroom50` (grader.kit.classroom50)
and a CI run's sandbox warning (grader.cli.outputs). The runner shows each as an annotation on
the run's page, and one with `file=` and `line=` on that line of the commit and the pull request.

One writer, so every value goes out escaped the one way the runner's toolkit reads it
(grader.sanitize.for_annotation): a student's file name, test name or message cannot end the
command or start another.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from pathlib import Path
from typing import Literal

from grader.results import RunResult, TestResult
from grader.sanitize import for_annotation

_FRAME = re.compile(r'File "([^"]+)", line (\d+)')


def command(kind: Literal["error", "warning", "notice"], message: object, **properties: object) -> str:
    """`::kind name=value,...::message`, the properties in the order given; each value escaped as
    a property (`%`, CR, LF, `:` and `,`), the message as a message (`%`, CR and LF)."""
    named = ",".join(f"{name}={for_annotation(value, property=True)}" for name, value in properties.items())
    return f"::{kind}{' ' + named if named else ''}::{for_annotation(message)}"


def source_line(test: TestResult, repo: Path) -> tuple[str, int] | None:
    """(path relative to the repo, line) of the deepest traceback frame in a file of the repo.
    Frames name the worker's private copy (or a path relative to it), so a frame's path is
    matched on its trailing components."""
    found = None
    for path, line in _FRAME.findall(test.traceback or ""):
        parts = Path(path).parts
        for i in range(len(parts)):
            rel = Path(*parts[i:])
            if not rel.is_absolute() and (repo / rel).is_file() and not rel.parts[0].startswith("."):
                found = (rel.as_posix(), int(line))
                break
    return found


def failures(run: RunResult, repo: Path, workspace: Path, message: Callable[[str], str]) -> list[str]:
    """One `::error` command per distinct failure that points at a line of the student's code
    (file= relative to `workspace`, the repository's root in Actions); `message` shapes the
    failure's message for the sink (its length, one line or several)."""
    from grader.judge.feedback import group_failures

    lines = []
    for g in group_failures(run.tests):  # one per diagnosis, as every other output tells them
        t = g.first
        where = source_line(t, repo)
        if not where:
            continue
        file = os.path.relpath(repo / where[0], workspace)
        if len(g.tests) == 1:
            title, words = f"{t.assignment} {t.name}: {t.outcome}", t.message
        else:
            title = f"{t.assignment} {len(g.tests)} checks: {t.outcome}"
            words = f"{g.diagnosis}\n(in {g.cases})"
        lines.append(command("error", message(words), file=file, line=where[1], title=title))
    return lines
