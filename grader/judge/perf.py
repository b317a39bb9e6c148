"""The performance stage (GPU only): time student, reference and torch, interleaved, and
decide what the timing is worth.

Rounds go student, reference, torch, student, ... on the same rotated input sets, each
contender in its own worker (the reference never shares a process with student code).
Rounds continue until the ratio's interval is tight and does not straddle a scoring
threshold, or the time budget runs out. A call's time is the GPU time of its own work, read
from the GPU's activity records on every stream (grader.judge.activity), so work moved to a side
stream or a thread is timed where it ran, and a slow Python wrapper costs no GPU time. A timing
earns points only if it is honest, and each finding says how sure it is (grader.results.Severity):
- conclusive: the timing functions were patched; a vendor op did the work at this size; the
  outputs of the timed calls, or of a fresh input set afterwards, are wrong (caching by pointer
  or shape, "correct for the first N calls", replay of an earlier result); the worker's figures
  are shorter than the grader's own clock shows, or the calls that clock timed gave wrong
  results (grader.judge.witness: no figure from the worker is scored unless that clock confirms
  it, and where it does not, the score comes from that clock);
- review: the function returned before its GPU work was done (an unjoined stream or a thread),
  GPU work ran while none of its calls was running, fewer Triton launches than timed calls, or
  a time faster than this GPU can go (bytes / measured copy bandwidth and FLOPs / measured GEMM
  peak are floors on any honest time).
Host overhead is not evidence of anything: each call's host (wall) time is reported beside its
GPU time, and a spec may score on it (`Performance.score_on`).
"""

from __future__ import annotations

import dataclasses
import os
import random
import statistics
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, cast

import torch
from safetensors.torch import load, save_file

from grader import proctable, sanitize
from grader.codec import floating_dtypes
from grader.judge import activity, replay_process, replay_stage, slowness, witness
from grader.judge.context import GradingContext
from grader.judge.devicelock import device_id
from grader.judge.plan import derive_seed
from grader.judge.resources import Resources
from grader.judge.runcache import write_perf_set
from grader.judge.timing import confirmation, decision
from grader.judge.workers import StudentWorker
from grader.payloads import Ceilings, Figures, FindingNote, Kind, PerformancePayload, ReplayInputs, Witnessed
from grader.protocol import (
    BurstReady,
    Call,
    CallReply,
    Contender,
    DropBurst,
    Failure,
    Load,
    PrepareBurst,
    Reply,
    Roofline,
    Sample,
    Time,
    TimeReply,
    WarmBurst,
)
from grader.results import AssignmentResult, Outcome, Severity, TestResult
from grader.sandbox.files import output_path, read_worker_file, shown_to_worker, worker_cannot_write
from grader.sandbox.process import WorkerFailure, WorkerProcess
from grader.spec import DTYPES, Assignment, Performance

SAMPLE_SIZE = 1 << 16
MIN_ROUNDS, MAX_ROUNDS = 5, 25
TARGET_HALF_WIDTH = 0.015  # stop when the ratio's 95% interval is within +-1.5%
MIN_SCORED_MS = 0.05  # below this a kernel is launch-bound: its time says little about the kernel
# A time may beat the roofline's floor by this much before it is called impossible: the copy probe
# is torch's own device-to-device copy, which a tuned kernel beat by 3% on an H200 (vector_add's
# reference: 103%), and clocks vary a few percent between runs.
ROOFLINE_MARGIN = 0.15


@dataclass(frozen=True)
class Finding:
    severity: Severity
    text: str

    def note(self) -> FindingNote:
        """The finding as results.json records it."""
        return FindingNote(severity=self.severity.value, text=self.text)


@dataclass
class Timings:
    times: dict[str, list[list[float]]] = field(default_factory=dict)  # contender -> rounds -> per-call GPU ms (scored)
    # per-call CUDA event times, all rounds (a cross-check)
    event_ms: dict[str, list[float]] = field(default_factory=dict)
    host_ms: dict[str, list[list[float]]] = field(default_factory=dict)  # rounds -> per settle call host wall ms
    first_call_ms: dict[str, float] = field(default_factory=dict)
    launches: dict[str, int] = field(default_factory=dict)
    tampered: set[str] = field(default_factory=set)
    unfinished: list[str] = field(default_factory=list)  # the student's
    strays: list[str] = field(default_factory=list)  # the student's
    output_numel: int | None = None  # as torch's result has it (trusted)
    witness: witness.Witness = field(default_factory=witness.Witness)  # the grader's own clock (grader.judge.witness)

    def all(self, contender: str) -> list[float]:
        return [t for r in self.times[contender] for t in r]

    def median(self, contender: str) -> float:
        return statistics.median(self.all(contender))


# the replays timed: the rounds' figures, torch's median, the reference's and the student's replay
_Timed = tuple[Timings, float, replay_process.Replayed, replay_process.Replayed]


def _dtype(spec: Assignment) -> str:
    """The dtype the speed is measured in."""
    assert spec.performance is not None  # timed only for an assignment with a performance case
    return spec.performance.dtype


class UntrustedRecords(Exception):
    """The GPU activity records do not fit the timed loop: the timing cannot be trusted (ours)."""


def call_times(reply: TimeReply) -> tuple[list[float], list[float], activity.Reading]:
    """Per timed call: the GPU time it is scored on (its own GPU activities, on any stream, from
    the records), the CUDA event times (a cross-check), and the whole reading of the records."""
    if reply.activities is None:
        raise UntrustedRecords(f"the GPU activity records could not be collected ({reply.activity_error}): "
                               "work on other streams could go unseen")
    reading = activity.read(reply.activities, reply.marks, reply.settle_marks)
    if reading.problems:
        raise UntrustedRecords("the GPU activity records do not fit the timed loop: " + "; ".join(reading.problems[:3]))
    return reading.busy_ms, reply.event_ms, reading


def round_ratios(student: list[list[float]], reference: list[list[float]]) -> list[float]:
    """One ratio per round: student and reference ran back to back there, so a drift of the
    GPU's clocks between rounds cancels out of each ratio."""
    return [statistics.median(s) / statistics.median(r) for s, r in zip(student, reference)]


def ratio_estimate(student: list[list[float]], reference: list[list[float]], draws: int = 2000,
                   seed: int = 0) -> tuple[float, float, float]:
    """The median of the per-round ratios and its 95% bootstrap interval."""
    ratios = round_ratios(student, reference)
    rng = random.Random(seed)
    medians = sorted(statistics.median(rng.choices(ratios, k=len(ratios))) for _ in range(draws))
    return statistics.median(ratios), medians[int(0.025 * draws)], medians[int(0.975 * draws) - 1]


def yardstick(perf: Performance, scored: dict[str, list[list[float]]]) -> list[list[float]] | None:
    """Per round, the samples the student's are divided by: the reference's, or (a spec with
    `against="faster"`) whichever of the reference's and the vendor baseline's has the lower
    median in that round. None without a reference."""
    reference = scored.get("reference")
    if not reference or getattr(perf, "against", "reference") != "faster" or not scored.get("torch"):
        return reference or None
    return [r if statistics.median(r) <= statistics.median(v) else v for r, v in zip(reference, scored["torch"])]


def needs_more_rounds(rounds: int, student: list[list[float]], reference: list[list[float]] | None, full_at: float,
                      zero_at: float, out_of_time: bool) -> bool:
    """Another round, unless: the minimum is run and the ratio's interval is tight and clear of
    both scoring thresholds; or the maximum or the budget is spent; or there is no reference."""
    if rounds < MIN_ROUNDS:
        return True
    if reference is None or rounds >= MAX_ROUNDS or out_of_time:
        return False
    mid, lo, hi = ratio_estimate(student, reference)
    decided = not any(lo < x < hi for x in (full_at, zero_at))
    return not (decided and (hi - lo) / 2 <= TARGET_HALF_WIDTH * mid)


