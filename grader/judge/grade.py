"""Grade one assignment of one submission: the stages, in order, each a function of one
`Grading` (what the stages read and add to) run by `grade_assignment`:

    locate -> prepare -> load -> correctness -> shrinking -> integrity -> bounds_check -> performance -> scoring

- locate: the student's module, or one result that says it is missing or cannot be graded;
- prepare: the inputs written outside the worker's view, the repo's private copy, the static scan;
- load: a sandboxed worker imports the module, or one result says why it did not;
- correctness: every planned call, judged; a worker that dies is restarted for the rest;
- shrinking: each distinct failure's smallest failing case (grader.judge.shrink);
- integrity: whether the student's own Triton kernel did the work;
- bounds_check: on a GPU, the small cases replayed in the interpreter with every access checked
  (started once the module loads, on the CPU beside the correctness calls on the GPU; its result
  is taken here, in its place);
- performance: the timing against the reference and torch (grader.judge.perf);
- scoring: the points (grader.judge.scoring), the hidden-case note, the headline.

This is the only module that drives the student's workers; the resources it drives them with
come from the session (grader.judge.session). Every failure of student code becomes an outcome on
the tests it touched (error, timeout, crashed), and the other assignments never notice.
"""

from __future__ import annotations

import errno
import time
from collections import Counter
from concurrent.futures import Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable, Sequence

from grader.device import Device
from grader.judge import perf, shrink
from grader.judge.context import GradingContext
from grader.judge.evidence import EvidenceError, Expected, read_saved
from grader.judge.feedback import headline, what_to_change
from grader.judge.integrity import OwnKernelCheck, scan_submission, trivial_result
from grader.judge.integrity import summary as scan_summary
from grader.judge.nonfinite import read_source
from grader.judge.plan import PlannedCall, load_inputs, make_inputs, materialize
from grader.judge.resources import Resources
from grader.judge.scoring import score_assignment, split_cents
from grader.judge.verdict import judge_call, judge_runs, truth_of
from grader.judge.workers import StudentWorker
from grader.payloads import (
    Ceilings,
    CorrectnessPayload,
    Kind,
    LargestPassing,
    PerformancePayload,
    SmallestFailing,
    SubmissionPayload,
)
from grader.protocol import Failure, Run, RunReply
from grader.results import WORKER_FAILURES, AssignmentResult, Outcome, TestResult, cents
from grader.sandbox.files import output_path, shown_to_worker
from grader.sandbox.process import WorkerFailure
from grader.sanitize import one_line
from grader.spec import Assignment, Case
from grader.submission import Submission


class Restarts:
    """The retry policy of one worker's calls, for every stage that calls it: after a crash or a
    timeout the next call gets a fresh worker; after MAX_TIMEOUTS timeouts in a row the rest are
    not run (a hanging kernel: each call would wait its whole timeout)."""

    MAX_TIMEOUTS = 2

    def __init__(self) -> None:
        self.timeouts = 0
        self.restart = False  # the last call left the worker dead: start a fresh one before the next

    @property
    def given_up(self) -> bool:
        return self.timeouts >= self.MAX_TIMEOUTS

    def after(self, outcome: str) -> None:
        """Count the outcome of a call."""
        self.timeouts = self.timeouts + 1 if outcome == Outcome.TIMEOUT else 0
        self.restart = outcome in WORKER_FAILURES

    def restarting(self) -> bool:
        """True once, when the next call needs a fresh worker (and the calls have not been given up)."""
        due, self.restart = self.restart and not self.given_up, False
        return due


Progress = Callable[[str], None]


def measured_roofline(result: AssignmentResult) -> dict | None:
    """The GPU's measured ceilings, as the assignment's timing used them (None: nothing timed)."""
    timed = [t.details for t in result.tests if isinstance(t.details, PerformancePayload)]
    return next((d.roofline.to_json() for d in timed if isinstance(d.roofline, Ceilings)), None)


def count_steps(specs: list[Assignment], ctx: GradingContext) -> int:
    """How many progress steps a grading reports: one per call, one per timing, and on a GPU
    one per bounds check (when an assignment's module is missing, that step never comes)."""
    return sum(len(ctx.calls(s)) + (s.performance is not None) + (not ctx.interpret) for s in specs)


