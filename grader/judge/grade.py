"""Grade one submission: for each assignment, plan -> worker -> judge -> scoring.

This is the only module that drives workers. Every failure of student code becomes an
outcome on the tests it touched (error, timeout, crashed), the worker is restarted for
the rest, and the other assignments never notice.
"""

from __future__ import annotations

import tempfile
import time
from collections import Counter
from dataclasses import replace
from pathlib import Path
from typing import Callable

from safetensors.torch import load

from grader import environment
from grader.judge import perf
from grader.protocol import Contender, Failure, Load, Ok, Ping, Reply, Request, Run, RunReply
from grader.judge.context import GradingContext
from grader.judge.devicelock import gpu_phase, timing_lock
from grader.judge import shrink
from grader.judge.feedback import diagnosis, headline
from grader.judge.integrity import scan_submission, summary as scan_summary
from grader.judge.nonfinite import read_source
from grader.judge.verdict import judge_call, judge_runs
from grader.judge.plan import PlannedCall, load_inputs, make_inputs, materialize
from grader.judge.runcache import TritonKeep
from grader.results import WORKER_FAILURES, AssignmentResult, Outcome, RunResult, Severity, TestResult, cents
from grader.sandbox.files import output_path, read_worker_file, shown_to_worker
from grader.sandbox.isolation import SandboxError
from grader.sandbox.process import WorkerFailure, WorkerProcess, detect
from grader.sandbox.zygote import prewarm
from grader.judge.scoring import score_assignment, split_cents
from grader.spec import Assignment
from grader.submission import Submission

MAX_CONSECUTIVE_TIMEOUTS = 2
WORKER_START_TIMEOUT = 300  # seconds for a fresh worker to import torch and Triton, on a loaded machine


Progress = Callable[[str], None]


def grade_submission(sub: Submission, specs: list[Assignment], ctx: GradingContext, progress: Progress | None = None) -> RunResult:
    started = time.monotonic()
    run = RunResult(str(sub.root), ctx.seed, environment.describe(ctx.device, detect(ctx.isolation).describe()),
                    commit=sub.commit())
    roofline = None  # measured by the first timing of the run, then shared by the others
    if ctx.scratch_root:
        Path(ctx.scratch_root).mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="grader-", dir=ctx.scratch_root) as tmp:
        for spec in specs:
            result = grade_assignment(sub, spec, ctx, Path(tmp) / spec.name, progress, roofline)
            run.assignments.append(result)
            roofline = roofline or measured_roofline(result)
    if roofline:
        run.environment["roofline"] = roofline
    run.execution_time = time.monotonic() - started
    return run


def measured_roofline(result: AssignmentResult) -> dict | None:
    """The GPU's measured ceilings, as the assignment's timing used them (None: nothing timed)."""
    return next((t.details["roofline"] for t in result.tests if t.kind == "performance" and "roofline" in t.details), None)


def count_steps(specs: list[Assignment], ctx: GradingContext) -> int:
    """How many progress steps grade_submission reports: one per call, one per timing, and on a
    GPU one per bounds check (when an assignment's module is missing, that step never comes)."""
    return sum(len(ctx.calls(s)) + (s.performance is not None) + (not ctx.interpret) for s in specs)


