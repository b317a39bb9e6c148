"""Grade one submission: for each assignment, plan -> worker -> judge -> scoring.

This is the only module that drives workers. Every failure of student code becomes an
outcome on the tests it touched (error, timeout, crashed), the worker is restarted for
the rest, and the other assignments never notice.
"""

from __future__ import annotations

import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Callable

from safetensors.torch import load

from grader import environment, perf, sandbox
from grader.devicelock import gpu_phase, timing_lock
from grader.feedback import headline
from grader.integrity import scan_submission, summary as scan_summary
from grader.judge import judge_call, judge_runs
from grader.plan import PlannedCall, load_inputs, make_inputs, materialize, plan_calls
from grader.results import AssignmentResult, RunResult, Severity, TestResult, cents
from grader.runcache import RunCache
from grader.sandbox import SandboxError, WorkerFailure, WorkerProcess, output_path, shown_to_worker
from grader.scoring import score_assignment, split_cents
from grader.spec import Assignment
from grader.submission import Submission

MAX_CONSECUTIVE_TIMEOUTS = 2
WORKER_START_TIMEOUT = 300  # seconds for a fresh worker to import torch and Triton, on a loaded machine


@dataclass
class Options:
    device: str  # "cuda" runs kernels on the GPU; "cpu" in Triton's interpreter
    seed: int
    cases: list[str] | None = None
    dtypes: list[str] | None = None
    timeout: float | None = None  # per call, overriding the spec's
    import_timeout: float | None = None  # for the student's import, overriding the spec's
    gpu: str | None = None  # CUDA_VISIBLE_DEVICES for the workers
    perf_reps: int = 30  # timed calls per contender per round (rounds: see grader.perf)
    perf_input_sets: int = 3
    perf_budget_s: float = 60.0  # per assignment, for extra rounds when the verdict is close
    reproducer: str = "grader check ."
    roofline: dict = field(default_factory=dict)  # measured once per run, shared by assignments
    isolation: str = "sandbox"  # how workers are contained: sandbox | docker | none (grader.sandbox)
    hide: list[str] = field(default_factory=list)  # more folders a worker must not see (the output folder)
    cache: RunCache | None = None  # shared by the grades of a batch (grader.runcache); None: each makes its own inputs
    partial_points: bool = False  # with cases/dtypes: each case earns its share of the full run (grader check's replays)

    @property
    def interpret(self) -> bool:
        return self.device == "cpu"


Progress = Callable[[str], None]


def grade_submission(sub: Submission, specs: list[Assignment], opts: Options, progress: Progress | None = None) -> RunResult:
    started = time.monotonic()
    run = RunResult(str(sub.root), opts.seed, environment.describe(opts.device), commit=sub.commit())
    run.environment["isolation"] = sandbox.detect(opts.isolation).describe()
    with tempfile.TemporaryDirectory(prefix="grader-") as tmp:
        for spec in specs:
            run.assignments.append(grade_assignment(sub, spec, opts, Path(tmp) / spec.name, progress))
    if opts.roofline:
        run.environment["roofline"] = opts.roofline
    run.execution_time = time.monotonic() - started
    return run


def count_steps(specs: list[Assignment], opts: Options) -> int:
    """How many progress steps grade_submission reports: one per call, one per timing, and on a
    GPU one per bounds check (when an assignment's module is missing, that step never comes)."""
    return sum(len(plan_calls(s, opts.seed, opts.interpret, opts.cases, opts.dtypes)) + (s.performance is not None)
               + (not opts.interpret) for s in specs)