@dataclass
class Grading:
    """One assignment of one submission on its way through the stages."""

    session: Resources  # the grading session's resources (grader.judge.resources)
    sub: Submission
    spec: Assignment
    workdir: Path
    step: Progress
    roofline: dict | None  # the GPU's ceilings if the run measured them already (else timing measures them)
    result: AssignmentResult = field(init=False)
    calls: list[PlannedCall] = field(init=False)
    runnable: list[PlannedCall] = field(init=False)
    target: tuple[str, str] = field(init=False)  # the student's (module, function), as grader.toml may name them
    module_file: Path | None = None
    worker: StudentWorker | None = None
    integrity: OwnKernelCheck = field(init=False)
    load_failure: Failure | None = None
    done: bool = False  # a stage gave the assignment's one result: no later stage runs, nothing is scored
    bounds: Future | None = None  # the bounds check, running beside the correctness calls (`load_module`)

    def __post_init__(self) -> None:
        ctx = self.session.context
        self.target = self.sub.target(self.spec)
        self.result = AssignmentResult(self.spec.name, self.spec.title, f"{self.module}:{self.target[1]}()")
        self.calls = ctx.calls(self.spec)
        self.runnable = [c for c in self.calls if not c.skip]
        self.integrity = OwnKernelCheck(self.spec)

    @property
    def ctx(self) -> GradingContext:
        return self.session.context

    @property
    def module(self) -> str:
        return self.target[0]

    @property
    def neighbours(self) -> list[Path]:
        """The submission's folder and the folders beside it (other students): out of every worker's view."""
        return [self.sub.root.parent]

    @property
    def call_timeout(self) -> float:
        return self.ctx.call_timeout_for(self.spec)

    @property
    def loaded(self) -> bool:
        return bool(self.runnable) and self.load_failure is None

    def finish(self, result: AssignmentResult) -> None:
        self.result, self.done = result, True


def locate(g: Grading) -> None:
    """The student's module; missing, or named so that it cannot be graded: one result says so."""
    g.module_file, problem = g.sub.locate(g.spec)
    if g.runnable and g.module_file is None:  # one result that says so, not one error per case
        g.finish(not_gradable(g.spec, g.ctx, g.result, problem) if problem
                 else _not_submitted(g.spec, g.sub, g.ctx, g.result, g.module))


def prepare(g: Grading) -> None:
    """Inputs made outside the worker's view (each call's file is shown to it only for that call,
    so no input can be read ahead and answered from a precomputed cache), the repo's private
    copy, and the static scan of that copy."""
    g.session.warm_up()
    g.worker = g.session.student_worker(g.spec, g.workdir / "repo", g.target, g.workdir / "scratch",
                                        hide=g.neighbours)
    if not g.runnable:
        return
    materialize(g.spec, g.runnable, g.workdir.parent / f"{g.spec.name}.inputs")
    left_out = g.sub.private_copy(g.workdir / "repo")
    if left_out:  # counts only: the names are the student's, and nothing of theirs is followed
        g.result.notes.append("Not copied for grading: "
                              + ", ".join(f"{n} {what}" for what, n in sorted(left_out.items())))
    _scan(g.result, g.workdir / "repo", g.module)


def load_module(g: Grading) -> None:
    """The worker imports the module; if it cannot, one result says why, not the same error once per case."""
    if not g.runnable:
        return
    assert g.worker is not None  # prepare started it
    g.load_failure = _start(g.worker, g.spec)
    if g.load_failure:
        g.finish(_unloadable(g.spec, g.ctx, g.result, g.module, g.calls, g.runnable, g.load_failure))
    elif not g.ctx.interpret:  # in the interpreter on the CPU, beside the correctness calls on the GPU
        g.bounds = _BOUNDS.submit(_bounds_check, g.session, g.spec, g.target, g.workdir, g.call_timeout, g.neighbours)