class StudentWorker:
    """The student's module loaded in a worker; restarted after a timeout or crash."""

    def __init__(self, spec: Assignment, repo: Path, target: tuple[str, str], scratch: Path, ctx: GradingContext,
                 hide: list[Path] = ()) -> None:
        self.spec, self.repo, self.target, self.scratch, self.ctx = spec, repo, target, scratch, ctx
        self.hide = [*map(Path, ctx.hide), *hide]  # the submission's folder and its neighbours (other students)
        self.process: WorkerProcess | None = None
        self.starts = 0
        self.worker_scratch: Path | None = None  # the running worker's own folder (home, temp, Triton cache)
        self.gpu_wait = 0.0  # seconds its calls waited for the GPU (other jobs' timing phases)
        # a check keeps the student's compiled kernels between runs (on a GPU: the interpreter compiles nothing)
        self.kept = TritonKeep(Path(ctx.kept_kernels)) if ctx.kept_kernels and not ctx.interpret else None

    def start(self) -> Ok | Failure:
        """Start and import; returns the worker's reply (ok, or the student's error)."""
        self.close()
        self.starts += 1
        scratch = self.worker_scratch = self.scratch / f"worker-{self.starts}"
        if self.kept is not None:  # what earlier checks compiled of this student's kernels
            self.kept.seed(scratch / "triton-cache")
        try:  # our own start (sandbox, Python, torch, Triton) is not the student's import time, nor their fault
            self.process = WorkerProcess(self.repo, scratch, self.ctx.interpret, self.ctx.gpu,
                                         isolation=self.ctx.isolation, writable=[self.repo.parent / "outputs"],
                                         hide=self.hide, job=self.repo.parent, keep_autotuning=self.kept is not None)
            self.process.request(Ping(), WORKER_START_TIMEOUT)
        except (OSError, SandboxError) as exc:
            raise WorkerFailure("infra_error", f"the sandbox could not start a worker: {exc}", "") from None
        except WorkerFailure as f:
            raise WorkerFailure(replace(f.failure, kind="infra_error", message=f"the worker did not start: {f.message}")) from None
        module, function = self.target
        # an import may run GPU work (or try to disturb another job's timing): it waits, as a call does
        with gpu_phase(self.ctx.gpu, exclusive=False, enabled=not self.ctx.interpret, waited=self.waited):
            return self.process.request(
                Load({"student": Contender(str(self.repo), module, function)}),
                self.ctx.import_timeout_for(self.spec),
            )

    def waited(self, seconds: float) -> None:
        self.gpu_wait += seconds

    def request(self, message: Request, timeout: float) -> Reply | Failure:
        assert self.process is not None
        return self.process.request(message, timeout)

    def close(self) -> None:
        if self.process is not None:
            self.process.close()
            self.process = None
            if self.kept is not None:
                self.kept.keep(self.worker_scratch / "triton-cache")