class StudentWorker:
    """The student's module loaded in a worker; restarted after a timeout or crash."""

    def __init__(self, spec: Assignment, repo: Path, target: tuple[str, str], scratch: Path, opts: Options,
                 hide: list[Path] = ()) -> None:
        self.spec, self.repo, self.target, self.scratch, self.opts = spec, repo, target, scratch, opts
        self.hide = [*map(Path, opts.hide), *hide]  # the submission's folder and its neighbours (other students)
        self.process: WorkerProcess | None = None
        self.starts = 0

    def start(self) -> dict:
        """Start and import; returns the worker's reply (ok, or the student's error)."""
        self.close()
        self.starts += 1
        try:  # our own start (sandbox, Python, torch, Triton) is not the student's import time, nor their fault
            self.process = WorkerProcess(self.repo, self.scratch / f"worker-{self.starts}", self.opts.interpret, self.opts.gpu,
                                         isolation=self.opts.isolation, writable=[self.repo.parent / "outputs"],
                                         hide=self.hide, job=self.repo.parent)
            self.process.request({"op": "ping"}, WORKER_START_TIMEOUT)
        except (OSError, SandboxError) as exc:
            raise WorkerFailure("infra_error", f"the sandbox could not start a worker: {exc}", "") from None
        except WorkerFailure as f:
            raise WorkerFailure("infra_error", f"the worker did not start: {f.message}", f.output) from None
        module, function = self.target
        # an import may run GPU work (or try to disturb another job's timing): it waits, as a call does
        with gpu_phase(self.opts.gpu, exclusive=False, enabled=not self.opts.interpret):
            return self.process.request(
                {"op": "load", "contenders": {"student": {"root": str(self.repo), "module": module, "function": function}}},
                self.opts.import_timeout or self.spec.import_timeout_s,
            )

    def request(self, message: dict, timeout: float) -> dict:
        assert self.process is not None
        return self.process.request(message, timeout)

    def close(self) -> None:
        if self.process is not None:
            self.process.close()
            self.process = None


def grade_assignment(sub: Submission, spec: Assignment, opts: Options, workdir: Path, progress: Progress | None = None,
                     phases: dict[str, float] | None = None) -> AssignmentResult:
    """`phases`, if given, gets the seconds of each stage (where a job's time goes)."""
    phases = phases if phases is not None else {}
    clock = [time.monotonic()]

    def lap(name: str) -> None:
        now = time.monotonic()
        phases[name] = round(phases.get(name, 0.0) + now - clock[0], 3)
        clock[0] = now

    module, function = sub.target(spec)
    result = AssignmentResult(spec.name, spec.title, f"{module}:{function}()")
    calls = plan_calls(spec, opts.seed, opts.interpret, opts.cases, opts.dtypes)
    step = progress or (lambda _: None)
    call_timeout = opts.timeout or spec.call_timeout_s

    runnable = [c for c in calls if not c.skip]
    if runnable and not sub.has(spec):  # one result that says so, not one error per case
        return _not_submitted(spec, sub, opts, result, module, calls, runnable)
    sandbox.prewarm(opts.interpret, opts.gpu, opts.isolation)

    worker = StudentWorker(spec, workdir / "repo", (module, function), workdir / "scratch", opts, hide=[sub.root.parent])
    integrity = _Integrity(spec)
    try:
        if not runnable:
            load_failure = None
        else:
            # made outside the worker's view; each call's file is shown to it only for that call,
            # so no input can be read ahead (at import) and answered from a precomputed cache
            materialize(spec, runnable, workdir.parent / f"{spec.name}.inputs")
            sub.private_copy(workdir / "repo")
            _scan(result, workdir / "repo", module)
            lap("inputs_and_copy")
            load_failure = _start(worker, spec)
            lap("worker_start_and_import")
        consecutive_timeouts, restart = 0, False
        for call in calls:
            step(f"{spec.name}: {call.id}")
            if call.skip:
                result.tests.append(_test(spec, call, opts, "skipped", call.skip))
                continue
            if restart and not load_failure and consecutive_timeouts < MAX_CONSECUTIVE_TIMEOUTS:
                load_failure, restart = _start(worker, spec), False  # a fresh worker, once a call needs one
            if load_failure:
                result.tests.append(_from_failure(spec, call, opts, load_failure, f"importing {module} failed"))
                continue
            if consecutive_timeouts >= MAX_CONSECUTIVE_TIMEOUTS:
                result.tests.append(_test(spec, call, opts, "timeout", "not run: the calls before this one timed out"))
                continue
            test = _run_call(spec, call, opts, worker, workdir, call_timeout, integrity)
            result.tests.append(test)
            consecutive_timeouts = consecutive_timeouts + 1 if test.outcome == "timeout" else 0
            restart = test.outcome in ("timeout", "crashed", "infra_error")
        result.tests.append(integrity.test())
        lap("correctness_calls")
        if not opts.interpret and runnable and not load_failure:
            step(f"{spec.name}: bounds check")
            result.tests.append(_bounds_check(spec, opts, (module, function), workdir, call_timeout))
            lap("bounds_check")
        if spec.performance is not None:
            step(f"{spec.name}: performance")
            result.tests.append(perf.measure(spec, result, opts, worker, workdir, call_timeout,  # the GPU alone while timing
                                             exclusive=lambda: timing_lock(opts.gpu, enabled=not opts.interpret)))
            lap("performance")
    finally:
        worker.close()
        lap("closing")
    planned = None
    if opts.partial_points and (opts.cases or opts.dtypes):  # a partial run: each case keeps its share of the full run's points
        planned = [f"{c.case.name} [{c.dtype}]" for c in plan_calls(spec, opts.seed, opts.interpret)]
        result.partial = {"cases_run": len(calls), "cases": len(planned), "assignment_points": spec.max_points}
    score_assignment(spec, result, planned)
    if note := hidden_note(spec):
        result.notes.append(note)
    result.headline = headline(result, sub.root / module)
    return result