def correctness(g: Grading) -> None:
    """Every planned call, judged; after a crash or a timeout the next call gets a fresh worker,
    and after two timeouts in a row the rest are not run (each would wait its whole timeout)."""
    spec, ctx, result = g.spec, g.ctx, g.result
    restarts = Restarts()
    for call in g.calls:
        g.step(f"{spec.name}: {call.id}")
        if call.skip:
            result.tests.append(_test(spec, call, ctx, Outcome.SKIPPED, call.skip))
            continue
        assert g.worker is not None  # prepare started it
        if restarts.restarting() and not g.load_failure:
            g.load_failure = _start(g.worker, spec)  # a fresh worker, once a call needs one
        if g.load_failure:
            result.tests.append(_from_failure(spec, call, ctx, g.load_failure, f"importing {g.module} failed"))
            continue
        if restarts.given_up:
            result.tests.append(_test(spec, call, ctx, Outcome.TIMEOUT, "not run: the calls before this one timed out"))
            continue
        test = _run_call(spec, call, ctx, g.worker, g.workdir, g.call_timeout, g.integrity)
        result.tests.append(test)
        restarts.after(test.outcome)


def shrinking(g: Grading) -> None:
    if g.loaded:
        assert g.worker is not None  # prepare started it
        _shrink_failures(g.spec, g.ctx, g.worker, g.workdir, g.result, g.calls, g.call_timeout)


def integrity(g: Grading) -> None:
    g.result.tests.append(g.integrity.test())


def bounds_check(g: Grading) -> None:
    """The bounds check's result, in its place: started by `load_module`, waited for here."""
    bounds, g.bounds = g.bounds, None
    if bounds is None:
        return
    g.step(f"{g.spec.name}: bounds check")
    test = bounds.result()
    if g.loaded:  # a worker that could not be restarted for the correctness calls: nothing is checked
        g.result.tests.append(test)


# the bounds checks of assignments graded at once, each in its own thread (it waits on its worker)
_BOUNDS = ThreadPoolExecutor(max_workers=16, thread_name_prefix="bounds-check")


def performance(g: Grading) -> None:
    if g.spec.performance is not None:
        assert g.worker is not None  # started by prepare(), a stage before this one
        g.step(f"{g.spec.name}: performance")
        g.result.tests.append(perf.measure(g.session, g.spec, g.result, g.worker, g.workdir, g.call_timeout,
                                           g.roofline))


def scoring(g: Grading) -> None:
    spec, ctx, result = g.spec, g.ctx, g.result
    planned = None
    if ctx.partial:  # a partial run: each case keeps its share of the full run's points
        planned = [c.test_name for c in ctx.full_plan(spec)]
        result.partial = {"cases_run": len(g.calls), "cases": len(planned), "assignment_points": spec.max_points}
    score_assignment(spec, result, planned)
    if note := hidden_note(spec):
        result.notes.append(note)
    result.headline = headline(result, g.module_file)


# The stages in order, each with the name its seconds are recorded under (a job's phase_seconds)
STAGES: tuple[tuple[Callable[[Grading], None], str | None], ...] = (
    (locate, None),
    (prepare, "inputs_and_copy"),
    (load_module, "worker_start_and_import"),
    (correctness, "correctness_calls"),
    (shrinking, "shrinking"),
    (integrity, None),
    (bounds_check, "bounds_check"),
    (performance, "performance"),
)


def grade_assignment(session: Resources, sub: Submission, spec: Assignment, workdir: Path,
                     progress: Progress | None = None, roofline: dict | None = None,
                     phases: dict[str, float] | None = None) -> AssignmentResult:
    """Run the stages on one assignment. `phases`, if given, gets the seconds of each stage
    (where a job's time goes), added to what it holds."""
    phases = phases if phases is not None else {}
    g = Grading(session, sub, spec, workdir, progress or (lambda _: None), roofline)
    clock = time.monotonic()

    def lap(name: str) -> None:
        nonlocal clock
        now = time.monotonic()
        phases[name] = round(phases.get(name, 0.0) + now - clock, 3)
        clock = now

    try:
        try:
            for stage, phase in STAGES:
                stage(g)
                if phase:
                    lap(phase)
                if g.done:
                    break
        except Exception as exc:  # the machine, not the submission: an infra error that says what ran out
            cause = exhausted(exc)
            if cause is None:
                raise
            g.finish(_one_result(spec, g.ctx, g.result, g.calls, g.runnable, TestResult(
                spec.name, Kind.SUBMISSION, "machine", Outcome.INFRA_ERROR,
                f"the machine ran out of {cause} while grading {spec.name} ({one_line(str(exc), 200)}): nothing of "
                f"it was graded; free some and grade it again", details=SubmissionPayload(infra_error=True))))
    finally:
        if g.bounds is not None:  # a stage before it raised: its worker is closed as it ends
            g.bounds.cancel() or wait([g.bounds])
        if g.worker is not None:
            g.worker.close()
            lap("closing")
            if not g.ctx.interpret:  # of the correctness calls' time above, what went to waiting for the GPU
                phases["calls_waiting_for_gpu"] = round(phases.get("calls_waiting_for_gpu", 0.0) + g.worker.gpu_wait, 3)
    if not g.done:
        scoring(g)
    return g.result


