"""`grader course check`: an assignment proved before students see it, on the CPU.

What it verifies, each problem one line with its file and line (`CourseFinding`):
- every spec loads (grader.spec's contract; a spec that does not import names its line);
- `function`, `signature`, module and handout agree: the signature is a call of `function`, the
  handout names the function, the starter (starter/<module>) defines it, the reference
  (reference/<name>.py) and the solution (solutions/<module>) export it and take the inputs
  make_inputs makes;
- every `forbidden_ops` name is a real aten op (aten::add.Tensor), and the reference calls none;
- the timing case's inputs fit the memory it names (Performance.bytes_moved reads each input once);
- in Triton's interpreter (TRITON_INTERPRET=1, a fresh Python): the reference and the solution
  pass every named, hidden and random case in every dtype the interpreter runs (bf16 is a GPU's),
  judged against the truth exactly as a student's call; the starter fails, with its one-line cause
  (said, not a problem); a spec function that raises is the course's error, with its line;
- on a GPU (`reference_speed`): the reference is timed beside torch's baseline (SPEC.baseline) on
  the timing case's inputs, L2 flushed before each call (triton.testing.do_bench): a reference
  slower than the baseline is named, since students would be scored against a slower bar (a note
  only where Performance(against="faster") already makes the faster of the two the bar).

`grader release` and `grader gradescope` run it first and ship nothing that fails. A course
proved once is not proved again while none of its files change (`proved`, a stamp in the kept
cache keyed by their contents).
"""

from __future__ import annotations

import ast
import hashlib
import importlib.util
import json
import os
import re
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from grader import spec as specs

INTERPRETED_DTYPES = ("float32", "float16")  # bf16 arithmetic is wrong in Triton's CPU interpreter
RUN_TIMEOUT_S = 1800
SLOWER_MARGIN = 1.10  # a reference more than 10% slower than torch's baseline is named
SPEED_ROUNDS = 3  # reference and baseline alternated, each round one do_bench of each
SPEED_REP_MS = 40  # do_bench's budget per measurement (ms of calls)
NO_GPU_NOTE = "the speed of the references was not checked (no GPU)"


@dataclass(frozen=True)
class CourseFinding:
    """One problem: the file (absolute), its line (0: the file as a whole) and what to mend."""

    path: Path
    line: int
    message: str

    def shown(self, root: Path) -> str:
        where = _relative(self.path, root)
        return f"{where}:{self.line}: {self.message}" if self.line else f"{where}: {self.message}"


@dataclass
class CourseReport:
    """What the check found, and what it says beside the problems (each starter's cause)."""

    root: Path
    checked: list[str] = field(default_factory=list)
    findings: list[CourseFinding] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.findings

    def lines(self) -> list[str]:
        return [f.shown(self.root) for f in self.findings]


def _relative(path: Path, root: Path) -> str:
    try:
        return str(Path(path).resolve().relative_to(Path(root).resolve()))
    except (ValueError, OSError):
        return str(path)


def line_of(path: Path, pattern: str, default: int = 1) -> int:
    """The first line of `path` matching the regex `pattern` (a spec's field), else `default`."""
    try:
        for n, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
            if re.search(pattern, line):
                return n
    except OSError:
        return 0
    return default


def solution_file(course: specs.Course, spec: specs.Assignment) -> Path:
    return course.root / "solutions" / spec.module


def starter_file(course: specs.Course, spec: specs.Assignment) -> Path | None:
    """starter/<module> of the assignment, or (a second part sharing a module, like
    layernorm_backward) another assignment's starter of that module."""
    own = spec.folder / "starter" / spec.module
    shared = sorted((course.root / "assignments").glob(f"*/starter/{spec.module}"))
    return own if own.is_file() else (shared[0] if shared else None)


def reference_file(course: specs.Course, spec: specs.Assignment) -> Path:
    """reference/<name>.py, which the grader times against; an assignment without a speed part may
    share its module's reference (reference/<module's file name>)."""
    own = course.reference / f"{spec.name}.py"
    by_module = course.reference / Path(spec.module).name
    return by_module if spec.performance is None and not own.is_file() and by_module.is_file() else own


