"""`grader check --ci github`: what a GitHub Actions run of the check leaves behind.

- A Markdown job summary appended to $GITHUB_STEP_SUMMARY: the score, each assignment, what
  explains every failure at once where one cause does (an untouched starter), each distinct
  failure once with the cases it concerns and its reproducer, the points that need a GPU and
  when they are graded.
- `::error file=...,line=...::` workflow commands on stdout where a failure points at a line of
  the student's code (the deepest frame of their file in the traceback): GitHub shows them on the
  file in the commit and the pull request; and one `::notice title=Points::` with the score, the
  line the run's page shows first.
- `result=<base64 JSON>` appended to $GITHUB_OUTPUT, in the format of classroom-resources'
  `autograding-command-grader` (version 1, status, max_score, tests[] with name, status,
  score, message, test_code, filename, line_no, duration), for a later step of the course's own:
  its max_score is the same total as the summary's, out of what course.toml's [ci] score says
  (`ci_score`: the points this runner can grade, or the whole with those that need a GPU). The kit's
  workflow reads none of it and depends on no reporter action: the grader writes what a student
  reads itself.

All of it comes from the same RunResult as results.json. Every piece of it that a student's
repo or worker decided (a module or function name, a message, a reproducer, a file name) goes
through its sink's neutraliser (grader.sanitize): Markdown-escaped in the summary, escaped as
the runner's toolkit does in a command (grader.kit.annotations writes every one), and on one
line in the payload (a step that prints its names and messages in the job log must not see a
line of their own run as a workflow command).
"""

import base64
import json
import os
from collections.abc import Mapping
from pathlib import Path

from grader.batch.course import CI_SCORES
from grader.judge.feedback import group_failures
from grader.kit import stops
from grader.kit.annotations import command, failures, source_line
from grader.payloads import CorrectnessPayload
from grader.results import BAD_OUTCOMES, Outcome, RunResult, cents
from grader.sanitize import for_markdown, for_markdown_code, one_line, strict_json
from grader.settings import from_environment

# Classroom's three statuses; skipped tests are left out of the payload (they carry no points here)
CLASSROOM_STATUS: dict[Outcome, str] = {
    Outcome.PASSED: "pass", **{o: "fail" for o in BAD_OUTCOMES}, Outcome.INFRA_ERROR: "error"}
MESSAGE_LIMIT = 1000  # a step that prints messages in the job log: keep each one short
ARTIFACT = "grader-report"  # the kit workflow's upload step names the report's artifact so


def ci_score(catalogue) -> str:
    """What a CI run reports its points out of: course.toml's [ci] score as the kit carries it
    (grader-kit.toml's [ci] score, written by `grader release`; `catalogue`, a grader.spec.Course),
    cpu-gradable where it says nothing or what it says is not one of CI_SCORES (the file lies in
    the student's repo: it may only change what CI shows the student, never a grade)."""
    try:
        value = (catalogue.kit_manifest().get("ci") or {}).get("score") if catalogue is not None else None
    except (OSError, ValueError, UnicodeDecodeError, AttributeError):
        value = None
    return value if value in CI_SCORES else CI_SCORES[0]


def out_of(result, basis: str) -> float:
    """The maximum a CI run reports `result` (an AssignmentResult or a RunResult) out of: on the
    cpu-gradable basis the points this runner can grade (those only a GPU can earn left out, to be
    graded there), on the whole basis every point of the assignment."""
    gpu = result.gpu_points_not_graded if basis == "cpu-gradable" else 0.0
    return (cents(result.max_score) - cents(gpu)) / 100


def enabled(ci: str | None, env: Mapping[str, str]) -> bool:
    """--ci github, or --ci left unset inside GitHub Actions (GITHUB_ACTIONS=true in `env`)."""
    return ci == "github" or (ci is None and from_environment(env).in_actions)