EXHAUSTED = {errno.ENOSPC: "disk space", errno.EDQUOT: "disk quota", errno.ENOMEM: "memory"}


def exhausted(exc: BaseException) -> str | None:
    """What of the machine ran out where `exc` says so (a full disk, exhausted memory, the GPU's
    memory or the GPU itself lost); None for anything else. Said by an errno, or by the message
    of a library that wraps one (safetensors writes "No space left on device" in its own error)."""
    if isinstance(exc, MemoryError):
        return "memory"
    if isinstance(exc, OSError) and exc.errno in EXHAUSTED:
        return EXHAUSTED[exc.errno]
    text = str(exc)
    if "No space left on device" in text:
        return "disk space"
    if "Disk quota exceeded" in text:
        return "disk quota"
    if "CUDA out of memory" in text:
        return "GPU memory"
    if "CUDA error" in text or "no CUDA-capable device" in text:
        return "a working GPU"
    return None


def _not_submitted(spec: Assignment, sub: Submission, ctx: GradingContext, result: AssignmentResult,
                   module: str) -> AssignmentResult:
    """The assignment's module is not in the repo: one failed result worth every point this
    run could have earned (the cases that run here, speed on a GPU), and the rest noted."""
    named = " (the module grader.toml names)" if "module" in sub.overrides.get(spec.name, {}) else ""
    test = TestResult(spec.name, Kind.SUBMISSION, "not submitted", Outcome.FAILED,
                      f"{module}{named} is not in the submission: nothing of {spec.name} was checked",
                      details=SubmissionPayload(not_submitted=True))
    calls = ctx.calls(spec)
    return _one_result(spec, ctx, result, calls, [c for c in calls if not c.skip], test)


def not_gradable(spec: Assignment, ctx: GradingContext, result: AssignmentResult, why: str) -> AssignmentResult:
    """What the student set up cannot be graded (grader.toml unreadable or of the wrong shape, a
    module that leads out of the repo or is not a file): the student's outcome, failed with the
    reason in one line, worth the points `_not_submitted` would be; never the grader's error."""
    calls = ctx.calls(spec)
    test = TestResult(spec.name, Kind.SUBMISSION, "cannot be graded", Outcome.FAILED,
                      f"{why}: nothing of {spec.name} was checked",
                      details=SubmissionPayload(not_gradable=True))
    return _one_result(spec, ctx, result, calls, [c for c in calls if not c.skip], test)


def _unloadable(spec: Assignment, ctx: GradingContext, result: AssignmentResult, module: str,
                calls: list[PlannedCall], runnable: list[PlannedCall], failure: Failure) -> AssignmentResult:
    """The module is there but gives no function to call: it lacks the function (not submitted,
    as a missing module is) or its import failed (one error with the student's traceback). Either
    way no case could run, so one result says it, worth what the cases were worth."""
    if failure.kind == "missing":
        test = TestResult(spec.name, Kind.SUBMISSION, "not submitted", Outcome.FAILED,
                          f"{module} defines no function {spec.function}(): nothing of {spec.name} was checked "
                          f"(write {spec.signature} in {module})",
                          details=SubmissionPayload(not_submitted=True, missing_function=spec.function, module=module))
    elif failure.kind == Outcome.INFRA_ERROR:  # ours (no worker could start): never said as the student's import
        test = TestResult(spec.name, Kind.SUBMISSION, "worker", Outcome.INFRA_ERROR,
                          f"none of its {len(runnable)} checks ran: {failure.message}", output=failure.output,
                          details=SubmissionPayload(infra_error=True))
    else:
        outcome = Outcome(failure.kind) if failure.kind in WORKER_FAILURES else Outcome.ERROR
        test = TestResult(spec.name, Kind.SUBMISSION, "import", outcome,
                          f"importing {module} failed, so none of its {len(runnable)} checks ran: {failure.message}",
                          traceback=failure.traceback, output=failure.output,
                          details=SubmissionPayload(import_failed=True))
    first = runnable[0]  # any one case reproduces an import that fails
    test.reproducer = (f"{ctx.reproducer} -a {spec.name} {_case_option(spec, first.case)} --dtype {first.dtype} "
                       f"--seed {first.seed}")
    return _one_result(spec, ctx, result, calls, runnable, test)


