"""What a student reads first: one headline per assignment, and failures grouped by diagnosis.

A student who runs the untouched starter should not scroll through ten copies of the same
explanation: the headline says what state the code is in, and every distinct diagnosis is
told once, with the cases it concerns.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

from grader.payloads import CorrectnessPayload, SmallestFailing
from grader.results import BAD_OUTCOMES, AssignmentResult, Outcome, TestResult, cents


@dataclass
class FailureGroup:
    """Tests of one assignment that failed the same way."""

    assignment: str
    outcome: Outcome
    diagnosis: str
    tests: list[TestResult] = field(default_factory=list)

    @property
    def first(self) -> TestResult:
        return self.tests[0]

    @property
    def cases(self) -> str:
        """The cases, each named once with its dtypes: 'n=1, n=127, n=128 (float32, float16)'."""
        dtypes: dict[str, list[str]] = {}
        for t in self.tests:
            dtypes.setdefault(t.case or t.name, []).extend([t.dtype] if t.dtype else [])
        names = list(dtypes)
        shown = ", ".join(names[:10]) + (f" and {len(names) - 10} more" if len(names) > 10 else "")
        kinds = {tuple(d) for d in dtypes.values()}
        if len(kinds) == 1 and (common := next(iter(kinds))):
            return f"{shown} ({', '.join(common)})"
        return ", ".join(f"{n} [{', '.join(d)}]" if d else n for n, d in list(dtypes.items())[:10]) + \
            (f" and {len(names) - 10} more" if len(names) > 10 else "")


_FRAME = re.compile(r'File "([^"]+)", line (\d+)')
# a figure particular to one case (a count of lanes, a program id, an index, an error's size), but not
# the line of the student's code a message names: two cases that differ only in these are one bug
_FIGURE = re.compile(r"(?<!line )(?<![\w.])[-+]?\d+(?:\.\d+)?(?:e[-+]?\d+)?")


def deepest_frame(t: TestResult) -> tuple[str, int] | None:
    """(file, line) of the traceback's deepest frame, as the worker wrote it (the student's own
    frames only, grader.worker.server); None without a traceback."""
    frames = _FRAME.findall(t.traceback or "")
    return (frames[-1][0], int(frames[-1][1])) if frames else None


def diagnosis(t: TestResult) -> str:
    """A failure's cause without what is particular to its case (the counts, the case's note):
    the judge's pattern where it has one, else its message, each with its figures left out, so
    that the same bug in ten cases is one diagnosis."""
    return without_figures((t.details.pattern if isinstance(t.details, CorrectnessPayload) else None) or t.message)


def without_figures(words: str) -> str:
    """`words` on one line with every figure particular to a case made '#' (a line number kept)."""
    return _FIGURE.sub("#", " ".join(words.split()))


def what_to_change(t: TestResult) -> tuple:
    """What the student must change for `t` to pass: the diagnosis (its kind and its fix) and
    the line of their code it points at. Failures with the same are one block in every output."""
    return (t.assignment, t.outcome, diagnosis(t), deepest_frame(t))


def group_failures(tests: list[TestResult]) -> list[FailureGroup]:
    """Bad outcomes grouped by what the student must change (`what_to_change`), in the order
    first seen; a group is told with its first test's words and figures."""
    groups: dict[tuple, FailureGroup] = {}
    for t in tests:
        if t.outcome not in BAD_OUTCOMES:
            continue
        words = (t.details.pattern if isinstance(t.details, CorrectnessPayload) else None) or t.message
        groups.setdefault(what_to_change(t), FailureGroup(t.assignment, t.outcome, words)).tests.append(t)
    return list(groups.values())


def traceback_tail(t: TestResult) -> str:
    """The traceback without its last lines where the message already says them (`f() raised:
    ValueError: ...` ends the traceback too): a failure's text is shown once."""
    lines = (t.traceback or "").rstrip().splitlines()
    message = " ".join((t.message or "").split())
    while lines and lines[-1].strip() and not lines[-1].startswith(" ") and " ".join(lines[-1].split()) in message:
        lines.pop()
    return "\n".join(lines)


def smallest_failing(t: TestResult) -> SmallestFailing | None:
    """The least failing case the shrinking search found for `t` (None: not shrunk)."""
    return t.details.smallest_failing if isinstance(t.details, CorrectnessPayload) else None


def smallest_words(t: TestResult) -> str:
    """'the smallest failing case found: shape=1x17 (x[1x17]); shape=1x16 passes', or '' where the
    failure was not shrunk (grader.judge.grade._shrink_failures)."""
    small = smallest_failing(t)
    if not small:
        return ""
    words = f"the smallest failing case found: {small.case}" + (f" ({small.shape})" if small.shape else "")
    if isinstance(t.details, CorrectnessPayload) and (passing := t.details.largest_passing):
        words += f"; {passing.case} passes" + (f" ({passing.boundary})" if passing.boundary else "")
    return words