def floor_ms(nbytes: int, flops: int | None, copy_gbps: float, gemm_tflops: float | None) -> tuple[float, str]:
    """The least time any honest kernel can take on this GPU, and which ceiling sets it."""
    memory = nbytes / (copy_gbps * 1e9) * 1e3
    compute = flops / (gemm_tflops * 1e12) * 1e3 if flops and gemm_tflops else 0.0
    return (compute, "cuBLAS GEMM peak") if compute > memory else (memory, "copy bandwidth")


@dataclass
class Stage:
    """One timing of one assignment: what its steps share, the result they make (`test`) and the
    seconds each phase took (`phase`, for the TA: what a job spends where)."""

    session: Resources
    spec: Assignment
    student: StudentWorker  # the student's module loaded
    workdir: Path
    timeout: float
    roofline: dict | None
    phases: dict[str, float] = field(default_factory=dict)
    clock: float = field(default_factory=time.monotonic)
    busiest: int = 0  # the most threads the host had ready to run around the replays (grader.proctable.runnable)

    @property
    def ctx(self) -> GradingContext:
        return self.session.context

    @property
    def perf(self) -> Performance:
        perf = self.spec.performance
        assert perf is not None  # measure() is called only for a spec with a performance part
        return perf

    def test(self, outcome: str, message: str, **kw: Any) -> TestResult:
        perf = self.perf
        return TestResult(self.spec.name, Kind.PERFORMANCE, f"performance {perf.case.name} [{perf.dtype}]",
                          Outcome(outcome), message, case=perf.case.name, dtype=perf.dtype, **kw)

    def phase(self, name: str) -> None:
        now = time.monotonic()
        self.phases[name] = round(now - self.clock, 2)
        self.clock = now


def measure(session: Resources, spec: Assignment, result: AssignmentResult, student: StudentWorker, workdir: Path,
            timeout: float,
            roofline: dict | None = None) -> TestResult:
    """`student` is the StudentWorker with the student's module loaded. The speed is scored by
    replay where the student's launches can be replayed (`_by_replay`), else by the fallback's
    rounds (`_by_rounds`). The session holds the GPU alone (`alone_on_gpu`) only for what is
    timed. `roofline`: the GPU's ceilings if the run has them, else measured here; the ones used
    are in the result's details (its "roofline"), for the run to reuse and record."""
    stage = Stage(session, spec, student, workdir, timeout, roofline)
    early = _not_timed(stage, result)
    if early is not None:
        return early
    # our own code (reference, torch) runs outside the student's job folder, so nothing the
    # student's worker writes (a planted module, a poisoned Triton cache) reaches it; started
    # first: it imports torch and Triton while the input sets are written
    trusted = session.trusted_worker(workdir.parent / f"{spec.name}.trusted")
    try:
        return _timed(stage, trusted)
    except WorkerFailure as f:
        return stage.test(f.outcome, f"while timing: {f.message}", output=f.output)
    finally:
        trusted.close()


def _not_timed(stage: Stage, result: AssignmentResult) -> TestResult | None:
    """Why this assignment is not timed at all, or None."""
    if stage.ctx.interpret:
        return stage.test("skipped", "speed is measured on a GPU only: the CPU interpreter's timings mean nothing; "
                          "a GPU run also tells what the compiled kernel is (registers, spills, shared memory, warps, "
                          "stages, its grid against the GPU's SMs) and the share of the roofline it reaches")
    ran = [t for t in result.tests if t.kind == "correctness" and t.outcome != Outcome.SKIPPED]
    if not ran or any(t.outcome != Outcome.PASSED for t in result.tests
                      if t.kind != "performance" and t.outcome != Outcome.SKIPPED):
        return stage.test("failed", "not timed: every correctness and integrity check must pass first "
                          "(no performance points without correctness)")
    if stage.student.process is None:
        return stage.test("error", "not timed: the worker could not be restarted")
    return None


def _timed(stage: Stage, trusted: WorkerProcess) -> TestResult:
    """Input sets made and the trusted side loaded (before the GPU is taken: another job's
    correctness calls may run meanwhile), then the replay, or the fallback's rounds."""
    spec, ctx = stage.spec, stage.ctx
    contenders = {"torch": Contender(str(spec.folder), "spec.py", "baseline")}
    ref = ctx.reference_module(spec)
    has_reference = ref.is_file()
    if has_reference:
        contenders["reference"] = Contender(str(ref.parent), ref.name, spec.function)
    timed_files, fresh_file, layout = _input_sets(stage)
    stage.phase("inputs")
    loaded = trusted.request(Load(contenders), 120)
    if isinstance(loaded, Failure):
        return stage.test("infra_error", f"the reference side failed to load: {loaded.message}",
                          traceback=loaded.traceback)
    stage.phase("reference_load")
    fallback = ""
    if has_reference and stage.perf.score_on == "gpu":  # the scored path: the student's kernels replayed
        replayed_result, fallback = _by_replay(stage, trusted, timed_files, layout)
        if replayed_result is not None:
            assert isinstance(replayed_result.details, PerformancePayload)  # test() makes a performance result
            replayed_result.details.phase_seconds = stage.phases
            return replayed_result
    return _by_rounds(stage, trusted, contenders, timed_files, fresh_file, layout, fallback)


def _input_sets(stage: Stage) -> tuple[list[str], Path, dict]:
    """The timing's input sets (shown to the student's worker, read-only) and the fresh one
    (outside its view until shown, after timing), from the run's cache where there is one:
    the first set alone, then the others at once, as many as memory holds (random numbers and
    writes of GBs, in threads: torch and the writes release the GIL)."""
    spec, ctx, perf, cache = stage.spec, stage.ctx, stage.perf, stage.session.cache
    folder = stage.workdir / "perf"
    folder.mkdir(parents=True, exist_ok=True)
    hidden = stage.workdir.parent / f"{spec.name}.perf"
    hidden.mkdir(parents=True, exist_ok=True)
    assert stage.student.process is not None  # a timing starts only with the student's worker running (_not_timed)
    shareable = worker_cannot_write(stage.student.process.isolation)  # else each job gets its own copy

    def make(i: int) -> tuple[Path, dict]:
        path = (folder if i < ctx.perf_input_sets else hidden) / f"set{i}.safetensors"
        if cache is not None:  # made once per run, for every student graded with this seed
            layout = cache.perf_inputs(spec, perf.case, perf.dtype, ctx.performance_seed, i, path, link=shareable)
        else:
            layout = write_perf_set(spec, perf.case, perf.dtype, ctx.performance_seed, i, path)
        os.chmod(path, 0o644)  # safetensors writes 0600: the worker's own uid must read it
        return path, layout

    made = [make(0)]
    with ThreadPoolExecutor(max_workers=parallel_sets(ctx.perf_input_sets, made[0][0].stat().st_size)) as pool:
        made += pool.map(make, range(1, ctx.perf_input_sets + 1))
    files = [p for p, _ in made]
    return [str(f) for f in files[:-1]], files[-1], made[-1][1]