def _one_result(spec: Assignment, ctx: GradingContext, result: AssignmentResult, calls: list[PlannedCall],
                runnable: list[PlannedCall], test: TestResult) -> AssignmentResult:
    """`test` in place of every check of the assignment: worth every point this run could have
    earned (the cases that run here, speed on a GPU), earning none; what needs a GPU noted apart."""
    planned = [c.test_name for c in (ctx.full_plan(spec) if ctx.partial else calls)]
    shares = dict(zip(planned, split_cents(spec.correctness_points, len(planned))))
    share = {c.id: shares.get(c.test_name, 0) for c in calls}
    perf = cents(spec.performance_points) if spec.performance is not None else 0
    timed = spec.performance is not None and not ctx.interpret
    test.max_score = (sum(share[c.id] for c in runnable) + (perf if timed else 0)) / 100
    skipped = sum(share[c.id] for c in calls if c.skip) + (0 if timed else perf)
    # what a GPU run would add: part of the total, earned nowhere here (as a graded submission's skipped tests)
    if skipped:
        why = test.details if isinstance(test.details, SubmissionPayload) else SubmissionPayload()
        result.tests.append(TestResult(spec.name, Kind.SUBMISSION, "checks that need a GPU", Outcome.SKIPPED,
                                       "not submitted, and not runnable here" if why.not_submitted
                                       else "not graded, and not runnable here" if why.not_gradable or why.infra_error
                                       else "not runnable here, and the module did not import",
                                       max_score=skipped / 100, details=SubmissionPayload(points_if_run=skipped / 100)))
    result.tests.insert(0, test)
    if ctx.partial:
        result.partial = {"cases_run": len(calls), "cases": len(planned), "assignment_points": spec.max_points}
    return result


def hidden_note(spec: Assignment) -> str:
    """What a report says of the hidden cases: how many, and that they run at grading."""
    if spec.withheld_cases:
        return (f"{spec.withheld_cases} hidden case(s) of {spec.name} are not in this kit: they run at grading time, "
                "with random shapes of their own. Passing every case here does not guarantee them.")
    here = sum(c.hidden for c in spec.cases)
    return f"{here} of these cases are hidden from students (they run at grading time only)." if here else ""


BOUNDS_CHECK_MAX_ELEMENTS = 1 << 18


def _bounds_check(session: Resources, spec: Assignment, target: tuple[str, str], workdir: Path, timeout: float,
                  hide: Sequence[Path] = ()) -> TestResult:
    """On a GPU an out-of-bounds load or store often goes unseen: it reads a neighbour's
    memory and the values inside the tensor still come out right. So a GPU run replays the
    small named cases, in float32, in Triton's CPU interpreter, where grader.worker.memcheck checks
    every access against the bounds of the kernel's tensors."""
    ctx = session.context
    kept = session.kept_bounds  # a check that keeps it: an unchanged repository is not checked again
    # kept, its inputs are the check's fixed performance seed's (the seed given, else one for every
    # check, grader.judge.context.kept_between_checks), so the same repository is the same check
    cpu = replace(ctx, device=Device.CPU, dtypes=("float32",), cases=None,
                  seed=ctx.perf_seed if kept is not None and ctx.perf_seed is not None else ctx.seed)
    calls = [c for c in cpu.calls(spec) if c.case in spec.cases
             and sum(t.numel() for t in make_inputs(spec, c.case, c.dtype, c.seed).values()
                     if hasattr(t, "numel")) <= BOUNDS_CHECK_MAX_ELEMENTS]
    described = [(c.case.name, repr(c.case.params), c.dtype, c.seed, c.skip or "") for c in calls]
    key = kept.key(workdir / "repo", Path(spec.folder), described) if kept is not None else None
    if kept is not None and key is not None and (hit := kept.get(key)) is not None:
        try:
            return TestResult.from_json(hit)
        except (TypeError, ValueError, KeyError):
            pass  # not a result this grader reads: checked again
    test = _check_bounds(session, spec, target, workdir, timeout, calls, hide)
    if kept is not None and key is not None and test.outcome in (Outcome.PASSED, Outcome.FAILED):
        kept.put(key, test.to_json())
    return test


