"""Grade one submission: for each assignment, plan -> worker -> judge -> scoring.

This is the only module that drives workers. Every failure of student code becomes an
outcome on the tests it touched (error, timeout, crashed), the worker is restarted for
the rest, and the other assignments never notice.
"""

from __future__ import annotations

import statistics
import tempfile
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from safetensors.torch import load_file

from grader import environment
from grader.judge import judge_call, judge_runs
from grader.plan import PlannedCall, derive_seed, load_inputs, make_inputs, materialize, plan_calls, write_inputs
from grader.results import AssignmentResult, RunResult, TestResult
from grader.sandbox import WorkerFailure, WorkerProcess
from grader.scoring import score_assignment
from grader.spec import COURSE_ROOT, Assignment
from grader.submission import Submission

MAX_CONSECUTIVE_TIMEOUTS = 2


@dataclass
class Options:
    device: str  # "cuda" runs kernels on the GPU; "cpu" in Triton's interpreter
    seed: int
    cases: list[str] | None = None
    dtypes: list[str] | None = None
    timeout: float | None = None  # per call, overriding the spec's
    gpu: str | None = None  # CUDA_VISIBLE_DEVICES for the workers
    perf_rounds: int = 5
    perf_reps: int = 20
    perf_input_sets: int = 3
    reproducer: str = "grader check ."
    roofline: dict = field(default_factory=dict)  # measured once per run, shared by assignments

    @property
    def interpret(self) -> bool:
        return self.device == "cpu"


Progress = Callable[[str], None]


def grade_submission(sub: Submission, specs: list[Assignment], opts: Options, progress: Progress | None = None) -> RunResult:
    run = RunResult(str(sub.root), opts.seed, environment.describe(opts.device), commit=sub.commit())
    with tempfile.TemporaryDirectory(prefix="grader-") as tmp:
        for spec in specs:
            run.assignments.append(grade_assignment(sub, spec, opts, Path(tmp) / spec.name, progress))
    if opts.roofline:
        run.environment["roofline"] = opts.roofline
    return run


def count_steps(specs: list[Assignment], opts: Options) -> int:
    """How many progress steps grade_submission reports (one per call, one per timing)."""
    return sum(len(plan_calls(s, opts.seed, opts.interpret, opts.cases, opts.dtypes)) + (s.performance is not None) for s in specs)


class StudentWorker:
    """The student's module loaded in a worker; restarted after a timeout or crash."""

    def __init__(self, spec: Assignment, repo: Path, target: tuple[str, str], scratch: Path, opts: Options) -> None:
        self.spec, self.repo, self.target, self.scratch, self.opts = spec, repo, target, scratch, opts
        self.process: WorkerProcess | None = None
        self.starts = 0

    def start(self) -> dict:
        """Start and import; returns the worker's reply (ok, or the student's error)."""
        self.close()
        self.starts += 1
        self.process = WorkerProcess(self.repo, self.scratch / f"worker-{self.starts}", self.opts.interpret, self.opts.gpu)
        module, function = self.target
        return self.process.request(
            {"op": "load", "contenders": {"student": {"root": str(self.repo), "module": module, "function": function}}},
            self.spec.import_timeout_s,
        )

    def request(self, message: dict, timeout: float) -> dict:
        assert self.process is not None
        return self.process.request(message, timeout)

    def close(self) -> None:
        if self.process is not None:
            self.process.close()
            self.process = None


