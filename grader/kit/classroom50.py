"""`grader check --ci classroom50`: a grade for Classroom 50, which runs an assignment's
`autograder.py` in GitHub Actions in the student's repository and publishes what it writes as
a GitHub Release.

What the runner reads, all in the submission's folder (the autograder's working directory):
- `result.json` (schema `classroom50/result/v1`): the runner's environment echoed back, the
  score and one test per assignment, every score a non-negative integer (see `integer_points`);
- `release-body.md`: the release notes, which the runner also mirrors into the job summary (so
  a grade writes nothing to $GITHUB_STEP_SUMMARY: it would show twice);
- `status=` and a one-line `summary=` (a commit status, at most 140 characters) in $GITHUB_OUTPUT;
- `.grader/report.html`, the release asset the assignment's `release_assets` names.

The exit code is 0 whenever the student's work was graded, failing checks and a submission that
cannot be read at all (`ungraded`: 0 points, the reason said) included; 2 only for our own errors
(no runner environment, a sandbox that cannot start, an infra_error). On a non-zero exit the
runner replaces result.json and release-body.md with its own ("autograder exited 2") and
publishes no release, so `report_error` says what happened in the log's annotations and the job
summary, the places the runner leaves alone.

Everything a student wrote (messages, tracebacks, a module path from grader.toml) reaches
Markdown through `grader.sanitize.for_markdown`, the log's workflow commands through
grader.kit.annotations (`for_annotation`), and the commit status through `one_line`.
"""

import os
import re
from collections.abc import Mapping
from datetime import datetime, timezone
from fractions import Fraction
from pathlib import Path

from grader.kit import stops
from grader.kit.annotations import command, failures
from grader.kit.github import CI_SCORES, ci_score, failures_markdown, out_of
from grader.kit.points import scaled, shipped_points, total
from grader.payloads import Kind
from grader.results import BAD_OUTCOMES, AssignmentResult, Outcome, RunResult, TestResult, cents
from grader.sanitize import for_markdown, for_markdown_code, one_line

SCHEMA = "classroom50/result/v1"
RESULT = "result.json"
BODY = "release-body.md"
REPORT_ASSET = ".grader/report.html"
SUMMARY_LIMIT = 140  # a commit status's description
MESSAGE_LIMIT = 500
# what the runner gives the autograder; the URL fields must come back non-empty
ENV_FIELDS = {"classroom": "CLASSROOM", "assignment": "ASSIGNMENT", "owner": "OWNER",
              "assignment_type": "ASSIGNMENT_TYPE",
              "submission": "SUBMISSION_TAG", "commit": "COMMIT_URL", "release": "RELEASE_URL", "review": "REVIEW_URL"}
REQUIRED_ENV = ("CLASSROOM", "ASSIGNMENT", "SUBMISSION_TAG", "COMMIT_URL", "RELEASE_URL", "REVIEW_URL")
# a link target with nothing that ends a Markdown link
_SAFE_URL = re.compile(r"https://[A-Za-z0-9._~:/?#@!$&'*+,;=%-]+")


def slug_of(name: str) -> str:
    """Classroom 50's slug of one of our assignments: lower case, '-' for '_' (vector_add -> vector-add)."""
    return name.lower().replace("_", "-")


class Classroom50Error(Exception):
    """The runner's environment is not Classroom 50's: nothing can be graded for it."""


def mode(ci: str | None, env: Mapping[str, str] | None = None) -> str | None:
    """Which CI output `grader check` writes: `--ci` as given, or inside GitHub Actions
    (GITHUB_ACTIONS=true, no --ci) classroom50 where the runner set CLASSROOM and
    SUBMISSION_TAG, else github (the job summary, annotations and classroom-resources' `result`
    format, in a plain repository as in a Classmoji one). None: plain output."""
    env = os.environ if env is None else env
    if ci in ("classroom50", "github"):
        return ci
    if ci is None and env.get("GITHUB_ACTIONS") == "true":
        return "classroom50" if env.get("CLASSROOM") and env.get("SUBMISSION_TAG") else "github"
    return None