def _check_bounds(session: Resources, spec: Assignment, target: tuple[str, str], workdir: Path, timeout: float,
                  calls: list[PlannedCall], hide: Sequence[Path]) -> TestResult:
    """`calls` replayed in the interpreter with every access checked (`_bounds_check`)."""
    name = "memory safety (every load and store bounds-checked in the CPU interpreter)"
    ctx = session.context
    materialize(spec, calls, workdir.parent / f"{spec.name}.bounds-inputs")
    # hide: as the GPU worker's view
    worker = session.student_worker(spec, workdir / "repo", target, workdir / "scratch-bounds", hide=hide,
                                    interpret=True)
    skipped: list[str] = []
    try:
        failure = _start(worker, spec)
        if failure:
            return TestResult(spec.name, Kind.INTEGRITY, name, Outcome.SKIPPED,
                              f"the module does not import in the interpreter: {failure.message}")
        restarts = Restarts()
        for call in calls:
            if restarts.restarting():
                _start(worker, spec)
            if restarts.given_up:
                skipped.append(f"{call.case.name}: not run, the calls before it timed out")
                continue
            out = output_path(workdir, f"bounds-{call.slug}.safetensors")
            assert call.input_file is not None  # materialize wrote every call's inputs
            try:
                # its own names: the correctness calls show their files in the same folder meanwhile
                with shown_to_worker(call.input_file, workdir, prefix="bounds-") as shown:
                    reply = worker.request(Run("student", str(shown), call.layout, "cpu", str(out)), timeout)
            except WorkerFailure as f:
                skipped.append(f"{call.case.name}: {f.message}")
                restarts.after(f.outcome)
                continue
            restarts.after(Outcome.PASSED)  # it answered: the worker lives
            if isinstance(reply, Failure) and reply.kind == "memory":
                return TestResult(spec.name, Kind.INTEGRITY, name, Outcome.FAILED,
                                  f"{call.case.name} [float32]: {reply.message}",
                                  case=call.case.name, dtype="float32", traceback=reply.traceback,
                                  reproducer=f"{ctx.reproducer} -a {spec.name} {_case_option(spec, call.case)} "
                                             f"--dtype float32 --seed {call.seed} --device cpu")
            if isinstance(reply, Failure):
                skipped.append(f"{call.case.name}: {reply.message}")
    finally:
        worker.close()
    if len(skipped) == len(calls):
        return TestResult(spec.name, Kind.INTEGRITY, name, Outcome.SKIPPED,
                          "the kernel could not run in the interpreter: " + "; ".join(skipped[:2]))
    checked = ", ".join(c.case.name for c in calls)
    note = f" (not run there: {'; '.join(skipped[:2])})" if skipped else ""
    return TestResult(spec.name, Kind.INTEGRITY, name, Outcome.PASSED, f"no access out of bounds in {checked}{note}")