def _by_rounds(stage: Stage, trusted: WorkerProcess, contenders: dict[str, Contender], timed_files: list[str],
               fresh_file: Path, layout: dict,
               fallback: str) -> TestResult:
    """The fallback: rounds of student, reference and torch in their workers, the student's
    witnessed by the grader's own clock (grader.judge.witness), the timed outputs checked."""
    spec, ctx = stage.spec, stage.ctx
    student = stage.student.process
    assert student is not None  # a timing starts only with the student's worker running (_not_timed)
    workers = {"student": student, "torch": trusted, "reference": trusted}
    has_reference = "reference" in contenders
    order = ["student"] + [c for c in ("reference", "torch") if c in contenders]
    t = Timings(times={c: [] for c in order}, event_ms={c: [] for c in order}, host_ms={c: [] for c in order},
                witness=witness.Witness(student=lambda: replay_stage.student_pids(stage.student)))
    compiled: dict = {}  # what the compiler made of the student's kernels (the untimed call after timing)
    if has_reference and spec.performance is not None and spec.performance.score_on == "gpu":
        _warm_bursts(stage, workers, timed_files[0])
    with stage.session.alone_on_gpu():
        stage.phase("waiting_for_gpu")
        stage.roofline = stage.roofline or _roofline(stage.session, trusted)
        stage.phase("roofline")
        try:
            rounds, failed = _timed_rounds(ctx, spec, workers, order, t, timed_files, layout, stage.timeout,
                                           has_reference)
        except UntrustedRecords as exc:
            return stage.test("infra_error", f"not scored: {exc}")
        except witness.WitnessRefused as exc:
            return stage.test("flagged", f"no speed credit: {exc}", severity=Severity.CONCLUSIVE.value)
        if failed:
            c, reply = failed
            return stage.test("error", f"{c} raised while timed: {reply.message}", traceback=reply.traceback)
        stage.phase("timed_rounds")
        # still alone: both workers hold the timing's input sets and outputs on the GPU (tens
        # of GB at the scoring sizes), which must be freed before another job times
        # torch's timed result, a tensor, has its size (the samples are drawn below it)
        assert t.output_numel is not None
        findings = _check_outputs(spec, ctx, workers, contenders, layout, timed_files, fresh_file, stage.workdir,
                                  stage.timeout, t.output_numel, compiled)
        stage.phase("output_checks")
    findings += _conduct(t, ctx.perf_reps * rounds)
    witnessed = _witnessed(t, findings)
    verdict = _verdict(spec, stage.roofline, t, rounds, findings, has_reference, stage.test)
    details = verdict.details
    assert isinstance(details, PerformancePayload)  # test() makes a performance result
    if witnessed:
        details.witness = witnessed
        if witnessed.note and verdict.outcome in (Outcome.PASSED, Outcome.FAILED):
            verdict.message += f"; {witnessed.note}"
    details.phase_seconds, details.roofline = stage.phases, Ceilings.from_json(stage.roofline)
    details.timed_by = "fallback" if fallback else "rounds"
    if fallback:  # why the replay did not time it: the fallback's figure comes from the grader's clock and the worker
        details.replay_refused = fallback
        if verdict.outcome in (Outcome.PASSED, Outcome.FAILED):
            verdict.message += f"; timed in your worker, not by replay ({fallback})"
    _why_slow(verdict, details, compiled, ctx)
    if fallback and verdict.outcome == Outcome.PASSED:
        _hold(verdict, details, fallback,
              confirmation.held(fallback, details.ratio_to_reference or 0.0, details.score_fraction or 0.0))
    return verdict


def _hold(verdict: TestResult, details: PerformancePayload, why: str, text: str) -> None:
    """A figure the grader could not verify (the fallback's, or a replay its clock could not
    confirm) earns no points on its own: they wait for a TA's `grader review --clear` (the
    curve's share stays in the details, which is what a clearing restores:
    grader.judge.scoring.points_without_findings); `text` tells the student why, and for the
    fallback what to change to be replayed (grader.judge.timing.confirmation.held)."""
    details.held = why
    details.evidence = [text]
    details.findings = [Finding(Severity.REVIEW, text).note()]
    verdict.outcome, verdict.severity = Outcome.FLAGGED, Severity.REVIEW
    verdict.message = f"no speed credit yet: {text}; {verdict.message}"


def _roofline(session: Resources, trusted: WorkerProcess) -> dict:
    """The GPU's ceilings, from the run's cache or measured now by the trusted worker."""
    def probe() -> dict:
        reply = trusted.request(Roofline(), 300)
        if isinstance(reply, Failure):
            raise WorkerFailure("infra_error", f"the roofline could not be measured: {reply.message}")
        return dataclasses.asdict(reply)
    cache = session.cache
    return cache.roofline(device_id(session.context.gpu, session.settings), probe) if cache is not None else probe()


def _cancel(pending: dict) -> None:
    for c in pending.values():
        replay_process.cancel(c)


def _stop(runs: dict) -> None:
    for c in runs.values():
        replay_process.stop(c)


def _by_replay(stage: Stage, trusted: WorkerProcess, timed_files: list[str],
               layout: dict) -> tuple[TestResult | None, str]:
    """The speed scored by replay (grader.judge.replay_stage): the result, or (None, why) where the
    fallback times it instead (the student's worker then still alive). The replay processes
    start first: their imports overlap the recorded calls; they set up on the GPU while the
    student's worker is stopped (the GPU held shared), and run their kernels only when told to
    go, inside the exclusive hold."""
    ctx, settings, cache = stage.ctx, stage.session.settings, stage.session.cache
    staging = stage.workdir.parent / f"{stage.spec.name}.replay"
    # the reference's figure kept for this assignment already: its replay process is likely not needed
    expect = replay_stage.expected_key(stage.spec, ctx, settings)
    contenders = ("student",) if cache is not None and cache.kept_timing(expect) else ("student", "reference")
    pending = {c: replay_stage.spawn(staging, c, stage.session.replay_process, stage.timeout) for c in contenders}
    try:
        prep = replay_stage.prepare(stage.spec, stage.student, trusted, timed_files, layout, stage.workdir, staging,
                                    stage.timeout)
    except BaseException:
        _cancel(pending)
        raise
    stage.phase("replay_record")
    if prep.error or prep.findings or prep.fallback:
        _cancel(pending)
    if prep.error:
        return stage.test("infra_error", f"not scored: {prep.error}"), ""
    if prep.findings:
        return _flagged(stage.test, [Finding(sev, text) for sev, text in prep.findings], {"timed_by": "replay"}), ""
    if prep.fallback:
        return None, prep.fallback
    prepared = prep.prepared
    assert prepared is not None  # no error, finding or fallback: prepared
    try:
        burst = _confirming_bursts(stage, trusted, timed_files[0], layout, prepared.launches)
    except BaseException:
        _cancel(pending)
        raise
    stage.phase("confirm_bursts")
    if isinstance(burst, TestResult):
        _cancel(pending)
        return burst, ""
    key = replay_stage.reference_key(prepared, stage.spec, ctx, settings)
    kept = cache.kept_timing(key) if cache is not None else None
    if kept is not None:  # the reference's figure is kept for the run: its process is not needed (unless drift says so)
        replay_process.cancel(pending.pop("reference", None))
    elif "reference" not in pending:  # another record of the reference than the kept one: replayed after all
        pending["reference"] = replay_stage.spawn(staging, "reference", stage.session.replay_process, stage.timeout)
    placed: dict[str, replay_process.ReplayProcess | replay_process.Replayed | None] = {
        "student": replay_stage.place(prepared, "student", pending["student"]),
        "reference": replay_stage.place(prepared, "reference", pending["reference"]) if kept is None else None}
    timed = _set_up_and_timed(stage, trusted, timed_files, layout, prepared, placed, kept)
    if isinstance(timed, TestResult):
        return timed, ""
    t, torch_ms, ref_run, student_run = timed
    r = replay_stage.judge(prepared, stage.spec, ref_run, student_run, kept=kept is not None and ref_run.folder is None,
                           timeout=stage.timeout, sharing=stage.session.sharing_gpu)
    stage.phase("replay_checks")
    if cache is not None and not r.reference_kept and r.reference.ms \
            and not (r.reference.failed or r.reference.refused):
        cache.keep_timing(key, {"ms": r.reference.ms, "placements": r.reference.placements,
                                "launches": r.reference.launches, "torch_ms": torch_ms})
        cache.keep_timing(expect, {"reference_key": key})
    return _replay_verdict(stage, prepared, r, t, burst), ""