def defines(path: Path, function: str) -> int:
    """The line where `path` defines `function` at its top level (read, not imported), else 0."""
    try:
        tree = ast.parse(path.read_text(errors="replace"))
    except (SyntaxError, ValueError, OSError):
        return 0
    return next((n.lineno for n in tree.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))
                 and n.name == function), 0)


def real_aten_op(name: str) -> bool:
    """`aten::add.Tensor` names an op and overload torch has (`aten::add` its default overload)."""
    import torch

    if not name.startswith("aten::"):
        return False
    op, _, overload = name[len("aten::"):].partition(".")
    packet = getattr(torch.ops.aten, op, None) if op.isidentifier() else None
    if packet is None or not hasattr(packet, "overloads"):
        return False
    return (overload or "default") in packet.overloads()


# -- the checks that read files ----------------------------------------------------------------------

def static_findings(course: specs.Course, spec: specs.Assignment) -> list[CourseFinding]:
    spec_file = spec.folder / "spec.py"
    found: list[CourseFinding] = []

    def at(field_name: str) -> int:
        return line_of(spec_file, rf"\b{field_name}\s*=", line_of(spec_file, r"\bSPEC\s*="))

    called = re.match(r"\s*([A-Za-z_]\w*)\s*\(", spec.signature or "")
    if called is None:
        found.append(CourseFinding(spec_file, at("signature"), f"SPEC.signature {spec.signature!r} is not a call "
                             f"`{spec.function}(...)`"))
    elif called.group(1) != spec.function:
        found.append(CourseFinding(spec_file, at("function"), f"SPEC.function is {spec.function!r} but SPEC.signature "
                             f"names {called.group(1)!r}: students would be told both (they must be the same name)"))
    handout = spec.folder / "README.md"
    if not handout.is_file():
        found.append(CourseFinding(handout, 0, "the handout is missing (what to write, the signature, the points)"))
    elif not re.search(rf"\b{re.escape(spec.function)}\b", handout.read_text(errors="replace")):
        found.append(CourseFinding(handout, 0,
                                   f"the handout never names the function {spec.function}() students write"))
    starter = starter_file(course, spec)
    if starter is None:
        found.append(CourseFinding(spec.folder / "starter" / spec.module, 0,
                                   "the starter is missing (the module students "
                             "start from, at the path SPEC.module names)"))
    elif not defines(starter, spec.function):
        found.append(CourseFinding(starter, 0,
                                   f"the starter does not define {spec.function}() (a stub students fill in)"))
    for role, path in (("reference", reference_file(course, spec)), ("solution", solution_file(course, spec))):
        found += _exports(spec, role, path)
    for op in sorted(spec.forbidden_ops):
        if not real_aten_op(op):
            found.append(CourseFinding(spec_file, at("forbidden_ops"),
                                       f"SPEC.forbidden_ops names {op!r}, which is no aten "
                                 "op of this torch (`grader course ops` prints the ones a reference calls)"))
    found += _timing_fits(spec, spec_file, at("bytes_moved"))
    return found


def _exports(spec: specs.Assignment, role: str, path: Path) -> list[CourseFinding]:
    """The reference or solution file exports the function, taking make_inputs' inputs (read, not run)."""
    missing = {"reference": f"the reference is missing (reference/{spec.name}.py must export {spec.function}())",
               "solution": f"the solution is missing (a correct {spec.module} under solutions/, defining "
                           f"{spec.function}())"}
    if not path.is_file():
        return [CourseFinding(path, 0, missing[role])]
    line = defines(path, spec.function)
    if not line:
        return [CourseFinding(path, 0, f"the {role} does not define {spec.function}() (SPEC.function)")]
    tree = ast.parse(path.read_text(errors="replace"))
    node = next(n for n in tree.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))
                and n.name == spec.function)
    params = [a.arg for a in (*node.args.posonlyargs, *node.args.args)]
    if spec.calls is None and not node.args.vararg:
        try:
            inputs = list(spec.make_inputs(spec.public_cases[0].params, specs.DTYPES["float32"], _generator()))
        except Exception:  # noqa: BLE001 - said by the run, with its line
            return []
        if [a for a in params if a in inputs] != [a for a in inputs if a in params] or \
                any(a not in params for a in inputs):
            return [CourseFinding(path, line,
                                  f"{spec.function}({', '.join(params)}) does not take the inputs make_inputs "
                                        f"makes ({', '.join(inputs)})")]
    return []