def _not_submitted(spec: Assignment, sub: Submission, opts: Options, result: AssignmentResult, module: str,
                   calls: list[PlannedCall], runnable: list[PlannedCall]) -> AssignmentResult:
    """The assignment's module is not in the repo: one failed result worth every point this
    run could have earned (the cases that run here, speed on a GPU), and the rest noted."""
    partial = opts.partial_points and (opts.cases or opts.dtypes)
    planned = [f"{c.case.name} [{c.dtype}]" for c in (plan_calls(spec, opts.seed, opts.interpret) if partial else calls)]
    shares = dict(zip(planned, split_cents(spec.correctness_points, len(planned))))
    share = {c.id: shares.get(f"{c.case.name} [{c.dtype}]", 0) for c in calls}
    perf = cents(spec.performance_points) if spec.performance is not None else 0
    timed = spec.performance is not None and not opts.interpret
    named = " (the module grader.toml names)" if "module" in sub.overrides.get(spec.name, {}) else ""
    test = TestResult(spec.name, "submission", "not submitted", "failed",
                      f"{module}{named} is not in the submission: nothing of {spec.name} was checked",
                      details={"not_submitted": True})
    test.max_score = (sum(share[c.id] for c in runnable) + (perf if timed else 0)) / 100
    skipped = sum(share[c.id] for c in calls if c.skip) + (0 if timed else perf)
    if skipped:  # what a GPU run would add: part of the total, earned nowhere here (as a graded submission's skipped tests)
        result.tests.append(TestResult(spec.name, "submission", "checks that need a GPU", "skipped",
                                       "not submitted, and not runnable here", max_score=skipped / 100,
                                       details={"points_if_run": skipped / 100}))
    result.tests.insert(0, test)
    return result


def hidden_note(spec: Assignment) -> str:
    """What a report says of the hidden cases: how many, and that they run at grading."""
    if spec.withheld_cases:
        return (f"{spec.withheld_cases} hidden case(s) of {spec.name} are not in this kit: they run at grading time, "
                "with random shapes of their own. Passing every case here does not guarantee them.")
    here = sum(c.hidden for c in spec.cases)
    return f"{here} of these cases are hidden from students (they run at grading time only)." if here else ""