def classroom_payload(run: RunResult, repo: Path, basis: str = CI_SCORES[0], points: dict | None = None) -> dict:
    """classroom-resources' result: each test as it is; max_score the run's, out of what `basis`
    says (ci_score): the tests that need a GPU are left out (skipped), so on the cpu-gradable basis
    their points are not in the total either. Where the kit ships the course's `points`
    (grader.kit.points), max_score is in them and each test's points are scaled in proportion."""
    from grader.kit.points import scaled

    points = points or {}
    by_name = {a.name: a for a in run.assignments}
    tests = []
    for t in run.tests:
        if t.outcome == Outcome.SKIPPED:
            continue
        a = by_name.get(t.assignment)
        score, top = ((t.score, t.max_score) if a is None
                      else (scaled(a, t.score, points), scaled(a, t.max_score, points)))
        where = source_line(t, repo) if t.outcome != Outcome.PASSED else None
        # each line of the message starts with our words: the student's text is kept on its own line
        message = (one_line(t.message, MESSAGE_LIMIT) if t.outcome == Outcome.PASSED
                   else f"[{t.outcome}] {one_line(t.message, MESSAGE_LIMIT)}"
                   + (f"\nReproduce: {one_line(t.reproducer)}" if t.reproducer else ""))
        tests.append({
            "name": one_line(f"{t.assignment}: {t.name}", 200),
            "status": CLASSROOM_STATUS[t.outcome],
            "score": cents(score) / 100,  # the points as the summary shows them, not a float's tail
            "max_score": cents(top) / 100,
            "message": _short(message, MESSAGE_LIMIT),
            "test_code": one_line(t.reproducer or ""),
            "filename": one_line(where[0]) if where else "",
            "line_no": where[1] if where else 0,
            "duration": round(float((t.details.seconds or 0.0) if isinstance(t.details, CorrectnessPayload) else 0.0)
                              * 1000),
        })
    statuses = {x["status"] for x in tests}
    status = "error" if "error" in statuses else "fail" if "fail" in statuses else "pass"
    # the same total as the summary and the Points notice (on the whole basis the GPU's points are in it)
    return {"version": 1, "status": status, "max_score": course_out_of(run, basis, points), "tests": tests}


def course_out_of(run: RunResult, basis: str, points: dict | None) -> float:
    """out_of(run, basis) in the course's shipped `points` (grader.kit.points): each assignment's, scaled."""
    from grader.kit.points import total

    return total(run.assignments, lambda a: out_of(a, basis), points or {})


def encode(payload: dict) -> str:
    return base64.b64encode(json.dumps(strict_json(payload), separators=(",", ":"), allow_nan=False).encode()).decode()


def annotations(run: RunResult, repo: Path, workspace: Path) -> list[str]:
    """One `::error` command per distinct failure that points at a line of the student's code;
    file= is relative to the workspace (the repository's root in Actions). Its message keeps
    its lines (escaped), cut at MESSAGE_LIMIT."""
    return failures(run, repo, workspace, lambda message: _short(message, MESSAGE_LIMIT))


def score_words(run: RunResult, basis: str = CI_SCORES[0], points: dict | None = None) -> str:
    """The one total every output of a CI run says: on the cpu-gradable basis '4 / 4 points
    gradable here (of 10 at grading: 6 need a GPU, graded on the course's GPU after the
    deadline)', on the whole basis '4 / 10 points (6 of them need a GPU: ...)'; in the course's
    shipped `points` where there are any (grader.kit.points), said so."""
    from grader.kit.points import total

    points = points or {}
    score, top = total(run.assignments, lambda a: a.score, points), total(run.assignments, lambda a: a.max_score,
                                                                           points)
    gpu = total(run.assignments, lambda a: a.gpu_points_not_graded, points)
    course = (" in the course's points (no late penalty here: the course applies it at grading)"
              if any(a.name in points for a in run.assignments) else "")
    if basis == "cpu-gradable" and gpu:
        return (f"{score:g} / {course_out_of(run, basis, points):g} points gradable here{course} (of {top:g} at "
                f"grading: {gpu:g} need a GPU, graded on the course's GPU after the deadline)")
    return (f"{score:g} / {top:g} points{course}"
            + (f" ({gpu:g} of them need a GPU: graded on the course's GPU after the deadline)" if gpu else ""))


