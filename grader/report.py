"""HTML report: one self-contained page per submission (inline CSS and SVG, no network),
rendered from Jinja templates in grader/templates."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Sequence

from jinja2 import Environment, PackageLoader, select_autoescape
from markupsafe import Markup

from grader.judge import picture
from grader.judge.feedback import (
    error_words,
    group_failures,
    nonfinite_words,
    points_line,
    points_words,
    run_total,
    traceback_tail,
)
from grader.payloads import PerformancePayload, SubmissionPayload
from grader.results import BAD_OUTCOMES, AssignmentResult, Outcome, RunResult, in_ci, outcome_css
from grader.sanitize import for_page


def _shown(value):
    """Every value a template prints: text valid and with no control character left raw
    (grader.sanitize.for_page; markup we made ourselves, e.g. the SVG, is ours to keep)."""
    return for_page(value) if isinstance(value, str) and not isinstance(value, Markup) else value


_ENV = Environment(loader=PackageLoader("grader", "templates"), autoescape=select_autoescape(["html", "j2"]),
                   trim_blocks=True, lstrip_blocks=True, finalize=_shown)


def perf_chart(details: PerformancePayload) -> str:
    """Inline SVG: GB/s (TFLOP/s for compute-bound kernels) of student, reference and torch,
    with the interquartile range and the roofline."""
    figures = details.figures or {}
    if not figures:
        return ""
    if details.flops and (details.roofline_kind or "cuBLAS GEMM peak") == "cuBLAS GEMM peak":
        compute, unit, work, per = True, "TFLOP/s", details.flops, 1e12
        roof, roof_name = details.gemm_tflops, "cuBLAS GEMM peak"
    else:
        compute, unit, work, per = False, "GB/s", details.bytes or 0, 1e9
        roof, roof_name = details.copy_gbps, "copy bandwidth"
    width, bar_h, gap, left = 420, 22, 8, 90
    bars: dict[str, tuple[float, float, float]] = {}  # each contender's rate and interquartile times
    for name, f in figures.items():
        r = f.tflops if compute else f.gbps
        if not r or not f.q1_ms or not f.q3_ms:
            return ""  # a call with no GPU work recorded: nothing to draw (the message says why)
        bars[name] = (r, f.q1_ms, f.q3_ms)
    top = max(max(r for r, _, _ in bars.values()), roof or 0) or 1.0
    scale = (width - left - 70) / top
    rows = []
    colours = {"student": "#2b6cb0", "reference": "#718096", "torch": "#a0aec0"}
    for i, (name, (r, q1, q3)) in enumerate(bars.items()):
        y = i * (bar_h + gap) + 4
        w = r * scale
        lo = work / (q3 * 1e-3) / per * scale if work else w
        hi = work / (q1 * 1e-3) / per * scale if work else w
        rows.append(
            f'<text x="0" y="{y + 15}" font-size="12">{name}</text>'
            f'<rect x="{left}" y="{y}" width="{w:.1f}" height="{bar_h}" fill="{colours.get(name, "#999")}"/>'
            f'<line x1="{left + lo:.1f}" x2="{left + hi:.1f}" y1="{y + bar_h / 2}" y2="{y + bar_h / 2}" stroke="#000"/>'
            f'<text x="{left + w + 4:.1f}" y="{y + 15}" font-size="11">{r:.0f} {unit}</text>'
        )
    height = len(figures) * (bar_h + gap) + 10
    if roof:
        x = left + roof * scale
        rows.append(f'<line x1="{x:.1f}" x2="{x:.1f}" y1="0" y2="{height}" stroke="#c53030" stroke-dasharray="4 3"/>'
                    f'<title>{roof_name} {roof:.0f} {unit}</title>')
    return (f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" role="img" '
            f'aria-label="throughput: student vs reference vs torch">{"".join(rows)}</svg>')


def matrix(a) -> dict:
    """Correctness tests as rows (cases) by columns (dtypes), for the compact table."""
    dtypes = list(dict.fromkeys(t.dtype for t in a.tests if t.kind == "correctness"))
    rows: dict[str, dict] = {}
    for t in a.tests:
        if t.kind == "correctness":
            row = rows.setdefault(t.case, {"shape": t.shape or ""})
            row[t.dtype] = t
            row["shape"] = row["shape"] or t.shape or ""
    return {"dtypes": dtypes, "rows": rows}


# how much of the worker's text (messages, tracebacks, output) one report shows in all: each test's
# is bounded already (grader.results.TEXT_LIMITS); past this, a test keeps the start of its message and says
# the rest was cut
REPORT_TEXT_LIMIT = 512 << 10


def _bounded(run: RunResult) -> RunResult:
    """`run` as the report shows it: the worker's text within REPORT_TEXT_LIMIT in all (a copy; the
    results themselves keep theirs)."""
    room, assignments = REPORT_TEXT_LIMIT, []
    for a in run.assignments:
        tests = []
        for t in a.tests:
            size = len(t.message) + len(t.traceback) + len(t.output)
            if size > room:
                t = replace(t, message=t.message[:300] + ("..." if len(t.message) > 300 else ""), traceback="",
                            output=f"[the rest cut: a report shows at most {REPORT_TEXT_LIMIT} characters "
                                   "of the worker's text in all; results.json has this test's]")
            room = max(0, room - size)
            tests.append(t)
        assignments.append(replace(a, tests=tests))
    return replace(run, assignments=assignments)


# how long the one-line cause of an assignment's summary line may be (the whole text is in its detail below)
CAUSE_CHARS = 240


@dataclass
class SummaryLine:
    """One assignment as the report's first table shows it: its points, its state and the one cause."""

    name: str
    title: str
    module: str
    points: str  # points_line: '4 / 10 points', a partial run's said so
    state: str  # passed | failed | flagged | not submitted | cannot be graded | ...
    css: str  # the outcome whose colour the state takes (grader.results.HTML_STYLE)
    cause: str  # one line: the headline, a review, the first failure's diagnosis, or what a GPU would add
    missing: bool  # no module found: listed once, with no section of its own