BOUNDS_CHECK_MAX_ELEMENTS = 1 << 18


def _bounds_check(spec: Assignment, opts: Options, target: tuple[str, str], workdir: Path, timeout: float) -> TestResult:
    """On a GPU an out-of-bounds load or store often goes unseen: it reads a neighbour's
    memory and the values inside the tensor still come out right. So a GPU run replays the
    small named cases, in float32, in Triton's CPU interpreter, where grader.memcheck checks
    every access against the bounds of the kernel's tensors."""
    name = "memory safety (every load and store bounds-checked in the CPU interpreter)"
    cpu = replace(opts, device="cpu", dtypes=["float32"], cases=None)
    calls = [c for c in plan_calls(spec, opts.seed, True, None, ["float32"]) if c.case in spec.cases
             and sum(t.numel() for t in make_inputs(spec, c.case, c.dtype, c.seed).values() if hasattr(t, "numel")) <= BOUNDS_CHECK_MAX_ELEMENTS]
    materialize(spec, calls, workdir.parent / f"{spec.name}.bounds-inputs")
    worker = StudentWorker(spec, workdir / "repo", target, workdir / "scratch-bounds", cpu)
    skipped: list[str] = []
    try:
        failure = _start(worker, spec)
        if failure:
            return TestResult(spec.name, "integrity", name, "skipped", f"the module does not import in the interpreter: {failure.get('message')}")
        timeouts = 0
        for call in calls:
            if timeouts >= MAX_CONSECUTIVE_TIMEOUTS:  # a hanging kernel: each call would wait its whole timeout
                skipped.append(f"{call.case.name}: not run, the calls before it timed out")
                continue
            out = output_path(workdir, f"bounds-{call.slug}.safetensors")
            try:
                with shown_to_worker(call.input_file, workdir) as shown:
                    reply = worker.request({"op": "run", "contender": "student", "inputs": str(shown), "layout": call.layout,
                                            "device": "cpu", "output": str(out)}, timeout)
            except WorkerFailure as f:
                skipped.append(f"{call.case.name}: {f.message}")
                timeouts = timeouts + 1 if f.outcome == "timeout" else 0
                if timeouts < MAX_CONSECUTIVE_TIMEOUTS:
                    _start(worker, spec)
                continue
            timeouts = 0
            if reply.get("kind") == "memory":
                return TestResult(spec.name, "integrity", name, "failed", f"{call.case.name} [float32]: {reply['message']}",
                                  case=call.case.name, dtype="float32", traceback=reply.get("traceback", ""),
                                  reproducer=f"{opts.reproducer} -a {spec.name} --case '{call.case.name}' --dtype float32 --seed {call.seed} --device cpu")
            if not reply.get("ok"):
                skipped.append(f"{call.case.name}: {reply.get('message')}")
    finally:
        worker.close()
    if len(skipped) == len(calls):
        return TestResult(spec.name, "integrity", name, "skipped", "the kernel could not run in the interpreter: " + "; ".join(skipped[:2]))
    checked = ", ".join(c.case.name for c in calls)
    note = f" (not run there: {'; '.join(skipped[:2])})" if skipped else ""
    return TestResult(spec.name, "integrity", name, "passed", f"no access out of bounds in {checked}{note}")


def _scan(result: AssignmentResult, repo: Path, module: str) -> None:
    """The static scan's warnings, for the TA: in the notes and results.json, never a verdict."""
    findings = scan_submission(repo, module)
    result.warnings = [f.to_dict() for f in findings]
    if findings:
        result.notes.append(scan_summary(findings))


def _start(worker: StudentWorker, spec: Assignment) -> dict | None:
    """None when the module imported; else the failure, as the worker or sandbox told it."""
    try:
        reply = worker.start()
    except WorkerFailure as f:
        return {"kind": f.outcome, "message": f"while importing: {f.message}", "traceback": "", "output": f.output}
    return None if reply.get("ok") else reply