def _generator():
    import torch

    return torch.Generator().manual_seed(0)


def _timing_fits(spec: specs.Assignment, spec_file: Path, line: int) -> list[CourseFinding]:
    """The timing case's inputs, made as fake tensors (no memory), fit Performance.bytes_moved:
    a kernel reads each input at least once, so less than that is a floor no kernel can reach."""
    perf = spec.performance
    if perf is None:
        return []
    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode

    dtype = specs.DTYPES[perf.dtype]
    try:
        with FakeTensorMode():
            inputs = spec.make_inputs(perf.case.params, dtype, torch.Generator().manual_seed(0))
            read = sum(t.numel() * t.element_size() for t in inputs.values() if isinstance(t, torch.Tensor))
    except Exception:  # noqa: BLE001 - a make_inputs fake tensors cannot run proves nothing here
        return []
    try:
        named = int(perf.bytes_moved(perf.case.params, dtype))
    except Exception as exc:  # noqa: BLE001 - the course's error, with its line
        err = specs.raised_in_course(spec, "bytes_moved", exc, perf.case.name)
        return [CourseFinding(spec_file, line, str(err))]
    if named < read:
        return [CourseFinding(spec_file, line, f"the timing case {perf.case.name} reads {read} bytes of inputs but "
                                         f"Performance.bytes_moved says {named}: it must count at least every input "
                                         "read once (and the result written)")]
    return []


# -- the checks that run: one interpreter for the whole course ---------------------------------------

def run_findings(course: specs.Course, chosen: list[specs.Assignment], report: CourseReport) -> list[CourseFinding]:
    """The reference and the solution on every case, the starter on the smallest, in a fresh Python
    with Triton's interpreter on from the start (it reads TRITON_INTERPRET at import)."""
    jobs = []
    for spec in chosen:
        for role, path in (("reference", reference_file(course, spec)), ("solution", solution_file(course, spec)),
                           ("starter", starter_file(course, spec))):
            if path is not None and path.is_file() and defines(path, spec.function):
                jobs.append({"name": spec.name, "role": role, "path": str(path)})
    if not jobs:
        return []
    env = _interpreter_env()
    request = json.dumps({"course": str(course.root), "secret": course.secret(), "jobs": jobs})
    done = subprocess.run([sys.executable, "-m", "grader.kit.coursecheck"], input=request, env=env, cwd=course.root,
                          capture_output=True, text=True, timeout=RUN_TIMEOUT_S)
    try:
        answers = json.loads(done.stdout.strip().splitlines()[-1])
    except (IndexError, ValueError):
        tail = " ".join(done.stderr.strip().splitlines()[-3:])[-600:]
        return [CourseFinding(course.root, 0,
                              f"the interpreted run ended without an answer (exit {done.returncode}): {tail}")]
    found = []
    by_name = {s.name: s for s in chosen}
    for answer in answers:
        spec, path = by_name[answer["name"]], Path(answer["path"])
        role, outcome = answer["role"], answer["outcome"]
        where = f"{answer['case']} [{answer['dtype']}]" if answer.get("case") else ""
        if outcome == "course_error":  # the spec's own function raised: its file and line, once
            file, _, line = answer["where"].rpartition(":")
            finding = CourseFinding(course.root / file, int(line) if line.isdigit() else 0, answer["message"])
            if finding not in found:
                found.append(finding)
        elif role == "starter":
            if outcome == "passed":
                found.append(CourseFinding(path, defines(path, spec.function),
                                           f"the starter passes {where}: students would have nothing to write"))
            else:
                report.notes.append(f"{spec.name}: the starter fails as it should: {outcome} on {where}: "
                                    f"{answer['message']}")
        elif outcome == "raised":
            found.append(CourseFinding(path, answer.get("line") or defines(path, spec.function),
                                       f"the {role} raised on {where}: {answer['message']}"))
        elif outcome == "error":
            found.append(CourseFinding(path, answer.get("line") or 0, f"the {role} {answer['message']}"))
        elif outcome != "passed":
            found.append(CourseFinding(path, defines(path, spec.function),
                                       f"the {role} does not pass {where} ({outcome}): {answer['message']}"))
        if role == "reference" and answer.get("forbidden"):
            spec_file = spec.folder / "spec.py"
            named = line_of(spec_file, r"forbidden_ops")
            found.append(CourseFinding(path, 0, f"the reference calls {', '.join(answer['forbidden'])}, which "
                                                f"SPEC.forbidden_ops forbids (spec.py line {named})"))
    return found