def grade_assignment(sub: Submission, spec: Assignment, ctx: GradingContext, workdir: Path, progress: Progress | None = None,
                     roofline: dict | None = None, phases: dict[str, float] | None = None) -> AssignmentResult:
    """`roofline`: the GPU's ceilings if this run measured them already (else timing measures them).
    `phases`, if given, gets the seconds of each stage (where a job's time goes)."""
    phases = phases if phases is not None else {}
    clock = [time.monotonic()]

    def lap(name: str) -> None:
        now = time.monotonic()
        phases[name] = round(phases.get(name, 0.0) + now - clock[0], 3)
        clock[0] = now

    module, function = sub.target(spec)
    result = AssignmentResult(spec.name, spec.title, f"{module}:{function}()")
    calls = ctx.calls(spec)
    step = progress or (lambda _: None)
    call_timeout = ctx.call_timeout_for(spec)

    runnable = [c for c in calls if not c.skip]
    module_file, problem = sub.locate(spec)
    if runnable and module_file is None:  # one result that says so, not one error per case
        return not_gradable(spec, ctx, result, problem) if problem else _not_submitted(spec, sub, ctx, result, module)
    prewarm(ctx.interpret, ctx.gpu, ctx.isolation)

    neighbours = [sub.root.parent]  # the submission's folder and the folders beside it (other students)
    worker = StudentWorker(spec, workdir / "repo", (module, function), workdir / "scratch", ctx, hide=neighbours)
    integrity = _Integrity(spec)
    try:
        if not runnable:
            load_failure = None
        else:
            # made outside the worker's view; each call's file is shown to it only for that call,
            # so no input can be read ahead (at import) and answered from a precomputed cache
            materialize(spec, runnable, workdir.parent / f"{spec.name}.inputs")
            left_out = sub.private_copy(workdir / "repo")
            if left_out:  # counts only: the names are the student's, and nothing of theirs is followed
                result.notes.append("Not copied for grading: " + ", ".join(f"{n} {what}" for what, n in sorted(left_out.items())))
            _scan(result, workdir / "repo", module)
            lap("inputs_and_copy")
            load_failure = _start(worker, spec)
            lap("worker_start_and_import")
            if load_failure:  # one result that says why, not the same error once per case
                return _unloadable(spec, ctx, result, module, calls, runnable, load_failure)
        consecutive_timeouts, restart = 0, False
        for call in calls:
            step(f"{spec.name}: {call.id}")
            if call.skip:
                result.tests.append(_test(spec, call, ctx, "skipped", call.skip))
                continue
            if restart and not load_failure and consecutive_timeouts < MAX_CONSECUTIVE_TIMEOUTS:
                load_failure, restart = _start(worker, spec), False  # a fresh worker, once a call needs one
            if load_failure:
                result.tests.append(_from_failure(spec, call, ctx, load_failure, f"importing {module} failed"))
                continue
            if consecutive_timeouts >= MAX_CONSECUTIVE_TIMEOUTS:
                result.tests.append(_test(spec, call, ctx, "timeout", "not run: the calls before this one timed out"))
                continue
            test = _run_call(spec, call, ctx, worker, workdir, call_timeout, integrity)
            result.tests.append(test)
            consecutive_timeouts = consecutive_timeouts + 1 if test.outcome == Outcome.TIMEOUT else 0
            restart = test.outcome in WORKER_FAILURES
        lap("correctness_calls")
        if runnable and not load_failure:
            _shrink_failures(spec, ctx, worker, workdir, result, calls, call_timeout)
            lap("shrinking")
        result.tests.append(integrity.test())
        if not ctx.interpret and runnable and not load_failure:
            step(f"{spec.name}: bounds check")
            result.tests.append(_bounds_check(spec, ctx, (module, function), workdir, call_timeout, neighbours))
            lap("bounds_check")
        if spec.performance is not None:
            step(f"{spec.name}: performance")
            result.tests.append(perf.measure(spec, result, ctx, worker, workdir, call_timeout, roofline,  # the GPU alone while timing
                                             exclusive=lambda: timing_lock(ctx.gpu, enabled=not ctx.interpret)))
            lap("performance")
    finally:
        worker.close()
        lap("closing")
        if not ctx.interpret:  # of the correctness calls' time above, what went to waiting for the GPU
            phases["calls_waiting_for_gpu"] = round(worker.gpu_wait, 3)
    planned = None
    if ctx.partial:  # a partial run: each case keeps its share of the full run's points
        planned = [c.test_name for c in ctx.full_plan(spec)]
        result.partial = {"cases_run": len(calls), "cases": len(planned), "assignment_points": spec.max_points}
    score_assignment(spec, result, planned)
    if note := hidden_note(spec):
        result.notes.append(note)
    result.headline = headline(result, module_file)
    return result


def _not_submitted(spec: Assignment, sub: Submission, ctx: GradingContext, result: AssignmentResult, module: str) -> AssignmentResult:
    """The assignment's module is not in the repo: one failed result worth every point this
    run could have earned (the cases that run here, speed on a GPU), and the rest noted."""
    named = " (the module grader.toml names)" if "module" in sub.overrides.get(spec.name, {}) else ""
    test = TestResult(spec.name, "submission", "not submitted", "failed",
                      f"{module}{named} is not in the submission: nothing of {spec.name} was checked",
                      details={"not_submitted": True})
    calls = ctx.calls(spec)
    return _one_result(spec, ctx, result, calls, [c for c in calls if not c.skip], test)