def _confirming_bursts(stage: Stage, trusted: WorkerProcess, inputs: str, layout: dict,
                       launches: int = 1) -> witness.Witness | TestResult:
    """The student's own calls at the timing size, timed by the grading process's clock while its
    worker is alone on the GPU and still alive (grader.judge.timing.confirmation): BURST_ROUNDS bursts of
    the student's and the reference's (the trusted worker's), alternating which goes first, on
    inputs drawn from a seed told only then, every call's result sampled and checked against the
    reference's. Returns the brackets, or the result that ends the stage (wrong samples, a reply
    written ahead: conclusive; the student's function raised: error)."""
    spec, perf = stage.spec, stage.perf
    student = stage.student.process
    assert student is not None  # a timing starts only with the student's worker running (_not_timed)
    workers = {"student": student, "reference": trusted}
    w = witness.Witness(student=lambda: replay_stage.student_pids(stage.student))
    with stage.session.alone_on_gpu():
        stage.phase("waiting_for_gpu")
        stage.roofline = stage.roofline or _roofline(stage.session, trusted)
        dt = DTYPES[perf.dtype]
        floor, _ = floor_ms(perf.bytes_moved(perf.case.params, dt), perf.flops(perf.case.params, dt) if perf.flops
                            else None, stage.roofline["copy_gbps"],
                            stage.roofline.get("gemm_tflops", {}).get(perf.dtype))
        # sized by the floor (a lower bound on the reference's time): at least BURST_GPU_MS of the reference's work
        w.calls = witness.burst_calls(floor, os.path.getsize(inputs))
        try:
            failed = _prepare_bursts(spec, workers, w, inputs, layout, stage.timeout)
            if failed is None:
                failed = _confirm_rounds(spec, workers, w, stage.timeout)
            if failed is None and not w.wrong and not w.eager:
                failed = _queued_rounds(spec, workers, w, inputs, layout, stage.timeout, launches)
        except witness.WitnessRefused as exc:
            return _flagged(stage.test, [Finding(Severity.CONCLUSIVE, str(exc))], {"timed_by": "replay"})
    if failed:
        _, reply = failed
        if "out of memory" in reply.message.lower():  # the bursts' memory beside other jobs' on the GPU: ours
            return stage.test("infra_error", f"not scored: the grader's clock bursts ran out of GPU memory "
                              f"({reply.message})", traceback=reply.traceback)
        return stage.test("error", f"student raised while timed by the grader's clock: {reply.message}",
                          traceback=reply.traceback)
    if w.wrong:
        return _flagged(stage.test, [Finding(Severity.CONCLUSIVE, "the results of your function's calls the grader "
                                             f"timed by its own clock are wrong: {w.wrong} (results reused, or not "
                                             "computed)")], {"timed_by": "replay"})
    return w


def _queued_rounds(spec: Assignment, workers: dict[str, WorkerProcess], w: witness.Witness, inputs: str,
                   layout: dict, timeout: float, launches: int) -> tuple[str, Failure] | None:
    """A CUDA graph replays the kernels its capture launched, so the function's own Python runs
    only at the capture (a function can ask torch whether it is being captured). Here it runs at
    every call, as an ordinary loop calls it: eager, never synchronized between calls, on fresh
    inputs, its samples checked every round (right only for its first calls is wrong here). One
    round ungated first (its brackets hold each contender's host work: the gate is sized from
    them), then EAGER_ROUNDS behind a gate (grader.worker.timing.Burst: the host work hidden
    while the GPU runs it); a round whose calls took longer to queue than the gate held the GPU
    is redone behind a longer one (confirmation.gate_outran, GATE_RETRIES). `checked_s`: the
    median round's brackets (confirmation.kept_round); `checked_host`: no round's host work was
    hidden, so the student's brackets may hold its host work."""
    started = time.monotonic()
    w.checked_calls = confirmation.queued_calls(launches)
    for c in ("student", "reference"):
        ready = workers[c].request(PrepareBurst(c, inputs, layout, w.checked_calls, witness.SAMPLES, graph=False,
                                                queued=True), timeout * 4)
        if isinstance(ready, Failure):
            if c != "student":
                raise WorkerFailure("infra_error", f"the reference's burst could not be prepared: {ready.message}", "")
            return c, ready
    w.prepare_s += time.monotonic() - started
    tol = spec.tolerance
    gate_ms = 0.0
    rounds: list[tuple[dict[str, float], bool]] = []  # each gated round's brackets, and whether its host work outran
    attempt = 0
    while sum(not outran for _, outran in rounds) < confirmation.EAGER_ROUNDS \
            and len(rounds) < confirmation.EAGER_ROUNDS + confirmation.GATE_RETRIES:
        seed, values, seconds, queued = witness.new_seed(), {}, {}, {}
        for c in (("student", "reference") if attempt % 2 == 0 else ("reference", "student")):
            w.note_load()
            reply, seconds[c] = witness.bracketed(workers[c], c, seed, timeout * 4, gate_ms=gate_ms)
            w.note_load()
            if isinstance(reply, Failure):
                if c != "student":
                    raise WorkerFailure("infra_error", f"the reference's burst failed: {reply.message}", "")
                return c, reply
            values[c], queued[c] = reply.values, reply.queued_ms
        w.wrong = w.wrong or witness.disagreement(values["student"], values["reference"], tol.atol[_dtype(spec)],
                                                  tol.rtol[_dtype(spec)], oracle=spec.truth is not None)
        attempt += 1
        if attempt == 1:  # ungated: what each contender's whole burst of host work (and GPU work) takes
            gate_ms = w.gate_ms = min(confirmation.GATE_MAX_MS, confirmation.GATE_FACTOR * max(seconds.values()) * 1e3)
            continue
        outran = confirmation.gate_outran(queued, gate_ms)
        rounds.append((seconds, outran))
        if outran and gate_ms < confirmation.GATE_MAX_MS:  # its host work was not all hidden: a longer gate next
            gate_ms = w.gate_ms = min(confirmation.GATE_MAX_MS, confirmation.GATE_FACTOR * max(queued.values()))
    w.checked_s, w.checked_host = confirmation.kept_round(rounds)
    return _let_go(workers, timeout)


def _let_go(workers: dict[str, WorkerProcess], timeout: float) -> tuple[str, Failure] | None:
    """Each contender's burst let go (its CUDA graph and memory) after its rounds, untimed and not
    run again: the freeing is no part of any bracket (it lengthened the last one by milliseconds
    on an H200)."""
    for c in ("student", "reference"):
        if workers[c].unasked():
            raise witness.WitnessRefused("the worker wrote a reply before it was asked")
        reply = workers[c].request(DropBurst(c), timeout * 4)
        if isinstance(reply, Failure):
            if c != "student":
                raise WorkerFailure("infra_error", f"the reference's burst failed: {reply.message}", "")
            return c, reply
    return None


def _confirm_rounds(spec: Assignment, workers: dict[str, WorkerProcess], w: witness.Witness,
                    timeout: float) -> tuple[str, Failure] | None:
    """The confirmation's bursts (prepared): each round one seed, both contenders, the order
    alternating; the last round lets each burst's graph and memory go."""
    tol = spec.tolerance
    for round_ in range(confirmation.BURST_ROUNDS):
        seed = witness.new_seed()
        values = {}
        for c in (("student", "reference") if round_ % 2 == 0 else ("reference", "student")):
            w.note_load()
            reply, seconds = witness.bracketed(workers[c], c, seed, timeout * 4)
            w.note_load()
            if isinstance(reply, Failure):
                if c != "student":
                    raise WorkerFailure("infra_error", f"the reference's burst failed: {reply.message}", "")
                return c, reply
            (w.student_s if c == "student" else w.reference_s).append(seconds)
            values[c] = reply.values
        if not w.wrong:
            w.wrong = witness.disagreement(values["student"], values["reference"], tol.atol[_dtype(spec)],
                                           tol.rtol[_dtype(spec)], oracle=spec.truth is not None)
    return None if w.wrong else _let_go(workers, timeout)