def _interpreted() -> None:
    """The child: each job graded in process, the verdict the judge gives a student's call."""
    _first_config_only()
    request = json.loads(sys.stdin.read())
    course = specs.Course(Path(request["course"]), request.get("secret"))
    answers = []
    for job in request["jobs"]:
        spec = course.get(job["name"])
        answers.append({"name": job["name"], "role": job["role"], "path": job["path"],
                        **_graded(spec, Path(job["path"]), job["role"])})
    print(json.dumps(answers))


def _first_config_only() -> None:
    """Autotune keeps its first config, as the grader's worker runs it on the CPU (timing configs needs a GPU)."""
    import triton
    from triton.runtime import autotuner

    original = autotuner.autotune
    first = lambda configs, *a, **kw: original(list(configs)[:1], *a, **kw)  # noqa: E731
    triton.autotune = autotuner.autotune = first


def _graded(spec: specs.Assignment, path: Path, role: str) -> dict:
    from grader.judge.plan import cases_for

    try:
        function = getattr(_load(path, f"course_check_{role}_{spec.name}"), spec.function)
    except Exception as exc:  # noqa: BLE001 - any failure to import is the finding
        line = next((f.lineno for f in reversed(_frames(exc)) if Path(f.filename) == path), 0)
        return {"outcome": "error", "line": line, "message": f"does not import: {type(exc).__name__}: {exc}"}
    try:
        if role == "starter":
            dtypes = ["float32"]
            cases = [smallest_case(spec)]
        else:
            dtypes = [d for d in spec.dtypes if d in INTERPRETED_DTYPES]
            cases = cases_for(spec, 0)
        forbidden: set[str] = set()
        last: dict = {}
        for case in cases:
            for dtype in dtypes:
                ops: set[str] = set()
                try:
                    verdict = grade_in_process(spec, function, case, dtype, ops)
                except specs.CourseCodeError:
                    raise
                except Exception as exc:  # noqa: BLE001 - the kernel's own error: its verdict
                    from grader.sanitize import one_line

                    line = next((f.lineno for f in reversed(_frames(exc)) if Path(f.filename) == path), 0)
                    return {"outcome": "raised", "case": case.name, "dtype": dtype, "line": line,
                            "message": one_line(f"{type(exc).__name__}: {exc}", 300), "forbidden": sorted(forbidden)}
                forbidden |= ops & spec.forbidden_ops
                last = {"outcome": verdict.outcome.value, "case": case.name, "dtype": dtype,
                        "message": verdict.message}
                if verdict.outcome.value != "passed":
                    return {**last, "forbidden": sorted(forbidden)}
        return {**last, "forbidden": sorted(forbidden)}
    except specs.CourseCodeError as exc:
        return {"outcome": "course_error", "where": exc.where, "message": str(exc).split(": ", 1)[1]}


def _frames(exc: BaseException):
    import traceback

    return traceback.extract_tb(exc.__traceback__)


def _load(path: Path, name: str):
    loader = importlib.util.spec_from_file_location(name, path)
    assert loader is not None and loader.loader is not None
    module = importlib.util.module_from_spec(loader)
    loader.loader.exec_module(module)
    return module


def smallest_case(spec: specs.Assignment) -> specs.Case:
    import torch

    from grader.judge.plan import make_inputs

    def size(case: specs.Case) -> int:
        return sum(v.numel() for v in make_inputs(spec, case, "float32", 0).values() if isinstance(v, torch.Tensor))

    return min(spec.public_cases, key=size)


def _copy_view(t):
    """t over a copy of its whole storage, with its strides and offset: a view (a crop, a
    transpose) stays that view, as the worker rebuilds it, so the storage the judge compares
    with is the one the function was given."""
    from grader.codec import storage_of

    return storage_of(t).as_strided(t.shape, t.stride(), t.storage_offset())