def _run_call(spec, call: PlannedCall, opts: Options, worker: StudentWorker, workdir: Path, timeout: float, integrity) -> TestResult:
    runs = []  # (inputs, reply, saved) of each call this case makes: usually one
    for i, (input_file, layout) in enumerate(call.runs):
        output_file = output_path(workdir, f"{call.slug}.safetensors" if i == 0 else f"{call.slug}.call{i}.safetensors")
        try:
            with shown_to_worker(input_file, workdir) as shown, \
                    gpu_phase(opts.gpu, exclusive=False, enabled=not opts.interpret):  # waits while another job times
                reply = worker.request({"op": "run", "contender": "student", "inputs": str(shown), "layout": layout,
                                        "device": opts.device, "output": str(output_file), "record_ops": True}, timeout)
        except WorkerFailure as f:
            return _test(spec, call, opts, f.outcome, f.message, output=f.output)
        if not reply.get("ok"):
            if reply.get("kind") == "memory":
                return _test(spec, call, opts, "failed", reply["message"], traceback=reply.get("traceback", ""))
            return _from_failure(spec, call, opts, reply, f"{spec.function}() raised")
        try:
            saved = load(sandbox.read_worker_file(output_file))
        except Exception as exc:  # noqa: BLE001 - whatever the worker left there, it is not a result
            return _test(spec, call, opts, "failed", f"the worker's output file could not be read: {exc}")
        runs.append((load_inputs(call, index=i), reply, saved))
    if len(runs) == 1 and spec.check is None:
        verdict = judge_call(spec, call.case, call.dtype, *runs[0], opts.device)
    else:
        verdict = judge_runs(spec, call.case, call.dtype, runs, opts.device)
    reply = _merged([r for _, r, _ in runs])
    integrity.observe(call, reply, verdict.outcome == "passed", trivial=all(_trivial(saved, inputs) for inputs, _, saved in runs))
    details = dict(verdict.details, seconds=round(reply["seconds"], 4), kernels=reply["launches"])
    if "wrong_map" in details:  # the kernel's block sizes, for the picture's boundaries (sizes only: it is the worker's word)
        blocks = runs[0][1].get("blocks")
        details["blocks"] = {str(k)[:40]: v for k, v in (blocks if isinstance(blocks, dict) else {}).items()
                             if type(v) is int and 0 < v <= 1 << 24}
    return _test(spec, call, opts, verdict.outcome, verdict.message, details=details)


def _merged(replies: list[dict]) -> dict:
    """One case's calls seen as one: time and launches added up, every op that ran."""
    if len(replies) == 1:
        return replies[0]
    launches: Counter[str] = Counter()
    for r in replies:
        launches.update(r["launches"])
    return {"seconds": sum(r["seconds"] for r in replies), "launches": dict(launches),
            "ops": sorted({op for r in replies for op in r["ops"]})}


def _from_failure(spec, call, opts, failure: dict, context: str) -> TestResult:
    outcome = failure.get("kind", "error")
    outcome = outcome if outcome in ("timeout", "crashed", "infra_error") else "error"
    return _test(spec, call, opts, outcome, f"{context}: {failure.get('message', '')}",
                 traceback=failure.get("traceback", ""), output=failure.get("output", ""))


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


def _test(spec, call: PlannedCall, opts: Options, outcome: str, message: str, **kw) -> TestResult:
    reproducer = f"{opts.reproducer} -a {spec.name} --case '{call.case.name}' --dtype {call.dtype} --seed {call.seed}"
    return TestResult(spec.name, "correctness", f"{call.case.name} [{call.dtype}]", outcome, message,
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
            concerns = [f"{c.case.name} [{c.dtype}]" for c in self.no_kernel]
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