def not_gradable(spec: Assignment, ctx: GradingContext, result: AssignmentResult, why: str) -> AssignmentResult:
    """What the student set up cannot be graded (grader.toml unreadable or of the wrong shape, a
    module that leads out of the repo or is not a file): the student's outcome, failed with the
    reason in one line, worth the points `_not_submitted` would be; never the grader's error."""
    calls = ctx.calls(spec)
    test = TestResult(spec.name, "submission", "cannot be graded", "failed", f"{why}: nothing of {spec.name} was checked",
                      details={"not_gradable": True})
    return _one_result(spec, ctx, result, calls, [c for c in calls if not c.skip], test)


def _unloadable(spec: Assignment, ctx: GradingContext, result: AssignmentResult, module: str,
                calls: list[PlannedCall], runnable: list[PlannedCall], failure: Failure) -> AssignmentResult:
    """The module is there but gives no function to call: it lacks the function (not submitted,
    as a missing module is) or its import failed (one error with the student's traceback). Either
    way no case could run, so one result says it, worth what the cases were worth."""
    if failure.kind == "missing":
        test = TestResult(spec.name, "submission", "not submitted", "failed",
                          f"{module} defines no function {spec.function}(): nothing of {spec.name} was checked "
                          f"(write {spec.signature} in {module})",
                          details={"not_submitted": True, "missing_function": spec.function, "module": module})
    elif failure.kind == Outcome.INFRA_ERROR:  # ours (no worker could start): never said as the student's import
        test = TestResult(spec.name, "submission", "worker", Outcome.INFRA_ERROR,
                          f"none of its {len(runnable)} checks ran: {failure.message}", output=failure.output,
                          details={"infra_error": True})
    else:
        outcome = failure.kind if failure.kind in WORKER_FAILURES else Outcome.ERROR
        test = TestResult(spec.name, "submission", "import", outcome,
                          f"importing {module} failed, so none of its {len(runnable)} checks ran: {failure.message}",
                          traceback=failure.traceback, output=failure.output, details={"import_failed": True})
    first = runnable[0]  # any one case reproduces an import that fails
    test.reproducer = f"{ctx.reproducer} -a {spec.name} --case '{first.case.name}' --dtype {first.dtype} --seed {first.seed}"
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
    if skipped:  # what a GPU run would add: part of the total, earned nowhere here (as a graded submission's skipped tests)
        result.tests.append(TestResult(spec.name, "submission", "checks that need a GPU", "skipped",
                                       "not submitted, and not runnable here" if test.details.get("not_submitted")
                                       else "not graded, and not runnable here" if test.details.get("not_gradable")
                                       or test.details.get("infra_error")
                                       else "not runnable here, and the module did not import",
                                       max_score=skipped / 100, details={"points_if_run": skipped / 100}))
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