def step_summary(run: RunResult, device: str, hidden: dict[str, int], basis: str = CI_SCORES[0],
                 points: dict | None = None) -> str:
    """The job summary (GitHub-flavoured Markdown); its title's total as `basis` says (ci_score),
    in the course's shipped `points` where there are any (grader.kit.points)."""
    from grader.kit.points import scaled, total

    points = points or {}
    where = "a GPU" if device == "cuda" else "the CPU (Triton's interpreter: no timing, no bfloat16)"
    gpu_points = total(run.assignments, lambda a: a.gpu_points_not_graded, points)
    here = " gradable here" if basis == "cpu-gradable" and gpu_points else ""
    score = total(run.assignments, lambda a: a.score, points)
    out = [f"## Triton kernels: {score:g} / {course_out_of(run, basis, points):g} points{here}", "",
           f"Checked on {where}, seed {run.seed}.", ""]
    if any(a.name in points for a in run.assignments):
        out += [f"Points are the course's (course.toml's, as its gradebooks count them); the checks count "
                f"{run.score:g} / {out_of(run, basis):g} of the assignments' own. No late penalty is applied here: "
                "the course applies it at grading.", ""]
    if gpu_points and here:
        at_grading = total(run.assignments, lambda a: a.max_score, points)
        out += [f"> **{at_grading:g} points at grading**: {gpu_points:g} more need a GPU (bfloat16 cases and "
                "speed) and cannot be earned here; they are graded on the course's GPU after the deadline.", ""]
    elif gpu_points:
        out += [f"> **{gpu_points:g} of these points need a GPU** (bfloat16 cases and speed) and cannot be earned "
                "here: they are graded on the course's GPU after the deadline.", ""]
    out += ["| assignment | points | passed | failed | not run here | hidden cases |",
            "| --- | --- | --- | --- | --- | --- |"]
    for a in run.assignments:
        bad = sum(a.count(o) for o in BAD_OUTCOMES) + a.count(Outcome.INFRA_ERROR)
        gpu = (f"{a.count(Outcome.SKIPPED)} ({scaled(a, a.skipped_points, points):g} pts, GPU)"
               if a.count(Outcome.SKIPPED) else "0")
        out.append(f"| {for_markdown(a.name)} ({for_markdown_code(a.module, 200, table=True)}) | "
                   f"{scaled(a, a.score, points):g} / {scaled(a, out_of(a, basis), points):g} | "
                   f"{a.count(Outcome.PASSED)} | {bad} | {gpu} | {hidden.get(a.name, 0)} |")
    out += failures_markdown(run, hidden, 500, 500)
    out += ["", f"The full report (report.html, results.json) is the `{ARTIFACT}` artifact of this run: its "
            "Summary page lists it under Artifacts.", ""]
    return "\n".join(out)


def failures_markdown(run: RunResult, hidden: dict, message_limit: int, reproducer_limit: int) -> list[str]:
    """The lines after the table, for a job summary or a release body: where the hidden cases
    run, the one cause that explains an assignment's failures where there is one (an untouched
    starter), then each distinct failure once with the cases it concerns and the first one's
    reproducer (as the terminal tells them: grader.judge.feedback), the notes; student text escaped."""
    out: list[str] = []
    if any(hidden.values()):
        out += ["", "Hidden cases are not run here: they run at grading time, on top of the cases above."]
    groups = group_failures(run.tests)
    infra = list({(t.assignment, t.message): t for t in run.tests if t.outcome == Outcome.INFRA_ERROR}.values())
    headlines = [a for a in run.assignments if a.headline]
    if groups or infra or headlines:
        out += ["", "### Failing checks", ""]
        for a in headlines:  # one cause explains them all: said first, as the terminal and the report say it
            out.append(f"- **{for_markdown(a.name)}: {for_markdown(a.headline, message_limit)}**")
        for g in groups:
            t = g.first
            which = (for_markdown_code(t.name, 200) if len(g.tests) == 1
                     else f"{len(g.tests)} checks ({for_markdown(g.cases, message_limit)})")
            text = t.message if len(g.tests) == 1 else g.diagnosis
            out.append(f"- **{for_markdown(t.assignment)}** {which}: {t.outcome}: {for_markdown(text, message_limit)}")
            if t.reproducer:
                out.append(f"  reproduce: {for_markdown_code(t.reproducer, reproducer_limit)}")
        for t in infra:
            out.append(f"- **{for_markdown(t.assignment)}** {for_markdown_code(t.name, 200)}: {t.outcome}: "
                       f"{for_markdown(t.message, message_limit)}")
    notes = [n for a in run.assignments for n in a.notes]
    if notes:
        out += ["", "### Notes", "", *[f"- {for_markdown(n, message_limit)}" for n in notes]]
    return out