def _set_up_and_timed(stage: Stage, trusted: WorkerProcess, timed_files: list[str], layout: dict,
                      prepared: replay_stage.Prepared, placed: dict, kept: dict | None) -> TestResult | _Timed:
    """The student's worker stopped and the replays' inputs read (no lock held); then, within one
    of the GPU's set-up slots (at most two timing phases' buffers at once), the replays set up on
    the GPU (held shared), timed (`_replays_timed`) and their last results written. Returns what
    `_replays_timed` does."""
    stopped, prepared.student_pids = replay_stage.stop_student(stage.student)
    if stopped:
        _cancel(placed)
        return stage.test("infra_error", f"not scored: {stopped}")
    replay_stage.loaded(placed)
    stage.phase("replay_stop_worker")
    with stage.session.setup_slot():
        with stage.session.sharing_gpu():
            replay_stage.arm(placed)
        stage.phase("replay_set_up")
        try:
            timed = _replays_timed(stage, trusted, timed_files, layout, prepared, placed, kept)
            if not isinstance(timed, TestResult):
                replay_stage.settle(prepared, list(timed[2:]))
        except BaseException:
            _stop(placed)
            raise
        _stop(placed)
    return timed


def _replays_timed(stage: Stage, trusted: WorkerProcess, timed_files: list[str], layout: dict,
                   prepared: replay_stage.Prepared, pending: dict, kept: dict | None) -> TestResult | _Timed:
    """With the GPU held alone: torch's baseline in the trusted worker (which then stays, idle: it
    holds the truth the replays are compared with), then the replays told to go. Returns the
    timings, torch's median, and the reference's and the student's replays; or a TestResult."""
    ctx = stage.ctx
    order = ("student", "reference", "torch")
    t = Timings(times={c: [] for c in order}, event_ms={c: [] for c in order}, host_ms={c: [] for c in order})
    with stage.session.alone_on_gpu():
        stage.phase("waiting_for_gpu")
        stage.roofline = stage.roofline or _roofline(stage.session, trusted)
        # torch's baseline: three rounds, or one to anchor a kept reference figure (unless a spec scores
        # against the faster of the reference and torch, which needs torch's rounds as they are)
        anchor_only = kept is not None and getattr(stage.perf, "against", "reference") != "faster"
        for _ in range(1 if anchor_only else 3):  # nothing of the student's runs now
            reply = trusted.request(Time("torch", timed_files, layout, ctx.perf_reps), stage.timeout * 4)
            if isinstance(reply, Failure):
                return stage.test("infra_error", f"not scored: torch's baseline failed while timed: {reply.message}")
            reply = cast(TimeReply, reply)  # request(): the reply its request expects, or a Failure
            times, events, _ = call_times(reply)
            t.times["torch"].append(times)
            t.event_ms["torch"] += events
            t.host_ms["torch"].append(reply.host_ms)
            t.first_call_ms.setdefault("torch", reply.first_call_ms)
        stage.phase("torch_rounds")
        torch_ms = statistics.median(t.all("torch"))
        reference = None
        # the GPU as it was: the kept figure stands
        if kept and abs(torch_ms / kept["torch_ms"] - 1) <= replay_stage.DRIFT:
            reference = replay_process.Replayed(ms=kept["ms"], placements=kept["placements"], launches=kept["launches"])
        elif pending["reference"] is None:  # kept, but the GPU drifted since: timed again
            late = replay_stage.spawn(prepared.staging, "reference-again", stage.session.replay_process, stage.timeout)
            pending["reference"] = replay_stage.place(prepared, "reference", late)
        stage.busiest = max(stage.busiest, proctable.runnable() or 0)
        ref_run, student_run = replay_stage.go(pending, reference)
        stage.busiest = max(stage.busiest, proctable.runnable() or 0)
        stage.phase("replays")
    return t, torch_ms, ref_run, student_run


def _replay_verdict(stage: Stage, prepared: replay_stage.Prepared, r: replay_stage.Replays, t: Timings,
                    burst: witness.Witness) -> TestResult:
    """What the replay's decision makes of the speed (grader.judge.replay_process.decide), the figure
    confirmed by the grader's clock on the function's own calls (grader.judge.timing.confirmation)."""
    spec, ctx = stage.spec, stage.ctx
    replay = dataclasses.replace(replay_stage.describe(r), kept=replay_stage.keep(prepared, _store(ctx)),
                                 inputs=ReplayInputs(seed=ctx.performance_seed, set=0, case=stage.perf.case.name,
                                                     dtype=stage.perf.dtype))
    details: dict[str, Any] = {"timed_by": "replay", "replay": replay}
    replayed = r.decision
    if replayed.kind in ("fallback", "retry"):  # the worker is gone: nothing can time it another way now ("retry":
        # the replay could not be set up, or the student's processes on the GPU after they were found gone)
        return stage.test("infra_error", f"not scored: {replayed.message}", details=details)
    if replayed.kind in ("review", "conclusive"):
        severity = Severity.CONCLUSIVE if replayed.kind == "conclusive" and not prepared.torch_work else Severity.REVIEW
        text = replayed.message
        if prepared.torch_work and replayed.kind == "conclusive":
            text = ("your function did part of the work in torch, which is not your kernels' and is not replayed "
                    f"({'; '.join(prepared.torch_work[:3])}): launched again on the grader's own buffers, your Triton "
                    f"kernels alone give wrong results: {r.wrong}")
        return _flagged(stage.test, [Finding(severity, text)], details)
    student_ms, reference_ms = r.student.median_ms, r.reference.median_ms
    assert student_ms is not None and reference_ms is not None  # scored: both replays have their times
    busiest = max(burst.busiest, stage.busiest)  # the student's worker is gone by the replays: none of theirs there
    evidence = timing_evidence(burst, student_ms, reference_ms, r.student.launches, busiest,
                               busiest - max(burst.others, stage.busiest), os.cpu_count() or 1,
                               r.student.placements + r.reference.placements, prepared.streams)
    found = decision.verdict(evidence)
    eager_ms = next((f.ms for f in evidence.figures if f.source != evidence.figures[0].source), None)
    details["confirmation"] = confirmed = {
        "verdict": found.outcome, "clock_ms": round(found.clock_ms, 5), "replay_ms": round(student_ms, 5),
        "scored_ms": round(found.scored_ms, 5), "scored_from": found.scored_from,
        "ratio": round(found.ratio, 4), "calls": burst.calls, "graph": not burst.eager,
        "figures": [{"source": f.source, "ms": round(f.ms, 5), "calls": f.calls, "host_work": f.host_work}
                    for f in evidence.figures],
        "eager_ms": round(eager_ms, 5) if eager_ms is not None else None, "eager_calls": burst.checked_calls,
        "gate_ms": round(burst.gate_ms, 3),
        "eager_brackets_ms": {c: round(x * 1e3, 3) for c, x in burst.checked_s.items()},
        "cost_s": round(burst.cost_s(), 3), "prepare_s": round(burst.prepare_s, 3),
        "brackets_ms": {"student": [round(x * 1e3, 3) for x in burst.student_s],
                        "reference": [round(x * 1e3, 3) for x in burst.reference_s]},
        "busiest": evidence.busiest, "own_threads": evidence.own_threads}
    if found.outcome == "unsteady":  # no finding: what the clock would have said on a steady host, for the TA
        confirmed["unsteady"] = found.unsteady
    if found.set_aside:
        confirmed["set_aside"] = list(found.set_aside)
    if found.conclusive:
        return _flagged(stage.test, [Finding(Severity.CONCLUSIVE, found.message)], details)
    for c, run in (("student", r.student), ("reference", r.reference)):
        t.times[c] = run.placements
        t.event_ms[c] = list(run.ms)
    if found.scored_ms > student_ms > 0:  # the function's calls are slower than its kernels: scored on the slower
        t.times["student"] = [[x * found.scored_ms / student_ms for x in p] for p in t.times["student"]]
    assert stage.roofline is not None  # measured before the replays were timed
    verdict = _verdict(spec, stage.roofline, t, len(r.student.placements), [], True, stage.test)
    payload = verdict.details
    assert isinstance(payload, PerformancePayload)  # test() makes a performance result
    payload.timed_by, payload.replay, payload.roofline = "replay", replay, Ceilings.from_json(stage.roofline)
    payload.confirmation = confirmed
    if found.held and verdict.outcome == Outcome.PASSED:
        _hold(verdict, payload, found.message,
              confirmation.unconfirmed(found.message, payload.ratio_to_reference or 0.0, payload.score_fraction or 0.0))
    elif found.message and verdict.outcome in (Outcome.PASSED, Outcome.FAILED):
        verdict.message += f"; {found.message}"
    if prepared.streams > 1 and verdict.outcome in (Outcome.PASSED, Outcome.FAILED):
        verdict.message += (f"; your launches on {prepared.streams} streams were replayed one after another on one "
                            "stream, so any overlap between them is not counted")
    _why_slow(verdict, payload, prepared.compiled, ctx)
    return verdict