def runner_fields(env: Mapping[str, str] | None = None) -> dict[str, str]:
    """result.json's echo of the runner's environment; a Classroom50Error naming what is missing."""
    env = os.environ if env is None else env
    missing = [k for k in REQUIRED_ENV if not env.get(k)]
    if missing:
        raise Classroom50Error(f"--ci classroom50 needs Classroom 50's environment: {', '.join(missing)} "
                               f"{'is' if len(missing) == 1 else 'are'} not set")
    if not env["SUBMISSION_TAG"].startswith("submit/"):
        raise Classroom50Error(f"SUBMISSION_TAG {one_line(env['SUBMISSION_TAG'], 80)!r} does not start with submit/")
    return {key: env.get(var, "") for key, var in ENV_FIELDS.items()}


def remove_stale(folder: Path) -> None:
    """A result.json or release-body.md left from an earlier run must never be taken for this one's."""
    import shutil

    for name in (RESULT, BODY):
        path = Path(folder) / name
        if path.is_symlink() or path.is_file():
            path.unlink()
        elif path.is_dir():  # a folder of that name would stop the file being written
            shutil.rmtree(path)


# -- integer points --------------------------------------------------------------------------------

def round_half_up(value: Fraction) -> int:
    return int((value * 2 + 1) // 2)


def apportion(exact: list[Fraction], total: int, caps: list[int] | None = None) -> list[int]:
    """Integers that add up to `total`, each the floor of its exact value plus at most what the
    largest remainders earn (largest-remainder rounding, ties in order), never above its cap."""
    parts = [int(x // 1) for x in exact]
    if caps is not None:
        parts = [min(p, c) for p, c in zip(parts, caps)]
    order = sorted(range(len(exact)), key=lambda i: (-(exact[i] - int(exact[i] // 1)), i))
    left = total - sum(parts)
    while left > 0:
        moved = False
        for i in order:
            if left and (caps is None or parts[i] < caps[i]):
                parts[i] += 1
                left -= 1
                moved = True
        if not moved:
            raise ValueError(f"cannot apportion {total} under the caps {caps}")
    while left < 0:  # only when a total was rounded down below the floors' sum, which round_half_up never does
        i = max((i for i in range(len(parts)) if parts[i] > 0), key=lambda i: parts[i] - exact[i])
        parts[i] -= 1
        left += 1
    return parts


def integer_points(assignments: list[AssignmentResult], basis: str = CI_SCORES[0],
                   points: dict[str, Fraction] | None = None) -> tuple[int, int, list[tuple[int, int]]]:
    """(score, max-score, [(score, max-score) per assignment]) in whole points: the exact totals
    (kept in cents) rounded half up, each assignment's share by largest remainder, so the parts
    add up exactly to the totals and no assignment scores above its own maximum. Each maximum is
    out of what `basis` says (grader.kit.github.ci_score: the points this runner can grade, or
    the whole), in the course's `points` where the kit ships them (grader.kit.points)."""
    points = points or {}
    scores = [_exact(a, a.score, points) for a in assignments]
    maxes = [_exact(a, out_of(a, basis), points) for a in assignments]
    top = round_half_up(sum(maxes, Fraction(0)))
    score = min(round_half_up(sum(scores, Fraction(0))), top)
    top_parts = apportion(maxes, top)
    return score, top, list(zip(apportion(scores, score, top_parts), top_parts))


def _exact(a: AssignmentResult, value: float, points: dict[str, Fraction]) -> Fraction:
    """`value` of `a` exactly: in cents, or in the course's points as the class view rounds them."""
    return Fraction(repr(scaled(a, value, points))) if a.name in points else Fraction(cents(value), 100)


# -- what the runner reads -------------------------------------------------------------------------

def _gpu_points(a: AssignmentResult, points: dict[str, Fraction] | None = None) -> tuple[float, list[str]]:
    """The points of `a` that need a GPU here (in the course's `points`, where shipped), and what
    they are (bfloat16 cases, speed)."""
    skipped = [t for t in a.tests if t.outcome == Outcome.SKIPPED and t.max_score]
    kinds = []
    if any(t.dtype == "bfloat16" for t in skipped):
        kinds.append("bfloat16 cases")
    if any(t.kind == "performance" for t in skipped):
        kinds.append("speed")
    if skipped and not kinds:
        kinds.append("checks that need a GPU")
    return scaled(a, a.skipped_points, points or {}), kinds


def status_of(run: RunResult) -> str:
    outcomes = {t.outcome for t in run.tests}
    if Outcome.INFRA_ERROR in outcomes:
        return "error"
    return "failure" if outcomes & BAD_OUTCOMES or not run.tests else "success"


def _assignment_message(a: AssignmentResult, score: int, top: int, basis: str,
                        points: dict[str, Fraction] | None = None) -> str:
    points = points or {}
    bad = [t for t in a.tests if t.outcome in BAD_OUTCOMES or t.outcome == Outcome.INFRA_ERROR]
    counted_here = basis == "cpu-gradable" and a.gpu_points_not_graded
    here = f", gradable here, of {scaled(a, a.max_score, points):g} at grading" if counted_here else ""
    course = f" in the course's points, {a.score:g} of {out_of(a, basis):g} of its own" if a.name in points else ""
    words = [f"{score} of {top} points ({scaled(a, a.score, points):g} of {scaled(a, out_of(a, basis), points):g} "
             f"exactly{here}{course})",
             f"{a.count(Outcome.PASSED)} checks passed"]
    if bad and a.headline:  # one cause explains every failure (an untouched starter): that, not the first case
        words.append(f"{len(bad)} failed: {a.headline}")
    elif bad:
        words.append(f"{len(bad)} failed, first {bad[0].name}: {bad[0].outcome}: {bad[0].message}")
    gpu, kinds = _gpu_points(a, points)
    if gpu:
        words.append(f"{gpu:g} points need a GPU ({', '.join(kinds)}) and this runner has none: "
                     + ("they are graded on a GPU, not counted here" if here else "they earn nothing here"))
    return one_line("; ".join(words), MESSAGE_LIMIT)


def result_json(run: RunResult, fields: dict[str, str], now: datetime | None = None,
                basis: str = CI_SCORES[0], points: dict[str, Fraction] | None = None) -> dict:
    """result.json as Classroom 50's runner accepts it: no key of our own at the top, integer points
    out of what `basis` says, in the course's `points` where the kit ships them."""
    points = points or {}
    score, top, parts = integer_points(run.assignments, basis, points)
    tests = []
    for a, (s, m) in zip(run.assignments, parts):
        gpu, kinds = _gpu_points(a, points)
        tests.append({
            "test-name": f"{a.name}: {a.title}",
            "passed": not any(t.outcome in BAD_OUTCOMES or t.outcome == Outcome.INFRA_ERROR for t in a.tests),
            "score": s,
            "max-score": m,
            "message": _assignment_message(a, s, m, basis, points),
            # kept by the runner: the exact points (the course's, where it ships them) and what could not run here
            "exact-score": f"{scaled(a, a.score, points):g}",
            "exact-max-score": f"{scaled(a, out_of(a, basis), points):g}",
            "outcomes": {o.value: a.count(o) for o in Outcome if a.count(o)},
        })
        if gpu:
            tests[-1]["needs-gpu"] = {"points": f"{gpu:g}", "what": kinds,
                                      "counted": basis == "whole" or not a.gpu_points_not_graded}
    when = (now or datetime.now(timezone.utc)).astimezone(timezone.utc)
    return {"schema": SCHEMA, **fields, "datetime": when.strftime("%Y-%m-%dT%H:%M:%SZ"),
            "score": score, "max-score": top, "tests": tests}


def _link(text: str, url: str) -> str:
    """A Markdown link where the URL is a plain https one; else the text alone (a URL from the
    environment is never trusted to end a link where it should)."""
    return f"[{text}]({url})" if _SAFE_URL.fullmatch(url or "") else text


def report_url(release_url: str) -> str:
    """The report asset's download address from the release's page address
    (.../releases/tag/TAG -> .../releases/download/TAG/report.html); '' if it is not one."""
    head, sep, tag = (release_url or "").partition("/releases/tag/")
    return f"{head}/releases/download/{tag}/report.html" if sep and tag else ""


def release_body(run: RunResult, fields: dict[str, str], device: str, hidden: dict[str, int],
                 basis: str = CI_SCORES[0], points: dict[str, Fraction] | None = None) -> str:
    """The release notes (GitHub Markdown): the score, each assignment, each failing check with
    its reproducer, the points that need a GPU, a link to the report asset; in the course's
    `points` where the kit ships them."""
    points = points or {}
    score, top, parts = integer_points(run.assignments, basis, points)
    exact_score = total(run.assignments, lambda a: a.score, points)
    exact_top = total(run.assignments, lambda a: out_of(a, basis), points)
    at_grading = total(run.assignments, lambda a: a.max_score, points)
    here = basis == "cpu-gradable" and bool(run.gpu_points_not_graded)
    where = "a GPU" if device == "cuda" else "the CPU (Triton's interpreter: no timing, no bfloat16)"
    status = status_of(run)
    out = [f"## Triton kernels: {score} / {top} points{' gradable here' if here else ''}", "",
           f"Submission {for_markdown_code(fields['submission'], 120)}, "
           f"{_link('this commit', fields['commit'])}, graded on {where}, seed {run.seed}. "
           f"Exact points: {exact_score:g} / {exact_top:g} (whole points: the totals rounded half up, "
           "each assignment's share by largest remainder).", ""]
    if any(a.name in points for a in run.assignments):
        out += [f"Points are the course's (course.toml's, as its gradebooks count them); the checks count "
                f"{run.score:g} / {out_of(run, basis):g} of the assignments' own. No late penalty is applied here: "
                "the course applies it at grading.", ""]
    if status == "error":
        out += ["> **The grader failed on its own side** (infra_error): this is no grade. Push again, or tell the "
                "course staff if it happens again.", ""]
    gpu_total = total(run.assignments, lambda a: a.skipped_points, points)
    if gpu_total:
        what = sorted({k for a in run.assignments for k in _gpu_points(a)[1]})
        if here:
            out += [f"> **{at_grading:g} points at grading**: {gpu_total:g} more need a GPU ({', '.join(what)}), "
                    "which this runner has none of, so they are not counted here. They are graded on a GPU runner, or "
                    "by the course staff after the deadline.", ""]
        else:
            out += [f"> **{gpu_total:g} of these points need a GPU** ({', '.join(what)}): this runner has none, so "
                    "they earn nothing here. They are graded on a GPU runner, or by the course staff after the "
                    "deadline.", ""]
    out += ["| assignment | points | passed | failed | need a GPU | hidden cases |",
            "| --- | --- | --- | --- | --- | --- |"]
    for a, (s, m) in zip(run.assignments, parts):
        bad = sum(a.count(o) for o in BAD_OUTCOMES) + a.count(Outcome.INFRA_ERROR)
        gpu, kinds = _gpu_points(a, points)
        need = f"{gpu:g} pts ({', '.join(kinds)})" if gpu else "0"
        out.append(f"| {for_markdown(a.name)} ({for_markdown(a.module, 120)}) | {s} / {m} | {a.count(Outcome.PASSED)} "
                   f"| {bad} | {need} | {hidden.get(a.name, 0)} |")
    out += failures_markdown(run, hidden, MESSAGE_LIMIT, 400)
    asset = report_url(fields["release"])
    out += ["", f"The full report: {_link('report.html', asset) if asset else '`report.html`'}, an asset of "
            f"{_link('this release', fields['release'])}.", ""]
    return "\n".join(out)


def summary_line(run: RunResult, basis: str = CI_SCORES[0], points: dict[str, Fraction] | None = None) -> str:
    """The commit status: one line, at most 140 characters."""
    points = points or {}
    score, top, _ = integer_points(run.assignments, basis, points)
    status = status_of(run)
    words = [f"{score}/{top} points"]
    bad = sum(t.outcome in BAD_OUTCOMES for t in run.tests)
    if status == "error":
        words.append("the grader failed (infra_error): no grade")
    elif bad:
        words.append(f"{bad} check(s) failing")
    else:
        words.append("every check passed")
    if run.skipped_points:
        counted = basis == "whole" or not run.gpu_points_not_graded
        gpu = total(run.assignments, lambda a: a.skipped_points, points)
        at_grading = total(run.assignments, lambda a: a.max_score, points)
        words.append(f"{gpu:g} need a GPU" + ("" if counted else f" (of {at_grading:g} at grading)"))
    return one_line(", ".join(words), SUMMARY_LIMIT)


def annotations(run: RunResult, repo: Path, workspace: Path) -> list[str]:
    """`::error` commands where a failure points at a line of the student's code; each message on
    one line, cut at MESSAGE_LIMIT."""
    return failures(run, repo, workspace, lambda message: one_line(message, MESSAGE_LIMIT))


def _outputs(env: Mapping[str, str], status: str, summary: str) -> None:
    if env.get("GITHUB_OUTPUT"):
        with open(env["GITHUB_OUTPUT"], "a", encoding="utf-8") as f:
            f.write(f"status={status}\nsummary={one_line(summary, SUMMARY_LIMIT)}\n")


def report(run: RunResult, repo: Path, device: str, env: Mapping[str, str] | None = None, echo=print,
           catalogue=None) -> int:
    """Write result.json, release-body.md and the outputs into the submission's folder; print
    the annotations. Returns the exit code: 0 graded, 2 an infra_error (no score released).
    `catalogue`: the grader.spec.Course graded (its hidden cases are counted; default: the one
    the default settings imply)."""
    env = os.environ if env is None else env
    fields = runner_fields(env)
    catalogue = catalogue if catalogue is not None else _default_course()
    hidden = {a.name: catalogue.get(a.name).hidden_count for a in run.assignments}
    basis = ci_score(catalogue)  # the released grader-kit.toml's (the autograder's own course), not the checkout's
    points = shipped_points(catalogue)  # its [points]: course.toml's, which the gradebooks count in
    for line in annotations(run, repo, Path(env.get("GITHUB_WORKSPACE") or repo)):
        echo(line)
    from grader.results import write_json_atomic, write_text_atomic

    write_text_atomic(release_body(run, fields, device, hidden, basis, points), repo / BODY)
    write_json_atomic(result_json(run, fields, basis=basis, points=points), repo / RESULT)
    status = status_of(run)
    _outputs(env, status, summary_line(run, basis, points))
    return 2 if status == "error" else 0


def ungraded(names: list[str], reason: str, seed: int = 0, catalogue=None) -> RunResult:
    """A submission that cannot be read at all (a malformed grader.toml, no kernel anywhere):
    the student's problem, so a grade of 0 for each assignment asked for (of `catalogue`, a
    grader.spec.Course), the reason its one failure, rather than no grade (the runner would
    replace an exit 2's explanation with its own)."""
    catalogue = catalogue if catalogue is not None else _default_course()
    run = RunResult(submission="", seed=seed, environment={})
    for name in names:
        spec = catalogue.get(name)
        a = AssignmentResult(name, spec.title, "(not found)", headline=one_line(reason, MESSAGE_LIMIT))
        a.tests.append(TestResult(name, Kind.CORRECTNESS, "submission", Outcome.FAILED, one_line(reason, MESSAGE_LIMIT),
                                  max_score=spec.max_points))
        run.assignments.append(a)
    return run


def _default_course():
    """The course the default settings imply, where a caller gives none (a test)."""
    from grader.settings import Settings
    from grader.spec import Course

    return Course.find(Settings())


def report_error(message: str, repo: Path | None, env: Mapping[str, str] | None = None,
                 echo=print, cause: Exception | None = None) -> None:
    """Our own failure (no runner environment, the sandbox or an option that cannot work): no
    result.json, so no score is released and the exit is 2. The runner then writes its own
    result.json and release body ("autograder exited 2"), so what the student must know goes
    where it survives: an `::error` line (an annotation on the run's page, which the commit
    status links to) and the job summary, which the runner appends its body to."""
    env = os.environ if env is None else env
    if repo is not None and repo.is_dir():
        remove_stale(repo)
    if cause is not None and stops.stops_every_push(cause):
        # the runner's or the assignment's fault, on every push: said first, the staff's fix within the
        # 300 characters kept
        echo(command("error", stops.classroom50_annotation(cause), title=stops.title(cause)))
        if env.get("GITHUB_STEP_SUMMARY"):
            with open(env["GITHUB_STEP_SUMMARY"], "a", encoding="utf-8") as f:
                f.write(stops.summary_markdown("classroom50", cause))
        _outputs(env, "error", "the assignment is broken, not your code: the course staff must mend it"
                 if stops.is_course_error(cause) else
                 "the runner stopped the check, not your code: the course staff must fix it")
        return
    echo(command("error", one_line(message, MESSAGE_LIMIT), title="The grader could not run"))
    if env.get("GITHUB_STEP_SUMMARY"):
        with open(env["GITHUB_STEP_SUMMARY"], "a", encoding="utf-8") as f:
            f.write(f"## Triton kernels: the grader could not run\n\n{for_markdown(message, 2000)}\n\n"
                    "This is the grader's failure, not a grade of your work: nothing was scored. Push again (a new "
                    "submission), and if it happens again tell the course staff, with a link to this page.\n\n")
    _outputs(env, "error", f"the grader could not run: {message}")