def report_github(run: RunResult, repo: Path, device: str, env: Mapping[str, str] | None = None, echo=print,
                  catalogue=None) -> None:
    """Write the summary and the Classroom output where Actions asks, and print the annotations.
    `catalogue`: the grader.spec.Course graded (its hidden cases are counted; default: the one
    the default settings imply)."""
    env = os.environ if env is None else env
    if catalogue is None:
        from grader.settings import Settings
        from grader.spec import Course

        catalogue = Course.find(Settings())
    hidden = {a.name: catalogue.get(a.name).hidden_count for a in run.assignments}
    basis = ci_score(catalogue)
    from grader.kit.points import shipped_points

    points = shipped_points(catalogue)  # the kit's [points]: course.toml's, which the gradebooks count in
    for line in annotations(run, repo, Path(env.get("GITHUB_WORKSPACE") or Path.cwd())):
        echo(line)
    echo(command("notice", score_words(run, basis, points), title="Points"))  # the run page's first line: our numbers
    if env.get("GITHUB_STEP_SUMMARY"):
        with open(env["GITHUB_STEP_SUMMARY"], "a", encoding="utf-8") as f:
            f.write(step_summary(run, device, hidden, basis, points))
    if env.get("GITHUB_OUTPUT"):
        with open(env["GITHUB_OUTPUT"], "a", encoding="utf-8") as f:
            f.write(f"result={encode(classroom_payload(run, repo, basis, points))}\n")


def report_error(message: str, env: Mapping[str, str] | None = None) -> None:
    """A check that could not run at all (no module found, a bad option): the summary says why,
    and Classroom gets an error payload instead of nothing."""
    env = os.environ if env is None else env
    if env.get("GITHUB_STEP_SUMMARY"):
        with open(env["GITHUB_STEP_SUMMARY"], "a", encoding="utf-8") as f:
            f.write(f"## Triton kernels: the check could not run\n\n{for_markdown(message, 2000)}\n")
    if env.get("GITHUB_OUTPUT"):
        payload = {"version": 1, "status": "error", "max_score": 0,
                   "tests": [{"name": "grader check", "status": "error", "score": 0,
                              "message": one_line(message, MESSAGE_LIMIT),
                              "test_code": "grader check", "filename": "", "line_no": 0, "duration": 0}]}
        with open(env["GITHUB_OUTPUT"], "a", encoding="utf-8") as f:
            f.write(f"result={encode(payload)}\n")


def report_stop(error: Exception, platform: str = "github", env: Mapping[str, str] | None = None, echo=print,
                payload: bool = True) -> None:
    """The runner stopped the check, or the assignment is broken, not the student's code
    (grader.kit.stops: a sandbox it cannot build, a course error): the first screen says so,
    with the course staff's one fix and the student told not to push again for it; an `::error`
    annotation (printed after the terminal's error line, outside its stop-commands block, so the
    runner reads it), the job summary, and with `payload` the error `result` output."""
    env = os.environ if env is None else env
    echo(command("error", stops.annotation(platform, error, MESSAGE_LIMIT), title=stops.title(error)))
    if env.get("GITHUB_STEP_SUMMARY"):
        with open(env["GITHUB_STEP_SUMMARY"], "a", encoding="utf-8") as f:
            f.write(stops.summary_markdown(platform, error))
    if payload and env.get("GITHUB_OUTPUT"):
        message = stops.annotation(platform, error, MESSAGE_LIMIT)
        data = {"version": 1, "status": "error", "max_score": 0,
                "tests": [{"name": "grader check", "status": "error", "score": 0, "message": message,
                           "test_code": "grader check", "filename": "", "line_no": 0, "duration": 0}]}
        with open(env["GITHUB_OUTPUT"], "a", encoding="utf-8") as f:
            f.write(f"result={encode(data)}\n")


def _short(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"