def timing_evidence(burst: witness.Witness, student_ms: float, reference_ms: float, launches: int, busiest: int,
                    own_threads: int, cpus: int, placements: list[list[float]], streams: int = 1) -> decision.Evidence:
    """Every measurement of the function's own calls, for grader.judge.timing.decision: the
    graph's (or a function that cannot be captured: the eager) burst, the median of its rounds;
    the queued burst, its median round (confirmation.kept_round); each by the grader's clock.
    `streams`: the streams the record's launches were on (replayed one after another)."""
    first = decision.EAGER if burst.eager else decision.GRAPH
    figures = [decision.Figure(first, statistics.median(confirmation.clock_ms(burst.student_s, burst.reference_s,
                                                                              burst.calls, reference_ms)),
                               burst.calls, host_work=bool(burst.eager))] if burst.student_s else []
    if len(burst.checked_s) == 2:
        figures.append(decision.Figure(decision.QUEUED, confirmation.clock_ms(
            [burst.checked_s["student"]], [burst.checked_s["reference"]], burst.checked_calls, reference_ms)[0],
            burst.checked_calls, host_work=burst.checked_host))
    return decision.Evidence(student_ms, launches, tuple(figures), capturable=not burst.eager, why_eager=burst.eager,
                             busiest=busiest, own_threads=own_threads, cpus=cpus,
                             placements=tuple(tuple(p) for p in placements), streams=streams)


def _store(ctx: GradingContext) -> Path | None:
    if not ctx.replay_store:
        return None
    store = Path(ctx.replay_store)
    store.mkdir(parents=True, exist_ok=True)
    return store


def _flagged(test: Callable[..., TestResult], findings: list[Finding], details: dict) -> TestResult:
    worst = Severity.CONCLUSIVE if any(f.severity == Severity.CONCLUSIVE for f in findings) else Severity.REVIEW
    details = {**details, "evidence": [f.text for f in findings],
               "findings": [f.note() for f in findings]}
    return test("flagged", "no speed credit: " + "; ".join(f.text for f in findings), details=details,
                severity=worst.value)


def _why_slow(verdict: TestResult, details: PerformancePayload, compiled: dict, ctx: GradingContext) -> None:
    """A correct but slow kernel is told why, in its own terms (grader.judge.slowness)."""
    if not compiled:
        return
    details.compiled = {name: dataclasses.asdict(k) for name, k in compiled.items()}
    student = (details.figures or {}).get("student")
    pct = student.roofline_pct if student is not None else None
    if verdict.outcome not in (Outcome.PASSED, Outcome.FAILED) or pct is None:
        return
    why = slowness.why_slow(details.compiled, slowness.gpu_sms(ctx.gpu), details.roofline_kind or "", pct / 100)
    if why:
        details.why_slow = why
        verdict.message += " " + slowness.words(why)