def _bounds_check(spec: Assignment, ctx: GradingContext, target: tuple[str, str], workdir: Path, timeout: float,
                  hide: list[Path] = ()) -> TestResult:
    """On a GPU an out-of-bounds load or store often goes unseen: it reads a neighbour's
    memory and the values inside the tensor still come out right. So a GPU run replays the
    small named cases, in float32, in Triton's CPU interpreter, where grader.worker.memcheck checks
    every access against the bounds of the kernel's tensors."""
    name = "memory safety (every load and store bounds-checked in the CPU interpreter)"
    cpu = replace(ctx, device="cpu", dtypes=("float32",), cases=None)
    calls = [c for c in cpu.calls(spec) if c.case in spec.cases
             and sum(t.numel() for t in make_inputs(spec, c.case, c.dtype, c.seed).values() if hasattr(t, "numel")) <= BOUNDS_CHECK_MAX_ELEMENTS]
    materialize(spec, calls, workdir.parent / f"{spec.name}.bounds-inputs")
    worker = StudentWorker(spec, workdir / "repo", target, workdir / "scratch-bounds", cpu, hide=hide)  # as the GPU worker's view
    skipped: list[str] = []
    try:
        failure = _start(worker, spec)
        if failure:
            return TestResult(spec.name, "integrity", name, "skipped", f"the module does not import in the interpreter: {failure.message}")
        timeouts = 0
        for call in calls:
            if timeouts >= MAX_CONSECUTIVE_TIMEOUTS:  # a hanging kernel: each call would wait its whole timeout
                skipped.append(f"{call.case.name}: not run, the calls before it timed out")
                continue
            out = output_path(workdir, f"bounds-{call.slug}.safetensors")
            try:
                with shown_to_worker(call.input_file, workdir) as shown:
                    reply = worker.request(Run("student", str(shown), call.layout, "cpu", str(out)), timeout)
            except WorkerFailure as f:
                skipped.append(f"{call.case.name}: {f.message}")
                timeouts = timeouts + 1 if f.outcome == "timeout" else 0
                if timeouts < MAX_CONSECUTIVE_TIMEOUTS:
                    _start(worker, spec)
                continue
            timeouts = 0
            if isinstance(reply, Failure) and reply.kind == "memory":
                return TestResult(spec.name, "integrity", name, "failed", f"{call.case.name} [float32]: {reply.message}",
                                  case=call.case.name, dtype="float32", traceback=reply.traceback,
                                  reproducer=f"{ctx.reproducer} -a {spec.name} --case '{call.case.name}' --dtype float32 --seed {call.seed} --device cpu")
            if isinstance(reply, Failure):
                skipped.append(f"{call.case.name}: {reply.message}")
    finally:
        worker.close()
    if len(skipped) == len(calls):
        return TestResult(spec.name, "integrity", name, "skipped", "the kernel could not run in the interpreter: " + "; ".join(skipped[:2]))
    checked = ", ".join(c.case.name for c in calls)
    note = f" (not run there: {'; '.join(skipped[:2])})" if skipped else ""
    return TestResult(spec.name, "integrity", name, "passed", f"no access out of bounds in {checked}{note}")


def _shrink_failures(spec: Assignment, ctx: GradingContext, worker: StudentWorker, workdir: Path, result: AssignmentResult,
                     calls: list[PlannedCall], timeout: float) -> None:
    """For each distinct failure, the smallest case that still fails and the closest that passes
    (grader.judge.shrink), searched from its smallest failing case with the worker still loaded,
    within the assignment's time budget. Told beside the failure (details: smallest_failing,
    largest_passing); shrunk cases are never tests, so they change no score."""
    if spec.calls is not None or spec.check is not None:
        return  # a property judged over several calls (dropout's statistics) does not shrink
    planned = {c.test_name: c for c in calls}
    groups: dict[str, list[TestResult]] = {}
    for t in result.tests:
        if t.kind == "correctness" and t.outcome == Outcome.FAILED and t.name in planned:
            groups.setdefault(diagnosis(t), []).append(t)
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

        def fails(case, dtype=start.dtype, seed=start.seed):
            trial = PlannedCall(spec.name, case, dtype, seed)
            try:  # a size this assignment cannot make (a row index past the rows, a filter larger than the image)
                inputs = make_inputs(spec, case, dtype, seed)
                if spec.reference is not None:
                    spec.reference(*[v.double() if hasattr(v, "double") else v for v in inputs.values()])
                materialize(spec, [trial], folder)
            except Exception:  # noqa: BLE001 - the spec's own refusal of that size
                return shrink.INVALID
            left = max(5.0, deadline - time.monotonic() + 5.0)
            test = _run_call(spec, trial, ctx, worker, workdir, min(timeout, left), _Integrity(spec))
            if test.outcome in WORKER_FAILURES:
                worker.close()  # it died or was killed: the search stops, nothing else needs it
                return None
            if test.outcome != Outcome.FAILED:  # passed; or raised at that size: not this bug
                return False if test.outcome == Outcome.PASSED else shrink.INVALID
            seen[case.name] = test
            return True

        found = shrink.search(spec, start.case, fails, deadline)
        if found.smallest is None or found.smallest.name not in seen:
            continue
        small = seen[found.smallest.name]
        first = tests[0]  # the one a report shows for its group
        first.details["smallest_failing"] = {"case": small.case, "shape": small.shape, "message": small.message,
                                             "reproducer": small.reproducer, "from": start.case.name, "runs": found.runs}
        if found.passing is not None:
            first.details["largest_passing"] = {"case": found.passing.name,
                                                "boundary": shrink.boundary(found.smallest, found.passing)}