def grade_assignment(sub: Submission, spec: Assignment, opts: Options, workdir: Path, progress: Progress | None = None) -> AssignmentResult:
    module, function = sub.target(spec)
    result = AssignmentResult(spec.name, spec.title, f"{module}:{function}()")
    calls = plan_calls(spec, opts.seed, opts.interpret, opts.cases, opts.dtypes)
    step = progress or (lambda _: None)
    call_timeout = opts.timeout or spec.call_timeout_s

    runnable = [c for c in calls if not c.skip]

    worker = StudentWorker(spec, workdir / "repo", (module, function), workdir / "scratch", opts)
    integrity = _Integrity(spec)
    try:
        if not runnable:
            load_failure = None
        elif not sub.has(spec):
            load_failure = {"kind": "error", "message": f"{module} not found in the submission", "traceback": ""}
        else:
            materialize(spec, runnable, workdir / "inputs")
            sub.private_copy(workdir / "repo")
            load_failure = _start(worker, spec)
        consecutive_timeouts = 0
        for call in calls:
            step(f"{spec.name}: {call.id}")
            if call.skip:
                result.tests.append(_test(spec, call, opts, "skipped", call.skip))
                continue
            if load_failure:
                result.tests.append(_from_failure(spec, call, opts, load_failure, f"importing {module} failed"))
                continue
            if consecutive_timeouts >= MAX_CONSECUTIVE_TIMEOUTS:
                result.tests.append(_test(spec, call, opts, "timeout", "not run: the calls before this one timed out"))
                continue
            test = _run_call(spec, call, opts, worker, workdir, call_timeout, integrity)
            result.tests.append(test)
            consecutive_timeouts = consecutive_timeouts + 1 if test.outcome == "timeout" else 0
            if test.outcome in ("timeout", "crashed"):
                load_failure = _start(worker, spec)
        result.tests.append(integrity.test())
        if spec.performance is not None:
            step(f"{spec.name}: performance")
            result.tests.append(_performance(spec, result, opts, worker, workdir, call_timeout))
    finally:
        worker.close()
    score_assignment(spec, result)
    return result


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
        output_file = workdir / "outputs" / (f"{call.slug}.safetensors" if i == 0 else f"{call.slug}.call{i}.safetensors")
        output_file.parent.mkdir(parents=True, exist_ok=True)
        request = {
            "op": "run",
            "contender": "student",
            "inputs": str(input_file),
            "layout": layout,
            "device": opts.device,
            "output": str(output_file),
            "record_ops": True,
        }
        try:
            reply = worker.request(request, timeout)
        except WorkerFailure as f:
            return _test(spec, call, opts, f.outcome, f.message, output=f.output)
        if not reply.get("ok"):
            if reply.get("kind") == "memory":
                return _test(spec, call, opts, "failed", reply["message"], traceback=reply.get("traceback", ""))
            return _from_failure(spec, call, opts, reply, f"{spec.function}() raised")
        runs.append((load_inputs(call, index=i), reply, load_file(str(output_file))))
    if len(runs) == 1 and spec.check is None:
        verdict = judge_call(spec, call.case, call.dtype, *runs[0], opts.device)
    else:
        verdict = judge_runs(spec, call.case, call.dtype, runs, opts.device)
    reply = _merged([r for _, r, _ in runs])
    integrity.observe(call, reply, verdict.outcome == "passed")
    details = dict(verdict.details, seconds=round(reply["seconds"], 4), kernels=reply["launches"])
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
    outcome = outcome if outcome in ("timeout", "crashed") else "error"
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
                      case=call.case.name, dtype=call.dtype, shape=_shape(call), reproducer=reproducer, **kw)


class _Integrity:
    """Evidence that the student's own Triton kernel did the work: which aten ops the call
    dispatched (a forbidden one means torch computed the answer) and how many kernels launched."""

    def __init__(self, spec: Assignment) -> None:
        self.spec = spec
        self.forbidden: dict[str, list[str]] = {}
        self.no_kernel: list[str] = []
        self.kernels: Counter[str] = Counter()
        self.observed = 0

    def observe(self, call: PlannedCall, reply: dict, passed: bool) -> None:
        self.observed += 1
        self.kernels.update(reply["launches"])
        for op in sorted(set(reply["ops"]) & self.spec.forbidden_ops):
            self.forbidden.setdefault(op, []).append(call.id)
        if passed and not reply["launches"]:
            self.no_kernel.append(call.id)

    def test(self) -> TestResult:
        name = "uses its own Triton kernel"
        if not self.observed:
            return TestResult(self.spec.name, "integrity", name, "skipped", "no call completed, so nothing to inspect")
        evidence = [f"torch computed the result: {op} ran inside {self.spec.function}() in {_few(ids)}"
                    for op, ids in self.forbidden.items()]
        if self.no_kernel:
            evidence.append(f"no Triton kernel was launched in {_few(self.no_kernel)}, yet the result was right")
        details = {"kernels_launched": dict(self.kernels), "evidence": evidence}
        if evidence:
            return TestResult(self.spec.name, "integrity", name, "flagged", "; ".join(evidence), details=details)
        kernels = ", ".join(f"{k} x{n}" for k, n in self.kernels.items()) or "none"
        return TestResult(self.spec.name, "integrity", name, "passed", f"kernels launched: {kernels}", details=details)


def _few(ids: list[str]) -> str:
    return ", ".join(ids[:3]) + (f" and {len(ids) - 3} more" if len(ids) > 3 else "")


# -- performance --------------------------------------------------------------------------