def _submission_fact(a: AssignmentResult, fact: str) -> bool:
    return any(isinstance(t.details, SubmissionPayload) and getattr(t.details, fact) for t in a.tests)


def _one_line(text: str) -> str:
    """`text` on one line within CAUSE_CHARS, cut at a word's end (a word longer than the line is cut)."""
    text = " ".join(str(text).split())
    if len(text) <= CAUSE_CHARS:
        return text
    head = text[:CAUSE_CHARS - 1]
    if text[CAUSE_CHARS - 1] != " " and " " in head[CAUSE_CHARS // 2:]:
        head = head.rsplit(" ", 1)[0]
    return head.rstrip(" ,;:") + "\u2026"


def summary_line(a: AssignmentResult) -> SummaryLine:
    """What the report says of `a` before any detail."""
    groups = group_failures(a.tests)
    # not submitted, and so nothing of it checked: listed once, with no section (an assignment with any
    # check that ran keeps its section, whatever else its results say)
    missing = (_submission_fact(a, "not_submitted")
               and all(isinstance(t.details, SubmissionPayload) or t.outcome == Outcome.SKIPPED for t in a.tests))
    if missing:
        state, css = "not submitted", Outcome.FAILED.value
    elif _submission_fact(a, "not_gradable"):
        state, css = "cannot be graded", Outcome.FAILED.value
    elif a.count(Outcome.FLAGGED):
        state, css = "flagged", Outcome.FLAGGED.value
    elif a.count(Outcome.INFRA_ERROR):
        state, css = "grader error: grade again", Outcome.INFRA_ERROR.value
    elif groups:
        bad = [o for o in Outcome if o in BAD_OUTCOMES and a.count(o)]
        state, css = ", ".join(f"{a.count(o)} {o}" for o in bad), bad[0].value
    else:
        state, css = "passed", Outcome.PASSED.value
    gpu = (f"{a.gpu_points_not_graded:g} points need a GPU: not graded here" if a.gpu_points_not_graded else "")
    flag = next((t for t in a.tests if t.outcome in (Outcome.FLAGGED, Outcome.INFRA_ERROR)), None)
    if a.review:
        cause = f"reviewed by {a.review.get('by')}: {a.review.get('words') or a.review.get('decision')}"
    elif flag is not None:  # the flag (or the grader's error) explains the points before any failure does
        severity = f" ({flag.severity or 'conclusive'})" if flag.outcome == Outcome.FLAGGED else ""
        cause = f"{flag.name}{severity}: {flag.message}"
    elif a.headline:
        cause = a.headline
    elif groups:
        first = groups[0]
        cause = (f"{first.first.name}: {first.first.message}" if len(first.tests) == 1
                 else f"{len(first.tests)} checks ({first.cases}): {first.diagnosis}")
    else:
        cause = gpu or "every check passed"
    if gpu and cause != gpu and not missing:
        cause = f"{cause}; {gpu}"
    return SummaryLine(a.name, a.title, a.module, points_line(a), state, css, _one_line(cause), missing)


def render(run: RunResult, profiles: Sequence = (), gradebook: dict | None = None) -> str:
    """`profiles`: --profile's (grader.judge.profiling.Profile), each shown under its assignment's speed;
    `gradebook`: a class's course grades (grader.batch.grades), the headline where they differ from the run's points."""
    book = run.in_gradebook(gradebook)
    graded = {a: g for a, g in (gradebook or {}).items() if isinstance(g, dict) and book is not None}
    run = _bounded(run)
    lines = [summary_line(a) for a in run.assignments]
    return _ENV.get_template("report.html.j2").render(
        profiles={p.assignment: p for p in profiles}, book=book, graded=graded, headline=_grade_line,
        ci_book=in_ci(gradebook),
        run=run, run_total=run_total(run.assignments), partial=any(a.partial for a in run.assignments),
        summary=[s for s in lines if not s.missing], missing=[s for s in lines if s.missing],
        sections=[(a, s) for a, s in zip(run.assignments, lines) if not s.missing],
        perf_chart=perf_chart, matrix=matrix, points_line=points_line,
        groups=group_failures, wrong_svg=picture.svg, nonfinite_words=nonfinite_words, traceback_tail=traceback_tail,
        error_words=error_words, points_words=points_words,
        Outcome=Outcome, outcome_css=outcome_css())


def _grade_line(g: dict) -> str:
    """One assignment's course grade in words (as grader.batch.grades.CourseGrade.headline says it)."""
    if g.get("final") is None:
        return "no grade"
    told = [*([f"{g['late_penalty']:g} late penalty"] if g.get("late_penalty") else []), *(g.get("lacks") or []),
            *(["held for review"] if g.get("held") else [])]
    top = "?" if g.get("out_of") is None else f"{g['out_of']:g}"
    return f"{g['final']:g} / {top} points" + (f" ({'; '.join(map(str, told))})" if told else "")