def _numel(case) -> int:
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


def _run_call(spec, call: PlannedCall, ctx: GradingContext, worker: StudentWorker, workdir: Path, timeout: float, integrity) -> TestResult:
    runs: list[tuple[dict, RunReply, dict]] = []  # (inputs, reply, saved) of each call this case makes: usually one
    for i, (input_file, layout) in enumerate(call.runs):
        output_file = output_path(workdir, f"{call.slug}.safetensors" if i == 0 else f"{call.slug}.call{i}.safetensors")
        try:
            with shown_to_worker(input_file, workdir) as shown, \
                    gpu_phase(ctx.gpu, exclusive=False, enabled=not ctx.interpret, waited=worker.waited):  # waits while another job times
                reply = worker.request(Run("student", str(shown), layout, ctx.device, str(output_file), record_ops=True), timeout)
        except WorkerFailure as f:
            return _test(spec, call, ctx, f.outcome, f.message, output=f.output)
        if isinstance(reply, Failure):
            if reply.kind == "memory":
                return _test(spec, call, ctx, "failed", reply.message, traceback=reply.traceback)
            return _from_failure(spec, call, ctx, reply, f"{spec.function}() raised")
        try:
            saved = load(read_worker_file(output_file))
        except Exception as exc:  # noqa: BLE001 - whatever the worker left there, it is not a result
            return _test(spec, call, ctx, "failed", f"the worker's output file could not be read: {exc}")
        runs.append((load_inputs(call, index=i), reply, saved))
    judged = [(inputs, reply.meta(), saved) for inputs, reply, saved in runs]
    source = read_source(worker.repo / worker.target[0])  # parsed only: what of the kernel can compute a NaN
    if len(runs) == 1 and spec.check is None:
        verdict = judge_call(spec, call.case, call.dtype, *judged[0], ctx.device, kernel_source=source)
    else:
        verdict = judge_runs(spec, call.case, call.dtype, judged, ctx.device, kernel_source=source)
    reply = _merged([r for _, r, _ in runs])
    integrity.observe(call, reply, verdict.outcome == Outcome.PASSED, trivial=all(_trivial(saved, inputs) for inputs, _, saved in runs))
    details = dict(verdict.details, seconds=round(reply["seconds"], 4), kernels=reply["launches"])
    if "wrong_map" in details:  # the kernel's block sizes, for the picture's boundaries (sizes only: it is the worker's word)
        details["blocks"] = {k[:40]: v for k, v in runs[0][1].blocks.items() if 0 < v <= 1 << 24}
    return _test(spec, call, ctx, verdict.outcome, verdict.message, details=details)


def _merged(replies: list[RunReply]) -> dict:
    """One case's calls seen as one: time and launches added up, every op that ran."""
    launches: Counter[str] = Counter()
    for r in replies:
        launches.update(r.launches)
    return {"seconds": sum(r.seconds for r in replies), "launches": dict(launches),
            "ops": sorted({op for r in replies for op in r.ops})}


def _from_failure(spec, call, ctx, failure: Failure, context: str) -> TestResult:
    outcome = failure.kind if failure.kind in WORKER_FAILURES else Outcome.ERROR  # a worker failure, or the student's own error
    return _test(spec, call, ctx, outcome, f"{context}: {failure.message}", traceback=failure.traceback, output=failure.output)


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