def _performance(spec: Assignment, result: AssignmentResult, opts: Options, worker: StudentWorker, workdir: Path, timeout: float) -> TestResult:
    perf = spec.performance
    assert perf is not None
    name = f"performance {perf.case.name} [{perf.dtype}]"

    def test(outcome: str, message: str, **kw) -> TestResult:
        return TestResult(spec.name, "performance", name, outcome, message, case=perf.case.name, dtype=perf.dtype, **kw)

    if opts.interpret:
        return test("skipped", "speed is measured on a GPU only: the CPU interpreter's timings mean nothing")
    ran = [t for t in result.tests if t.kind == "correctness" and t.outcome != "skipped"]
    if not ran or any(t.outcome != "passed" for t in result.tests if t.kind != "performance" and t.outcome != "skipped"):
        return test("failed", "not timed: every correctness and integrity check must pass first (no performance points without correctness)")
    if worker.process is None:
        return test("error", "not timed: the worker could not be restarted")

    folder = workdir / "perf"
    folder.mkdir(parents=True, exist_ok=True)
    files, layout = [], {}
    for i in range(opts.perf_input_sets):
        path = folder / f"set{i}.safetensors"
        layout = write_inputs(make_inputs(spec, perf.case, perf.dtype, derive_seed(opts.seed, "perf", str(i))), path)
        files.append(str(path))

    trusted = WorkerProcess(workdir / "scratch", workdir / "scratch" / "trusted", interpret=False, gpu=opts.gpu)
    contenders = {"torch": {"root": str(spec.folder), "module": "spec.py", "function": "baseline"}}
    has_reference = spec.reference_module().is_file()
    if has_reference:
        contenders["reference"] = {"root": str(spec.reference_module().parent), "module": spec.reference_module().name, "function": spec.function}
    try:
        loaded = trusted.request({"op": "load", "contenders": contenders}, 120)
        if not loaded.get("ok"):
            return test("infra_error", f"the reference side failed to load: {loaded.get('message')}", traceback=loaded.get("traceback", ""))
        if not opts.roofline:
            probe = trusted.request({"op": "probe"}, 120)
            opts.roofline.update(copy_gbps=probe["copy_gbps"], gpu=probe["device_name"])
        order = [("student", worker)] + [(c, trusted) for c in ("reference", "torch") if c in contenders]
        times: dict[str, list[float]] = {c: [] for c, _ in order}
        walls: dict[str, float] = Counter()
        first_call: dict[str, float] = {}
        for _ in range(opts.perf_rounds):  # interleaved: student, reference, torch, student, ...
            for contender, w in order:
                reply = w.request({"op": "time", "contender": contender, "inputs": files, "layout": layout, "reps": opts.perf_reps}, timeout * 4)
                if not reply.get("ok"):
                    return test("error", f"{contender} raised while timed: {reply.get('message')}", traceback=reply.get("traceback", ""))
                times[contender] += reply["times_ms"]
                walls[contender] += reply["wall_ms"]
                first_call.setdefault(contender, reply["first_call_ms"])
    except WorkerFailure as f:
        return test(f.outcome, f"while timing: {f.message}", output=f.output)
    finally:
        trusted.close()

    nbytes = perf.bytes_moved(perf.case.params, _dtype(perf.dtype))
    figures = {}
    for contender, ts in times.items():
        median = statistics.median(ts)
        figures[contender] = {
            "median_ms": round(median, 5),
            "q1_ms": round(statistics.quantiles(ts, n=4)[0], 5),
            "q3_ms": round(statistics.quantiles(ts, n=4)[2], 5),
            "gbps": round(nbytes / (median * 1e-3) / 1e9, 1),
            "roofline_pct": round(100 * nbytes / (median * 1e-3) / 1e9 / opts.roofline["copy_gbps"], 1),
            "first_call_ms": round(first_call[contender], 2),
            "wall_over_events": round(walls[contender] / sum(ts), 3),
        }
    student = figures["student"]
    details = {"figures": figures, "bytes": nbytes, "copy_gbps": round(opts.roofline["copy_gbps"], 1), "gpu": opts.roofline["gpu"],
               "samples": len(times["student"])}
    vs_torch = student["median_ms"] / figures["torch"]["median_ms"]
    details["ratio_to_torch"] = round(vs_torch, 3)
    summary = (f"{student['gbps']:.0f} GB/s ({student['roofline_pct']:.0f}% of the measured copy bandwidth); "
               f"{vs_torch:.2f}x torch's time")
    if not has_reference:
        return test("skipped", summary + "; the reference kernel is not part of this install, so no points are computed here", details=details)
    ratio = student["median_ms"] / figures["reference"]["median_ms"]
    fraction = perf.score_fraction(ratio)
    details.update(ratio_to_reference=round(ratio, 3), score_fraction=round(fraction, 3))
    message = (f"{ratio:.2f}x the reference kernel's time: {fraction:.0%} of the points (full at <= {perf.full_at}x, none at >= {perf.zero_at}x); "
               + summary)
    return test("passed" if fraction > 0 else "failed", message, details=details)


def _dtype(name: str):
    from grader.spec import DTYPES

    return DTYPES[name]