def stores_nothing(t: TestResult) -> bool:
    """A correctness case whose output is still, every element of it, the NaN poison of
    uninitialized memory (its payload checked bit for bit: a NaN the kernel computed is not it):
    the kernel stored nothing (or was never launched)."""
    d = t.details
    return (isinstance(d, CorrectnessPayload) and t.outcome == Outcome.FAILED and (d.elements or 0) > 0
            and d.unwritten_elements == d.elements)


def headline(result: AssignmentResult, module_file: Path | None) -> str:
    """The assignment's first line when one cause explains everything: the starter untouched
    (nothing stored anywhere). Empty otherwise: the failures speak for themselves."""
    ran = [t for t in result.tests if t.kind == "correctness" and t.outcome != Outcome.SKIPPED]
    if not ran or not all(stores_nothing(t) for t in ran):
        return ""
    launched = any(isinstance(t.details, CorrectnessPayload) and t.details.kernels for t in ran)
    what = "the kernel stores nothing yet" + ("" if launched else " (no Triton kernel was launched)")
    file = result.module.split(":")[0]
    where = f"fill in the TODOs in {file}" if _has_todo(module_file) else f"write the kernel's tl.store in {file}"
    checks = "the one check it ran" if len(ran) == 1 else f"all {len(ran)} checks"  # a replayed case is one
    return (f"{what}: every output is still uninitialized memory (NaN) in {checks}; {where}, "
            "then run grader check again")


def _has_todo(path: Path | None) -> bool:
    """Whether the student's module (its real path in the repo) says TODO: read as the trusted
    side reads any student file, a regular file, bounded, never a FIFO."""
    from grader import repofiles

    try:
        return path is not None and "TODO" in repofiles.read_text(path.parent, path.name)
    except (OSError, repofiles.RepoFileError):
        return False


def nonfinite_words(nan: int, inf: int) -> str:
    """'3 elements are NaN, 1 is infinite': the counts the finite error maxima leave out."""
    words = []
    if nan:
        words.append(f"{nan} element{'s are' if nan != 1 else ' is'} NaN")
    if inf:
        words.append(f"{inf} {'are' if inf != 1 else 'is'} infinite" if nan
                     else f"{inf} element{'s are' if inf != 1 else ' is'} infinite")
    return ", ".join(words)


def error_words(d: CorrectnessPayload) -> str:
    """A wrong result's figures in words: how many elements are wrong, what is NaN or infinite, and
    the largest errors over the finite ones, never an error of 0 where no element is finite."""
    words = f"{d.bad_elements} of {d.elements} elements wrong"
    nan, inf = d.nan_elements or 0, d.inf_elements or 0
    if nan + inf and nan + inf >= (d.elements or 0):
        what = "NaN" if not inf else "infinite" if not nan else "NaN or infinite"
        return f"{words}: every element is {what} ({nonfinite_words(nan, inf)}), so no error can be measured"
    if nan or inf:
        words += f" ({nonfinite_words(nan, inf)}; the errors below are over the finite ones)"
    if d.max_abs_error is not None:
        words += f". max abs error {d.max_abs_error:.3g}, max rel error {d.max_rel_error or 0:.3g}"
    return words


def points_words(t: TestResult) -> str:
    """' (2/4)' after a check's outcome where it carries points, '' where it carries none (an
    integrity check, a skipped check): a check worth nothing is passed or failed, not 0/0."""
    return f" ({t.score:g}/{t.max_score:g})" if t.max_score and t.outcome != Outcome.SKIPPED else ""


def points_line(a: AssignmentResult) -> str:
    """'4 / 4 points', or for a partial run (--case/--dtype) the points of the cases that ran out
    of the assignment's total, said to be partial; what the run can earn counts only what can run
    here (a GPU's points apart)."""
    if not a.partial:
        return f"{a.score:g} / {a.max_score:g} points"
    p = a.partial
    earnable = (cents(a.max_score) - cents(a.skipped_points)) / 100
    gpu = f"; {a.skipped_points:g} more need a GPU" if a.skipped_points else ""
    return (f"{a.score:g} / {p['assignment_points']:g} points (partial run: {p['cases_run']} of {p['cases']} cases "
            f"ran, which can earn {earnable:g} of the {p['assignment_points']:g} here{gpu})")


def run_total(assignments: list[AssignmentResult]) -> float:
    """The points a run is out of: a partial assignment counts with its whole total."""
    return sum(cents(a.partial["assignment_points"] if a.partial else a.max_score) for a in assignments) / 100