def call_as_worker(function, inputs: dict, ops: set[str] | None = None) -> tuple[dict, dict, dict]:
    """What the worker sends back for one call of `function` on `inputs`: (inputs, reply, saved);
    `ops` gets the aten ops the call dispatched."""
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode

    from grader.codec import storage_of

    class DispatchedOps(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if ops is not None:
                ops.add(func.name())
            return func(*args, **(kwargs or {}))

    args = {k: _copy_view(v) if isinstance(v, torch.Tensor) else v for k, v in inputs.items()}
    with DispatchedOps():
        out = function(**args)
    saved = {f"input.{k}": storage_of(v) for k, v in args.items() if isinstance(v, torch.Tensor)}  # a write in place
    reply: dict = {"device": "cpu", "result_type": type(out).__name__}
    if isinstance(out, tuple):
        reply["outputs"] = [{"device": "cpu", "dtype": str(o.dtype).removeprefix("torch.")} for o in out]
        saved.update({f"output.{i}": o for i, o in enumerate(out)})
    elif isinstance(out, torch.Tensor):
        reply["dtype"] = str(out.dtype).removeprefix("torch.")
        saved["output"] = out
    return inputs, reply, saved


def grade_in_process(spec: specs.Assignment, function, case: specs.Case, dtype: str = "float32",
                     ops: set[str] | None = None):
    """The judge's verdict on `function` for `case` in `dtype`, called here (no worker, no
    sandbox: the course's own code, or a test's)."""
    from grader.judge.plan import make_inputs
    from grader.judge.verdict import judge_call, judge_runs

    inputs = make_inputs(spec, case, dtype, 0)
    with specs.course_code(spec, "calls", f"{case.name} [{dtype}]"):
        calls = spec.calls(inputs) if spec.calls else [inputs]
    runs = [call_as_worker(function, args, ops) for args in calls]
    if len(runs) == 1 and spec.check is None:
        return judge_call(spec, case, dtype, *runs[0], "cpu")
    return judge_runs(spec, case, dtype, runs, "cpu")


# -- the reference's speed, on a GPU ------------------------------------------------------------------

Clock = Callable[[str, Callable[[], Any]], float]  # (who: "reference" | "baseline", the call) -> ms


def flushed_l2_ms(who: str, call: Callable[[], Any]) -> float:
    """The median GPU time of `call` in ms, L2 flushed before each call, by CUDA events (triton's
    do_bench; the first call, which compiles and autotunes, is outside it)."""
    from triton.testing import do_bench

    return float(do_bench(call, warmup=10, rep=SPEED_REP_MS, return_mode="median"))


def timed_against_baseline(spec: specs.Assignment, reference: Callable, clock: Clock = flushed_l2_ms,
                           device: str = "cuda") -> tuple[float, float]:
    """(reference ms, baseline ms) on the timing case's inputs as the grader's timing makes them
    (make_inputs from the run's seed, input set 0; on `device` with their layout), in this process,
    the two alternated SPEED_ROUNDS times and each the median of its rounds."""
    import statistics

    import torch

    from grader.codec import storage_of
    from grader.judge.plan import derive_seed, make_inputs

    perf = spec.performance
    assert perf is not None  # timed only for an assignment with a performance case
    made = make_inputs(spec, perf.case, perf.dtype, derive_seed(0, "perf", "0"))
    args = [storage_of(v).to(device).as_strided(v.shape, v.stride(), v.storage_offset())
            if isinstance(v, torch.Tensor) else v for v in made.values()]
    del made
    times: dict[str, list[float]] = {"reference": [], "baseline": []}
    for _ in range(SPEED_ROUNDS):
        times["reference"].append(clock("reference", lambda: reference(*args)))
        with specs.course_code(spec, "baseline", f"{perf.case.name} [{perf.dtype}]"):
            times["baseline"].append(clock("baseline", lambda: spec.baseline(*args)))
    return statistics.median(times["reference"]), statistics.median(times["baseline"])


def reference_speed(course: specs.Course, spec: specs.Assignment, report: CourseReport, clock: Clock = flushed_l2_ms,
                    device: str = "cuda") -> list[CourseFinding]:
    """The reference timed beside torch's baseline: slower by more than SLOWER_MARGIN is a problem
    at the reference's function (students scored against a slower bar), a note where
    Performance(against="faster") makes the faster of the two the bar."""
    from grader.sanitize import one_line

    perf = spec.performance
    path = reference_file(course, spec)
    if perf is None or not path.is_file():
        return []
    line = defines(path, spec.function)
    try:
        function = getattr(_load(path, f"course_speed_{spec.name}"), spec.function)
        ref_ms, base_ms = timed_against_baseline(spec, function, clock, device)
    except specs.CourseCodeError as exc:
        file, _, at = exc.where.rpartition(":")
        return [CourseFinding(course.root / file, int(at) if at.isdigit() else 0, str(exc).split(": ", 1)[1])]
    except Exception as exc:  # noqa: BLE001 - the reference's own failure on the GPU: the finding
        if type(exc).__name__ == "OutOfMemoryError":
            spec_file = spec.folder / "spec.py"
            return [CourseFinding(spec_file, line_of(spec_file, r"\bperformance\s*="),
                                  f"the timing case {perf.case.name} [{perf.dtype}] does not fit this GPU's memory: "
                                  f"{one_line(str(exc), 200)}")]
        where = next((f.lineno for f in reversed(_frames(exc)) if Path(f.filename) == path), line)
        return [CourseFinding(path, where, f"the reference raised when timed on {perf.case.name} [{perf.dtype}] "
                              f"on the GPU: {one_line(f'{type(exc).__name__}: {exc}', 300)}")]
    ratio = ref_ms / base_ms if base_ms > 0 else float("inf")
    said = f"reference takes {ref_ms:.3f} ms, torch's baseline {base_ms:.3f} ms ({ratio:.2f}x)"
    if ratio <= SLOWER_MARGIN:
        report.notes.append(f"{spec.name}: {said} on {perf.case.name} [{perf.dtype}]")
        return []
    if perf.against == "faster":
        report.notes.append(f"{spec.name}: {said}: Performance(against=\"faster\") scores students against the "
                            f"faster of the two")
        return []
    return [CourseFinding(path, line, f"{said}: students will be scored against a slower bar")]


def speed_device(device: str) -> str | None:
    """Where the references are timed: "cuda" for auto or cuda where torch sees a GPU, else None."""
    if device == "cpu":
        return None
    import torch

    return "cuda" if torch.cuda.is_available() else None


# -- the course ---------------------------------------------------------------------------------------

def check_course(course: specs.Course, names: list[str] | None = None, run: bool = True,
                 device: str = "auto", clock: Clock = flushed_l2_ms) -> CourseReport:
    """Every check above on `names` (default: every assignment of the course); the references'
    speed on the GPU where `device` (auto, cuda or cpu) allows one and torch sees it."""
    report = CourseReport(course.root)
    loaded, broken = course.load_each()
    for path, rules in broken.items():
        for rule in rules:
            report.findings.append(CourseFinding(path, _line_of_rule(path, rule), rule))
    unknown = [n for n in names or () if n not in loaded and not any(p.parent.name == n for p in broken)]
    if unknown:
        raise specs.UnknownAssignment(f"unknown assignment {unknown[0]!r} (known: {', '.join(loaded) or 'none'})")
    chosen = [loaded[n] for n in (names or list(loaded)) if n in loaded]
    if not loaded and not broken:
        report.findings.append(CourseFinding(course.root / "assignments", 0, "no assignment: each is "
                                       "assignments/<name>/spec.py (`grader assignment new NAME` writes one)"))
    report.checked = [s.name for s in chosen]
    for spec in chosen:
        report.findings += static_findings(course, spec)
    if run and chosen:
        report.findings += run_findings(course, chosen, report)
        gpu = speed_device(device)
        if gpu is None:
            report.notes.append(NO_GPU_NOTE + (" (--device cpu)" if device == "cpu" else ""))
        else:
            for spec in chosen:
                broken_here = any(_about(f, course, spec) for f in report.findings)
                if spec.performance is not None and not broken_here:  # a wrong reference's time means nothing
                    report.findings += reference_speed(course, spec, report, clock, gpu)
    return report


def _about(finding: CourseFinding, course: specs.Course, spec: specs.Assignment) -> bool:
    """The finding is in one of the assignment's files (its folder, reference, solution)."""
    path = Path(finding.path)
    return (path == reference_file(course, spec) or path == solution_file(course, spec)
            or spec.folder in path.parents or path == spec.folder)


def _line_of_rule(path: Path, rule: str) -> int:
    """The line a load failure points at: the import's own line, else the field the rule names."""
    m = re.search(r"line (\d+)", rule)
    if m:
        return int(m.group(1))
    m = re.search(r"SPEC\.(\w+)", rule)
    return line_of(path, rf"\b{m.group(1)}\s*=", line_of(path, r"\bSPEC\s*=")) if m else 0


def fingerprint(course: specs.Course, names: list[str]) -> str:
    """sha256 of every file a check of `names` reads (the specs, hidden cases, handouts, starters,
    references, solutions), of the grader's version and of torch's: equal, the verdict is too."""
    from grader import __version__

    h = hashlib.sha256(f"{__version__} {names}".encode())
    h.update(hashlib.sha256((course.secret() or "").encode()).digest())  # the random shapes come from it
    for folder in ("assignments", "reference", "solutions"):
        base = course.root / folder
        for p in sorted(base.rglob("*")) if base.is_dir() else []:
            if p.is_file() and "__pycache__" not in p.parts and p.name != "course-secret.txt":
                h.update(str(p.relative_to(course.root)).encode() + b"\0" + p.read_bytes() + b"\0")
    return h.hexdigest()[:32]


def proved(course: specs.Course, names: list[str], stamps: Path) -> CourseReport:
    """check_course, unless a check of exactly these files passed before (a stamp in `stamps`, the
    kept cache): a release after an unchanged course does not run the interpreter again."""
    if _stamp(course, names, stamps).is_file():
        return CourseReport(course.root, names)
    report = check_course(course, names)
    if report.ok:
        keep_proof(course, names, stamps)
    return report


def keep_proof(course: specs.Course, names: list[str], stamps: Path) -> None:
    """Say in `stamps` that `names` of `course`, as their files are now, passed the check."""
    try:
        stamps.mkdir(parents=True, exist_ok=True)
        _stamp(course, names, stamps).write_text(json.dumps({"course": str(course.root), "assignments": names}))
    except OSError:
        pass  # only slower next time


def _stamp(course: specs.Course, names: list[str], stamps: Path) -> Path:
    return stamps / f"{fingerprint(course, sorted(names))}.ok"


def aten_ops_called(course: specs.Course, name: str, path: Path | None = None, dtype: str = "float32") -> list[str]:
    """The aten ops `path` (default: the reference) dispatches on the assignment's smallest public
    case, in this process (torch's own ops, a GPU or not: what forbidden_ops may name)."""
    spec = course.get(name)
    path = path or reference_file(course, spec)
    function = getattr(_load(path, f"course_ops_{name}"), spec.function)
    ops: set[str] = set()
    grade_in_process(spec, function, smallest_case(spec), dtype, ops)
    return sorted(ops)


def interpreted_ops(course: specs.Course, name: str, path: Path | None = None) -> list[str]:
    """aten_ops_called, in a fresh Python with Triton's interpreter (no GPU needed)."""
    env = _interpreter_env()
    argv = [sys.executable, "-m", "grader.kit.coursecheck", "ops", str(course.root), name, str(path or "")]
    done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=RUN_TIMEOUT_S)
    if done.returncode != 0:
        raise RuntimeError(" ".join(done.stderr.strip().splitlines()[-2:])[-600:])
    return json.loads(done.stdout.strip().splitlines()[-1])


def _interpreter_env() -> dict[str, str]:
    package_parent = str(Path(specs.__file__).resolve().parents[1])
    return dict(os.environ, TRITON_INTERPRET="1",
                PYTHONPATH=os.pathsep.join(filter(None, [package_parent, os.environ.get("PYTHONPATH")])))


if __name__ == "__main__":
    if sys.argv[1:2] == ["ops"]:
        _first_config_only()
        root, name, path = sys.argv[2:5]
        print(json.dumps(aten_ops_called(specs.Course(Path(root)), name, Path(path) if path else None)))
    else:
        _interpreted()