def _shrink_failures(spec: Assignment, ctx: GradingContext, worker: StudentWorker, workdir: Path,
                     result: AssignmentResult,
                     calls: list[PlannedCall], timeout: float) -> None:
    """For each distinct failure, the smallest case that still fails and the closest that passes
    (grader.judge.shrink), searched from its smallest failing case with the worker still loaded,
    within the assignment's time budget. Told beside the failure (details: smallest_failing,
    largest_passing); shrunk cases are never tests, so they change no score."""
    if spec.calls is not None or spec.check is not None:
        return  # a property judged over several calls (dropout's statistics) does not shrink
    planned = {c.test_name: c for c in calls}
    groups: dict[tuple, list[TestResult]] = {}
    for t in result.tests:
        if t.kind == "correctness" and t.outcome == Outcome.FAILED and t.name in planned:
            groups.setdefault(what_to_change(t), []).append(t)  # as a report groups them
    deadline = time.monotonic() + shrink.SHRINK_BUDGET_S
    folder = workdir.parent / f"{spec.name}.shrink-inputs"
    for tests in groups.values():
        # the group's smallest case, as visible as the one shown for the group (a hidden case's
        # parameters never reach a visible result)
        alike = [t for t in tests if t.hidden == tests[0].hidden]
        start = planned[min(alike, key=lambda t: _numel(planned[t.name].case)).name]
        if time.monotonic() > deadline or worker.process is None:
            return
        seen: dict[str, TestResult] = {}

        def fails(case: Case, dtype: str = start.dtype, seed: int = start.seed) -> bool | str | None:
            trial = PlannedCall(spec.name, case, dtype, seed)
            try:  # a size this assignment cannot make (a row index past the rows, a filter larger than the image)
                inputs = make_inputs(spec, case, dtype, seed)
                if spec.truth is not None:
                    spec.truth(*[v.double() if hasattr(v, "double") else v for v in inputs.values()])
                materialize(spec, [trial], folder)
            except Exception:  # noqa: BLE001 - the spec's own refusal of that size
                return shrink.INVALID
            left = max(5.0, deadline - time.monotonic() + 5.0)
            test = _run_call(spec, trial, ctx, worker, workdir, min(timeout, left), OwnKernelCheck(spec))
            if test.outcome in WORKER_FAILURES:
                worker.close()  # it died or was killed: the search stops, nothing else needs it
                return None
            if test.outcome != Outcome.FAILED:  # passed; or raised at that size: not this bug
                return False if test.outcome == Outcome.PASSED else shrink.INVALID
            seen[case.name] = test  # noqa: B023 - shrink.search below calls fails only in this iteration
            return True

        found = shrink.search(spec, start.case, fails, deadline)
        if found.smallest is None or found.smallest.name not in seen:
            continue
        small = seen[found.smallest.name]
        first = tests[0].details  # the one a report shows for its group
        if not isinstance(first, CorrectnessPayload):
            continue
        first.smallest_failing = SmallestFailing(case=small.case, shape=small.shape, message=small.message,
                                                 reproducer=small.reproducer, start=start.case.name, runs=found.runs)
        if found.passing is not None:
            first.largest_passing = LargestPassing(case=found.passing.name,
                                                   boundary=shrink.boundary(found.smallest, found.passing))


def _numel(case: Case) -> int:
    dims = shrink.dims_of(case.params) or [1 << 40]
    n = 1
    for d in dims:
        n *= d
    return n


def _scan(result: AssignmentResult, repo: Path, module: str) -> None:
    """The static scan's warnings, for the TA: in the notes and results.json, never a verdict."""
    findings = scan_submission(repo, module)
    result.warnings = [f.to_dict() for f in findings]
    if findings:
        result.notes.append(scan_summary(findings))


def _start(worker: StudentWorker, spec: Assignment) -> Failure | None:
    """None when the module imported; else the failure, as the worker or sandbox told it."""
    try:
        reply = worker.start()
    except WorkerFailure as f:
        return replace(f.failure, message=f"while importing: {f.message}", traceback="")
    return reply if isinstance(reply, Failure) else None