def parallel_sets(count: int, set_bytes: int) -> int:
    """How many input sets to make at once: one per core, each needing about three times its
    size in memory while made and written, within half of the memory free now."""
    try:
        free = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError):
        free = 0
    return max(1, min(count, os.cpu_count() or 1, free // 2 // max(1, 3 * set_bytes)))


def _conduct(t: Timings, timed_calls: int) -> list[Finding]:
    """What the timed loop itself shows about the student's calls."""
    findings = []
    if t.tampered:
        findings.append(Finding(Severity.CONCLUSIVE,
                                f"the timing functions were replaced during the run: {', '.join(sorted(t.tampered))}"))
    if t.unfinished:
        findings.append(Finding(Severity.REVIEW, "your function returned before its GPU work was done: "
                                f"{t.unfinished[0]}"
                                f"{f' (and {len(t.unfinished) - 1} more calls)' if len(t.unfinished) > 1 else ''}; "
                                "a caller would read an unfinished result (make the caller's stream wait for yours: "
                                "torch.cuda.current_stream().wait_stream(s))"))
    if t.strays:
        findings.append(Finding(Severity.REVIEW, f"GPU work ran while none of your calls was running: {t.strays[0]}"
                                + (f" (and {len(t.strays) - 1} more)" if len(t.strays) > 1 else "")))
    if t.launches["student"] < timed_calls:
        findings.append(Finding(Severity.REVIEW, f"only {t.launches['student']} Triton kernel launches "
                                f"in {timed_calls} timed calls: the timed work did not run in your kernel"))
    return findings


def _timed_rounds(ctx: GradingContext, spec: Assignment, workers: dict[str, WorkerProcess], order: list[str],
                  t: Timings,
                  timed_files: list[str], layout: dict, timeout: float,
                  has_reference: bool) -> tuple[int, tuple[str, Failure] | None]:
    """Rounds of student, reference, torch, until the ratio's interval is tight and clear of
    the scoring thresholds (or the budget is spent). Returns the rounds run, and the
    contender and reply of a call that raised."""
    perf = spec.performance
    assert perf is not None  # timed only for an assignment with a performance case
    budget_end = time.monotonic() + ctx.perf_budget_s
    scored = "host_ms" if perf.score_on == "wall" else "times"
    rounds = 0
    while True:
        for c in order:  # interleaved: student, reference, torch, student, ...
            reply = workers[c].request(Time(c, timed_files, layout, ctx.perf_reps), timeout * 4)
            if isinstance(reply, Failure):
                return rounds, (c, reply)
            reply = cast(TimeReply, reply)  # request(): the reply its request expects, or a Failure
            times, events, reading = call_times(reply)
            t.times[c].append(times)
            t.event_ms[c] += events
            t.host_ms[c].append(reply.host_ms)
            t.first_call_ms.setdefault(c, reply.first_call_ms)
            t.launches[c] = t.launches.get(c, 0) + reply.launches
            if c == "student":
                t.tampered.update(reply.tampered)
                t.unfinished += reading.unfinished
                t.strays += reading.strays
            if c == "torch":
                t.output_numel = reply.output_numel
        if has_reference and perf.score_on == "gpu" and rounds < witness.ROUNDS:
            failed = _bursts(spec, workers, t, timed_files[0], layout, timeout, rounds)
            if failed:
                return rounds, failed
        rounds += 1
        reference = yardstick(perf, getattr(t, scored)) if has_reference else None
        if not needs_more_rounds(rounds, getattr(t, scored)["student"], reference, perf.full_at, perf.zero_at,
                                 time.monotonic() > budget_end):
            return rounds, None


def _warm_bursts(stage: Stage, workers: dict[str, WorkerProcess], inputs: str) -> None:
    """The grader's clock's own kernel compiled in both workers before the exclusive hold
    (protocol.WarmBurst: the input set's dtypes, no input loaded), the GPU held shared: its first
    launch in a process costs seconds. A worker that fails it fails its burst's preparation
    later, which says why."""
    dtypes = floating_dtypes(inputs)
    for c in ("student", "reference"):
        with stage.session.sharing_gpu():
            workers[c].request(WarmBurst(dtypes), stage.timeout * 2)


def _prepare_bursts(spec: Assignment, workers: dict[str, WorkerProcess], w: witness.Witness, inputs: str, layout: dict,
                    timeout: float) -> tuple[str, Failure] | None:
    """Both bursts prepared at once (each worker compiles and captures its own), `w.calls` long.
    Where the student's cannot be a CUDA graph, the reference's is prepared again as its mirror:
    eager, synchronized after each call."""
    for c in ("student", "reference"):
        if workers[c].unasked():
            raise witness.WitnessRefused("the worker wrote a reply before it was asked")

    def prepare(c: str, graph: bool = True) -> Reply | Failure:
        return workers[c].request(PrepareBurst(c, inputs, layout, w.calls, witness.SAMPLES, graph=graph), timeout * 4)

    started = time.monotonic()
    with ThreadPoolExecutor(max_workers=2) as pool:
        student, reference = pool.map(prepare, ("student", "reference"))
    if isinstance(student, Failure):
        return "student", student
    student = cast(BurstReady, student)  # request(): the reply its request expects, or a Failure
    if student.eager:
        w.eager = sanitize.one_line(student.eager, 300)  # the worker's words: bounded here, whatever it sent
        reference = prepare("reference", graph=False)
    if isinstance(reference, Failure):
        raise WorkerFailure("infra_error", f"the reference's burst could not be prepared: {reference.message}", "")
    w.prepare_s = time.monotonic() - started
    return None


def _bursts(spec: Assignment, workers: dict[str, WorkerProcess], t: Timings, inputs: str, layout: dict, timeout: float,
            round_: int) -> tuple[str, Failure] | None:
    """This round's bursts by the grader's own clock (grader.judge.witness): the student's and the
    reference's on inputs drawn from one new seed, in alternating order (neither always goes
    first). The first round prepares them, `calls` long by the reference's time in it."""
    w = t.witness
    if round_ == 0:  # `calls` long by the reference's time in the first round
        size = DTYPES[_dtype(spec)].itemsize
        w.calls = witness.burst_calls(statistics.median(t.times["reference"][0]),
                                      t.output_numel * size if t.output_numel else os.path.getsize(inputs))
        failed = _prepare_bursts(spec, workers, w, inputs, layout, timeout)
        if failed:
            return failed
    seed = witness.new_seed()
    values = {}
    # the calls are set by the reference's time: a kernel far slower than it takes as many times longer
    patience = max(timeout * 2, 4 * w.calls * statistics.median(t.times["student"][round_]) / 1e3)
    for c in (("student", "reference") if round_ % 2 == 0 else ("reference", "student")):
        w.note_load()
        reply, seconds = witness.bracketed(workers[c], c, seed, patience, last=round_ == witness.ROUNDS - 1)
        w.note_load()
        if isinstance(reply, Failure):
            if c != "student":
                raise WorkerFailure("infra_error", f"the reference's burst failed: {reply.message}", "")
            return c, reply
        (w.student_s if c == "student" else w.reference_s).append(seconds)
        values[c] = reply.values
    if not w.wrong:
        tol = spec.tolerance
        w.wrong = witness.disagreement(values["student"], values["reference"], tol.atol[_dtype(spec)],
                                       tol.rtol[_dtype(spec)], oracle=spec.truth is not None)
    return None


def _witnessed(t: Timings, findings: list[Finding]) -> Witnessed | None:
    """What the grader's own clock says of the student's figures (grader.judge.witness): a finding
    where they contradict it, and where it shows them too short the student's rounds scaled to
    it (the score then comes from the grader's clock). Returns the details to record."""
    w = t.witness
    if not w.calls or not w.student_s:
        return None
    if w.wrong and t.unfinished:  # the same fault the timed loop saw: a caller reads results not yet computed
        findings.append(Finding(Severity.REVIEW, "the results of the calls the grader timed by its own clock "
                                f"are wrong: {w.wrong}, as a caller reads them when a call returns "
                                "before its work is done"))
    elif w.wrong:
        findings.append(Finding(Severity.CONCLUSIVE, "the results of the calls the grader timed by its own clock "
                                f"are wrong: {w.wrong} (results reused, or not computed)"))
    worker_ms = [statistics.median(r) for r in t.times["student"]]
    host = [h for r in t.host_ms["student"] for h in r]
    c = witness.confirm(w, worker_ms, [statistics.median(r) for r in t.times["reference"]],
                        statistics.median(host) if host else None)
    details = Witnessed(calls=w.calls, cost_s=round(w.cost_s(), 3), prepare_s=round(w.prepare_s, 3),
                        agreement=c.agreement, confirmed=c.confirmed, graph=not w.eager,
                        student_ms=[round(x, 5) for x in c.student_ms], worker_ms=[round(x, 5) for x in worker_ms],
                        brackets_ms={"student": [round(x * 1e3, 3) for x in w.student_s],
                                     "reference": [round(x * 1e3, 3) for x in w.reference_s]},
                        eager=w.eager or None)
    # an accusation needs steady measurements (grader.judge.timing.decision.unsteady): on a busy host the grader's
    # brackets hold the scheduler's queue, and the worker's figures look short beside them
    unsteady = decision.unsteady(decision.Evidence(0.0, 0, (), busiest=w.busiest, own_threads=w.busiest - w.others,
                                                   cpus=os.cpu_count() or 1)) if c.tampered else ""
    if c.tampered and not unsteady:
        findings.append(Finding(Severity.CONCLUSIVE, c.tampered))
    elif not c.confirmed:  # every round scaled to the grader's clock, by how far it disagreed in its own rounds
        t.times["student"] = [[x * c.agreement for x in r] for r in t.times["student"]]
        details.note = c.note if not unsteady else (
            f"scored on the grader's own clock, no accusation ({unsteady}): "
            f"{c.tampered.rsplit(': the timing was', 1)[0]}")
    return details


def _check_outputs(spec: Assignment, ctx: GradingContext, workers: dict[str, WorkerProcess], contenders: dict[str,
                   Contender],
                   layout: dict, timed_files: list[str], fresh_file: Path, workdir: Path, timeout: float, numel: int,
                   compiled: dict | None = None) -> list[Finding]:
    """Sample the outputs of the last timed call on each set, and of an untimed call on a
    fresh set, at indices drawn now; compare them with torch's. Also record the aten ops of
    that fresh call (a vendor op used only at large sizes shows here) and, in `compiled`, what
    the compiler made of the student's kernels."""
    evidence = []
    keys = [f"set{i}" for i in range(len(timed_files))] + ["fresh"]
    for c, w in workers.items():
        if c == "student" or c in contenders:
            with shown_to_worker(fresh_file, workdir, link=c != "student" or worker_cannot_write(w.isolation)) as shown:
                reply = w.request(Call(c, str(shown), layout, "fresh", record_ops=c == "student"), timeout * 2)
            if isinstance(reply, Failure):
                if c != "student":
                    raise WorkerFailure("infra_error",
                                        f"the {c} failed on a fresh input set after timing: {reply.message}", "")
                return [Finding(Severity.REVIEW,
                                f"your function failed on a fresh input set after timing: {reply.message}")]
            reply = cast(CallReply, reply)  # request(): the reply its request expects, or a Failure
            if c == "student":
                if compiled is not None:
                    compiled.update(reply.kernels)
                forbidden = sorted(set(reply.ops) & spec.forbidden_ops)
                if forbidden:
                    evidence.append(Finding(Severity.CONCLUSIVE, "torch computed the result at the timing size: "
                                            f"{', '.join(forbidden)} ran inside {spec.function}()"))
    idx_file = workdir / "perf" / "indices.safetensors"
    rng = torch.Generator().manual_seed(derive_seed(ctx.seed, "sample", str(time.time_ns())))
    save_file({"idx": torch.randint(0, numel, (min(SAMPLE_SIZE, numel),), generator=rng)}, str(idx_file))
    os.chmod(idx_file, 0o644)
    samples = {}
    for c in ("student", "reference", "torch"):
        if c != "student" and c not in contenders:
            continue
        out = output_path(workdir, f"sample-{c}.safetensors")
        reply = workers[c].request(Sample(c, keys, str(idx_file), str(out)), timeout)
        if isinstance(reply, Failure):
            if c != "student":
                raise WorkerFailure("infra_error", f"the {c}'s timed outputs could not be sampled: {reply.message}", "")
            return evidence + [Finding(Severity.CONCLUSIVE,
                                       f"the outputs of your timed calls could not be sampled: {reply.message}")]
        try:
            samples[c] = load(read_worker_file(out))
        except Exception as exc:  # noqa: BLE001 - whatever the worker left there, it is not a sample
            if c != "student":
                raise WorkerFailure("infra_error", f"the {c}'s sample file could not be read ({exc})", "") from None
            return evidence + [Finding(Severity.CONCLUSIVE,
                                       f"the sample of your timed outputs could not be read ({exc})")]
    base = samples["torch"]
    yardstick = samples.get("reference", base)
    tol = spec.tolerance
    dtype = _dtype(spec)
    for key in keys:
        t_ = base[key].to(torch.float64)
        # how far a correct kernel strays from torch
        normal = (yardstick[key].to(torch.float64) - t_).abs().max().item()
        allowed = 2 * normal + tol.atol[dtype] + tol.rtol[dtype] * t_.abs() + 1e-2 * t_.abs()
        dev = (samples["student"][key].to(torch.float64) - t_).abs()
        wrong = ~(dev <= allowed)
        if wrong.any():
            what = "a fresh input set after the timing" if key == "fresh" else f"input set {key[3:]} in the timed loop"
            evidence.append(Finding(Severity.CONCLUSIVE, f"wrong results on {what}: {int(wrong.sum())} "
                                    f"of {wrong.numel()} sampled elements "
                                    "(outputs cached or replayed, or right only for the first calls)"))
    return evidence


def _verdict(spec: Assignment, roofline: dict, t: Timings, rounds: int, findings: list[Finding], has_reference: bool,
             test: Callable[..., TestResult]) -> TestResult:
    perf = spec.performance
    assert perf is not None  # timed only for an assignment with a performance case
    dt = DTYPES[perf.dtype]
    nbytes = perf.bytes_moved(perf.case.params, dt)
    flops = perf.flops(perf.case.params, dt) if perf.flops else None
    peak = roofline.get("gemm_tflops", {}).get(perf.dtype)
    floor, bound = floor_ms(nbytes, flops, roofline["copy_gbps"], peak)
    figures: dict[str, Figures] = {}
    for c in t.times:
        ts = t.all(c)
        median = statistics.median(ts)
        q = statistics.quantiles(ts, n=4)
        host = [h for r in t.host_ms[c] for h in r]
        f = Figures(median_ms=round(median, 5), q1_ms=round(q[0], 5), q3_ms=round(q[2], 5),
                    event_median_ms=round(statistics.median(t.event_ms[c]), 5),
                    host_median_ms=round(statistics.median(host), 5) if host else None,
                    gbps=round(nbytes / (median * 1e-3) / 1e9, 1) if median > 0 else None,  # 0: no GPU work at all
                    roofline_pct=round(100 * floor / median, 1) if median > 0 else None,
                    first_call_ms=round(t.first_call_ms[c], 2) if c in t.first_call_ms else None)
        if flops:
            f.tflops = round(flops / (median * 1e-3) / 1e12, 1) if median > 0 else None
        figures[c] = f
    student = figures["student"]
    assert student.median_ms is not None  # every contender's figures have their median (above)
    if student.median_ms < floor / (1 + ROOFLINE_MARGIN):
        ceiling = (f"{flops:.3g} FLOPs at the measured {bound} ({peak} TFLOP/s)" if bound == "cuBLAS GEMM peak"
                   else f"{nbytes:.3g} bytes at the measured {bound} ({roofline['copy_gbps']:.0f} GB/s)")
        findings.append(Finding(Severity.REVIEW, f"faster than this GPU can go: {student.median_ms:.4f} ms per call, "
                                f"where {ceiling} take at least {floor:.4f} ms (a {ROOFLINE_MARGIN:.0%} margin "
                                "allowed): the timing missed work"))
    details = PerformancePayload(figures=figures, bytes=nbytes, copy_gbps=roofline["copy_gbps"], gpu=roofline["gpu"],
                                 rounds=rounds, samples=len(t.all("student")), score_on=perf.score_on,
                                 floor_ms=round(floor, 5), roofline_kind=bound, evidence=[f.text for f in findings],
                                 findings=[f.note() for f in findings])
    if flops:
        details.flops, details.gemm_tflops = flops, peak
    torch_ms = figures["torch"].median_ms
    assert torch_ms is not None  # every contender's figures have their median (above)
    vs_torch = student.median_ms / torch_ms
    details.ratio_to_torch = round(vs_torch, 3)
    host_clock = (f"; {student.host_median_ms:.3f} ms per call by the host's clock"
                  if student.host_median_ms is not None else "")
    if student.median_ms > 0:
        compute_bound = bound == "cuBLAS GEMM peak"
        rate = f"{student.tflops:.0f} TFLOP/s" if compute_bound else f"{student.gbps:.0f} GB/s"
        rate += f" ({student.roofline_pct:.0f}% of what the measured {bound} allows)"
    else:
        rate = "no GPU work recorded"
    summary = f"{student.median_ms:.4f} ms per call on the GPU{host_clock}; {rate}; {vs_torch:.2f}x torch's time"
    if findings:
        worst = Severity.CONCLUSIVE if any(f.severity == Severity.CONCLUSIVE for f in findings) else Severity.REVIEW
        return test("flagged", "no speed credit: " + "; ".join(f.text for f in findings), details=details,
                    severity=worst.value)
    if not has_reference:
        return test("skipped", summary + "; the reference kernel is not part of this install, "
                    "so no points are computed here", details=details)
    reference_ms = figures["reference"].median_ms
    assert reference_ms is not None  # every contender's figures have their median (above)
    if reference_ms < MIN_SCORED_MS:
        return test("infra_error", f"the scoring size is launch-bound ({reference_ms:.3f} ms): "
                    "not scored", details=details)
    scored = t.host_ms if perf.score_on == "wall" else t.times
    against = yardstick(perf, scored)
    assert against is not None  # None only without a reference, which returned above
    ratio, lo, hi = ratio_estimate(scored["student"], against)
    fraction = perf.score_fraction(ratio)
    details.ratio_to_reference, details.ratio_interval = round(ratio, 4), [round(lo, 4), round(hi, 4)]
    details.score_fraction = round(fraction, 3)
    clock = "time per call by the host's clock" if perf.score_on == "wall" else "GPU time"
    whose = "the reference kernel's"
    if getattr(perf, "against", "reference") == "faster":
        vendor_rounds = sum(a is v for a, v in zip(against, scored["torch"]))
        details.scored_against, details.rounds_vendor_faster = "faster", vendor_rounds
        whose = ("the faster of the reference kernel's and torch's (torch in "
                 f"{vendor_rounds} of {len(against)} rounds)")
    message = (f"{ratio:.3f}x {whose} {clock} (95% interval {lo:.3f}-{hi:.3f}, {rounds} rounds): "
               f"{fraction:.0%} of the points (full at <= {perf.full_at}x, none at >= {perf.zero_at}x); {summary}")
    return test("passed" if fraction > 0 else "failed", message, details=details)