def _test(spec, call: PlannedCall, ctx: GradingContext, outcome: str, message: str, **kw) -> TestResult:
    reproducer = f"{ctx.reproducer} -a {spec.name} --case '{call.case.name}' --dtype {call.dtype} --seed {call.seed}"
    return TestResult(spec.name, "correctness", call.test_name, outcome, message,
                      case=call.case.name, dtype=call.dtype, shape=_shape(call), reproducer=reproducer,
                      hidden=call.case.hidden, **kw)


def _trivial(saved: dict, inputs: dict) -> bool:
    """A result that proves nothing about a kernel: empty, all zeros, or a copy of an input (a
    dropout at p=1 or p=0, say). Returning it without a launch is a legitimate shortcut."""
    import torch

    outputs = [v for k, v in saved.items() if k == "output" or k.startswith("output.")]
    given = [v for v in inputs.values() if isinstance(v, torch.Tensor)]

    def trivial(out: torch.Tensor) -> bool:
        return (out.numel() == 0 or not bool(out.any())
                or any(g.shape == out.shape and g.dtype == out.dtype and torch.equal(g.cpu(), out) for g in given))

    return bool(outputs) and all(trivial(o) for o in outputs)


class _Integrity:
    """Evidence that the student's own Triton kernel did the work: which aten ops the call
    dispatched (a forbidden one means torch computed the answer: conclusive) and how many kernels
    launched (a right result with no launch is for a TA to review, and costs only those cases;
    a trivial result, all zeros or a copy of an input, proves nothing either way)."""

    def __init__(self, spec: Assignment) -> None:
        self.spec = spec
        self.forbidden: dict[str, list[str]] = {}
        self.no_kernel: list[PlannedCall] = []
        self.kernels: Counter[str] = Counter()
        self.observed = 0
        self.all_trivial = True

    def observe(self, call: PlannedCall, reply: dict, passed: bool, trivial: bool = False) -> None:
        self.observed += 1
        self.all_trivial = self.all_trivial and trivial
        self.kernels.update(reply["launches"])
        for op in sorted(set(reply["ops"]) & self.spec.forbidden_ops):
            self.forbidden.setdefault(op, []).append(call.id)
        if passed and not reply["launches"] and not trivial:
            self.no_kernel.append(call)

    def test(self) -> TestResult:
        name = "uses its own Triton kernel"
        if not self.observed:
            return TestResult(self.spec.name, "integrity", name, "skipped", "no call completed, so nothing to inspect")
        details = {"kernels_launched": dict(self.kernels)}
        if self.forbidden:
            evidence = [f"torch computed the result: {op} ran inside {self.spec.function}() in {_few(ids)}"
                        for op, ids in self.forbidden.items()]
            return TestResult(self.spec.name, "integrity", name, "flagged", "; ".join(evidence),
                              details=dict(details, evidence=evidence), severity=Severity.CONCLUSIVE.value)
        if self.no_kernel:
            evidence = [f"no Triton kernel was launched in {_few([c.id for c in self.no_kernel])}, yet the result was right"]
            concerns = [c.test_name for c in self.no_kernel]
            return TestResult(self.spec.name, "integrity", name, "flagged", evidence[0],
                              details=dict(details, evidence=evidence, concerns=concerns), severity=Severity.REVIEW.value)
        if not self.kernels:  # nothing ran: there is nothing to vouch for
            if self.all_trivial:
                return TestResult(self.spec.name, "integrity", name, "skipped",
                                  "every result here was trivial (zeros, empty, or a copy of an input): nothing to inspect",
                                  details=dict(details, evidence=[]))
            return TestResult(self.spec.name, "integrity", name, "failed",
                              f"no Triton kernel was launched in any call: {self.spec.function}() must launch your kernel "
                              "(kernel[grid](...))", details=dict(details, evidence=[]))
        kernels = ", ".join(self.kernels)
        return TestResult(self.spec.name, "integrity", name, "passed", f"Triton kernels launched: {kernels}",
                          details=dict(details, evidence=[]))


def _few(ids: list[str]) -> str:
    return ", ".join(ids[:3]) + (f" and {len(ids) - 3} more" if len(ids) > 3 else "")