def _run_call(spec: Assignment, call: PlannedCall, ctx: GradingContext, worker: StudentWorker, workdir: Path,
              timeout: float, integrity: OwnKernelCheck) -> TestResult:
    runs: list[tuple[dict, RunReply, dict]] = []  # (inputs, reply, saved) of each call this case makes: usually one
    refs: list = []  # the float64 truth on each call's inputs
    for i, (input_file, layout) in enumerate(call.runs):
        assert input_file is not None  # materialize wrote every call's inputs
        output_file = output_path(workdir, f"{call.slug}.safetensors" if i == 0 else f"{call.slug}.call{i}.safetensors")
        try:
            with shown_to_worker(input_file, workdir) as shown, worker.sharing_gpu():  # waits while another job times
                reply = worker.request(Run("student", str(shown), layout, ctx.device, str(output_file),
                                           record_ops=True), timeout)
        except WorkerFailure as f:
            return _test(spec, call, ctx, Outcome(f.outcome), f.message, output=f.output)
        if isinstance(reply, Failure):
            if reply.kind == "memory":
                return _test(spec, call, ctx, Outcome.FAILED, reply.message, traceback=reply.traceback)
            return _from_failure(spec, call, ctx, reply, f"{spec.function}() raised")
        assert isinstance(reply, RunReply)  # decode_reply answers a Run with a RunReply or a Failure
        inputs = load_inputs(call, index=i)
        ref = truth_of(spec, inputs, f"{call.case.name} [{call.dtype}]") if spec.check is None else None
        try:  # its header checked against what this case can produce before a byte of data is read
            saved = read_saved(output_file, Expected.of(inputs, ref))
        except EvidenceError as exc:
            return _test(spec, call, ctx, Outcome.FAILED, str(exc))
        runs.append((inputs, reply, saved))
        refs.append(ref)
    judged = [(inputs, reply.meta(), saved) for inputs, reply, saved in runs]
    source = read_source(worker.repo / worker.target[0])  # parsed only: what of the kernel can compute a NaN
    if len(runs) == 1 and spec.check is None:
        verdict = judge_call(spec, call.case, call.dtype, *judged[0], ctx.device, kernel_source=source, ref=refs[0])
    else:
        verdict = judge_runs(spec, call.case, call.dtype, judged, ctx.device, kernel_source=source, refs=refs)
    merged = _merged([r for _, r, _ in runs])
    integrity.observe(call, merged, verdict.outcome == Outcome.PASSED,
                      trivial=all(trivial_result(saved, inputs) for inputs, _, saved in runs))
    details = replace(verdict.details, seconds=round(merged["seconds"], 4), kernels=merged["launches"])
    if details.wrong_map is not None:  # the kernel's block sizes, for the picture (sizes only: the worker's word)
        details.blocks = {k[:40]: v for k, v in runs[0][1].blocks.items() if 0 < v <= 1 << 24}
    return _test(spec, call, ctx, verdict.outcome, verdict.message, details=details)


def _merged(replies: list[RunReply]) -> dict:
    """One case's calls seen as one: time and launches added up, every op that ran."""
    launches: Counter[str] = Counter()
    for r in replies:
        launches.update(r.launches)
    return {"seconds": sum(r.seconds for r in replies), "launches": dict(launches),
            "ops": sorted({op for r in replies for op in r.ops})}


def _from_failure(spec: Assignment, call: PlannedCall, ctx: GradingContext, failure: Failure,
                  context: str) -> TestResult:
    # a worker failure, or the student's own error
    outcome = Outcome(failure.kind) if failure.kind in WORKER_FAILURES else Outcome.ERROR
    return _test(spec, call, ctx, outcome, f"{context}: {failure.message}", traceback=failure.traceback,
                 output=failure.output)


def _shape(call: PlannedCall) -> str:
    parts = []
    for name, lay in call.layout.items():
        if "value" in lay:
            parts.append(f"{name}={lay['value']}")
            continue
        size = "x".join(map(str, lay["size"]))
        contiguous = _contiguous_strides(lay["size"]) == lay["stride"]
        parts.append(f"{name}[{size}]" + ("" if contiguous else f" stride {tuple(lay['stride'])}"))
    return ", ".join(parts) if parts else ", ".join(f"{k}={v}" for k, v in call.case.params.items())


def _contiguous_strides(size: list[int]) -> list[int]:
    strides, acc = [], 1
    for s in reversed(size):
        strides.append(acc)
        acc *= max(s, 1)
    return list(reversed(strides))


def _case_option(spec: Assignment, case: Case) -> str:
    """A reproducer's `--case`: a named case's name, or a hidden or random case's shape
    (`shape=...`), which a student's kit runs: it has no hidden case to name, and it draws its
    random shapes without the course secret, so a random case's name there is another shape (or
    none). Its inputs are drawn anew; the shape decides the verdict."""
    drawn = case.hidden or case not in spec.cases
    name = (shrink.shape_name(spec, case.params) if drawn and not case.name.startswith(shrink.PREFIX) else None)
    return f"--case '{name or case.name}'"


def _test(spec: Assignment, call: PlannedCall, ctx: GradingContext, outcome: Outcome, message: str,
          **kw: Any) -> TestResult:
    reproducer = (f"{ctx.reproducer} -a {spec.name} {_case_option(spec, call.case)} --dtype {call.dtype} "
                  f"--seed {call.seed}")
    return TestResult(spec.name, Kind.CORRECTNESS, call.test_name, outcome, message,
                      case=call.case.name, dtype=call.dtype, shape=_shape(call), reproducer=reproducer,
                      hidden=call.case.hidden, **kw)
