"""The performance stage's scored path: the student's compiled kernels timed by replay
(grader.replay), with no code of the student's running anywhere while anything is timed.

`spawn`, before the records exist: each replay process started, its imports overlapping the
recorded calls. `prepare`, while the student's worker is alive: two recorded calls at the scoring
shape (the launches of each, grader.worker.launches; the first also its aten ops, for a vendor op
at this size, and its compiled kernels, for why a kernel is slow) on two of the timing's input
sets; the trusted worker makes the same call with torch (the truth) and with the reference (how
far a correct kernel strays from torch), recording the reference's launches too. The student's
result at this size is checked at the judge's indices (grader.judge.picks: only those elements
cross a process), and both records are checked and compared (grader.judge.replay_process). A
record that cannot be replayed leaves the timing to the fallback (grader.judge.perf's rounds, the
witness on the grader's own clock), the worker still alive to be timed. `place`: each checked
record and the input set handed to its started replay process.

`stop_student`: the worker and every process it started gone, checked by the process table and
the driver's list of GPU processes.

`loaded` (no lock held) and `arm` (the GPU held shared, within a set-up slot): each replay's
inputs read and set up on the GPU, waiting to be told to go. `go`, with the GPU held alone: the
reference's and the student's records replayed, each in its own process over several placements
of their buffers; nothing else happens in the hold. `settle`, after it: the judge's indices drawn
and told to each replay, which hands back its last result's elements there. `judge`: those
compared with the truth, and the decision made (`replay_process.decide`). The reference's figure
is kept for the run (`reference_key`): later jobs on the same GPU and input set reuse it while
torch's time, measured in every job, stays within DRIFT of what it was when the figure was kept.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, ContextManager, cast

import torch

from grader import proctable
from grader.codec import floating_dtypes, write_tensors
from grader.judge import picks, replay_process
from grader.judge.context import GradingContext
from grader.judge.replay_process import Decision, Replayed, ReplayFactory, ReplayProcess
from grader.judge.workers import StudentWorker
from grader.payloads import ReplayDetails, ReplaySide
from grader.protocol import Call, CallReply, Compare, CompareReply, Failure, Reply, Request, Sample, WarmBurst
from grader.replay.launchrecord import LaunchRecordError
from grader.results import Severity
from grader.sandbox.files import output_path, shown_to_worker, worker_cannot_write
from grader.sandbox.process import WorkerFailure, WorkerProcess
from grader.sanitize import one_line
from grader.settings import Settings
from grader.spec import Assignment

# fresh buffers at other addresses: a kernel's time varies with where its data lies (docs/performance.md)
PLACEMENTS = 4
REPS = 40  # per contender, spread over the placements


@dataclass
class Prepared:
    """What the replay needs, made while the student's worker was alive."""

    staging: Path  # the checked copies: student/, reference/ (records), inputs.safetensors, layout.json
    inputs: Path
    layout: Path
    trusted: WorkerProcess  # the trusted worker: it keeps torch's result (the truth, "truth") and the reference's
    # ("rec0"), and compares every result taken back with them (protocol.Compare)
    torch_work: list[str] = field(default_factory=list)  # what the student's call did in torch (not replayed)
    compiled: dict = field(default_factory=dict)  # the student's compiled kernels (grader.judge.slowness)
    student_pids: set[int] = field(default_factory=set)
    numel: int = 0  # the truth's elements: what the judge's indices are drawn from (grader.judge.picks)
    picks: Path | None = None  # the judge's indices the replays were told (`settle`)
    launches: int = 1  # the student's recorded launches per call (sizes the queued burst: timing.confirmation)
    streams: int = 1  # the streams they were launched on (replayed one after another on one stream)


@dataclass
class Prepare:
    """`prepare`'s answer: a Prepared, or findings that end the stage, or why the fallback times it."""

    prepared: Prepared | None = None
    findings: list[tuple[Severity, str]] = field(default_factory=list)
    fallback: str = ""
    error: str = ""  # ours: the stage cannot go on (infra_error)


def wrong_against_truth(got: torch.Tensor, truth: torch.Tensor, reference: torch.Tensor, atol: float,
                        rtol: float) -> str:
    """'' when every element of `got` is as close to torch's as the error model allows (the
    spec's tolerance, twice how far the reference kernel strays from torch, 1% of the value:
    as the trusted worker's `Compare` on the GPU), else the evidence in words. On the host, for
    `grader verify`, which holds the results itself."""
    if got.numel() != truth.numel():
        return f"{got.numel()} elements where {truth.numel()} are expected"
    step = 1 << 24
    normal = 0.0
    for i in range(0, truth.numel(), step):
        t, r = truth[i:i + step].float(), reference[i:i + step].float()
        d = (r - t).abs()
        d = d[~torch.isnan(d)]
        normal = max(normal, float(d.max()) if d.numel() else 0.0)
    count = 0
    first: tuple[int, float, float] | None = None
    for i in range(0, truth.numel(), step):
        t, g = truth[i:i + step].float(), got[i:i + step].float()
        allowed = 2 * normal + atol + rtol * t.abs() + 1e-2 * t.abs()
        bad = ~((g - t).abs() <= allowed) & ~(torch.isnan(g) & torch.isnan(t))
        n = int(bad.sum())
        if n and first is None:
            j = int(bad.nonzero()[0])
            first = (i + j, float(g[j]), float(t[j]))
        count += n
    if not count:
        return ""
    assert first is not None  # set at the first wrong element
    return (f"{count} of {truth.numel()} elements are wrong (the first at flat index {first[0]}: {first[1]:.6g} "
            f"where {first[2]:.6g} is expected)")


def prepare(spec: Assignment, student: StudentWorker, trusted: WorkerProcess, timed_files: list[str], layout: dict,
            workdir: Path, staging: Path,
            timeout: float) -> Prepare:
    """Record, take back and check, with the student's worker alive (see the module's docstring).
    The trusted worker's calls (torch's truth, the reference's record) run beside the student's
    recorded calls: neither is timed, and they are each other's only company on the GPU."""
    perf = spec.performance
    assert perf is not None  # the replay runs only for an assignment with a performance case
    ref_folder = workdir.parent / f"{spec.name}.trusted-record"
    dtypes = floating_dtypes(timed_files[0])  # what the grader's clock's kernel is compiled for, in both workers
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="trusted-calls") as pool:
        ours = pool.submit(_trusted_calls, student, trusted, timed_files[0], layout, ref_folder, dtypes, timeout)
        rec = [f"replay-record-{i}" for i in range(2)]
        replies = []
        for i in range(2):
            folder = output_path(workdir, rec[i])  # a new folder in the worker's outputs/: the worker makes it
            with student.sharing_gpu():
                reply = student.request(Call("student", timed_files[i], layout, f"rec{i}", record_ops=i == 0,
                                             record_launches=str(folder), warm=i == 0, keep_inputs=True), timeout * 2)
            if isinstance(reply, Failure):
                return Prepare(fallback="your function failed when its launches were recorded: "
                                        f"{one_line(reply.message, 200)}")
            reply = cast(CallReply, reply)  # request(): the reply its request expects, or a Failure
            replies.append(reply)
        with student.sharing_gpu():  # the grader's clock's own kernel compiled now, not inside its exclusive hold
            student.request(WarmBurst(dtypes), timeout * 2)  # failing, its burst says why
        forbidden = sorted(set(replies[0].ops) & spec.forbidden_ops)
        if forbidden:
            return Prepare(findings=[(Severity.CONCLUSIVE, "torch computed the result at the timing size: "
                                      f"{', '.join(forbidden)} ran inside {spec.function}()")])
        error, numel = ours.result()
    if error:
        return Prepare(error=error)
    found = _student_result(spec, student, trusted, workdir, staging, numel, timeout)
    if found is not None:
        return found
    linkable = student.process is not None and worker_cannot_write(student.process.isolation)
    checked = _checked(spec, timed_files, layout, workdir, staging, rec, ref_folder, trusted, replies[0], linkable)
    if checked.prepared is not None:
        checked.prepared.numel = numel
    return checked


def _trusted_calls(student: StudentWorker, trusted: WorkerProcess, inputs: str, layout: dict, ref_folder: Path,
                   dtypes: list[str], timeout: float) -> tuple[str, int]:
    """Torch's call at the timing size (the truth) and the reference's (recorded), kept by the
    trusted worker, then the grader's clock's kernel compiled for `dtypes`: ('' or why they
    failed (ours), the truth's elements)."""
    shutil.rmtree(ref_folder, ignore_errors=True)
    numel = 0
    for c, key, launches in (("torch", "truth", ""), ("reference", "rec0", str(ref_folder))):
        with student.sharing_gpu():  # the trusted worker's calls as the student's: never inside another job's timing
            reply = _ask(trusted, Call(c, inputs, layout, key, record_launches=launches, keep_inputs=True),
                         timeout * 2)
        if isinstance(reply, Failure):
            return f"the {c} failed at the timing size: {one_line(reply.message, 200)}", 0
        if c == "torch":
            numel = cast(CallReply, reply).numel
            if numel <= 0:
                return "torch's result at the timing size is not one tensor", 0
    with student.sharing_gpu():  # the grader's clock's own kernel compiled before its exclusive hold, as the student's
        _ask(trusted, WarmBurst(dtypes), timeout * 2)  # failing, the reference's burst says why
    return "", numel


def _drawn(numel: int, ours: Path) -> Path:
    """The judge's indices into a result of `numel` elements (grader.judge.picks), drawn afresh and
    written to `ours` (the judge's private copy, which the trusted worker reads); returns it."""
    ours.parent.mkdir(parents=True, exist_ok=True)
    ours.unlink(missing_ok=True)
    write_tensors({"idx": picks.picks(numel)}, ours)
    os.chmod(ours, 0o644)
    return ours


def _student_result(spec: Assignment, student: StudentWorker, trusted: WorkerProcess, workdir: Path, staging: Path,
                    numel: int, timeout: float) -> Prepare | None:
    """The student's result at the timing size, at the judge's indices drawn now (its worker is
    shown a copy of them for this request alone, grader.sandbox.files.shown_to_worker; the
    trusted worker reads the judge's own, out of the worker's reach), checked by the trusted
    worker against torch's: None when it is right, else what ends the stage."""
    perf = spec.performance
    assert perf is not None  # the replay runs only for an assignment with a performance case
    ours = _drawn(numel, staging / "picks-student.safetensors")
    sample = output_path(workdir, "replay-student.safetensors")
    with shown_to_worker(ours, workdir) as shown:
        reply = student.request(Sample("student", ["rec0"], str(shown), str(sample)), timeout)
    if isinstance(reply, Failure):
        return Prepare(findings=[(Severity.CONCLUSIVE,
                                  "your function's result at the timing size could not be taken back: "
                                  f"{one_line(reply.message, 200)}")])
    tol = spec.tolerance
    with student.sharing_gpu():
        got = _ask(trusted, Compare(str(sample), "rec0", 0, TRUTH, REFERENCE, tol.atol[perf.dtype],
                                    tol.rtol[perf.dtype], indices=str(ours)), timeout * 2)
    if isinstance(got, Failure) and got.kind == "infra_error":
        return Prepare(error=got.message)
    got = cast("CompareReply | Failure", got)  # request(): the reply its request expects, or a Failure
    if isinstance(got, CompareReply) and got.ours:  # the trusted worker's own failure: ours, nobody is accused
        return Prepare(error=one_line(got.ours, 300))
    if isinstance(got, Failure):
        return Prepare(findings=[(Severity.CONCLUSIVE,
                                  f"your function's result at the timing size: {one_line(got.message, 200)}")])
    if got.wrong:
        return Prepare(findings=[(Severity.CONCLUSIVE, f"wrong results at the timing size: {_words(got)}")])
    return None


TRUTH, REFERENCE = "truth", "rec0"  # what the trusted worker keeps, by key


def _ask(trusted: WorkerProcess, message: Request, timeout: float) -> Reply | Failure:
    """A request to the trusted worker: its reply, or its Failure; the worker itself breaking is
    ours (an infra_error Failure), never the student's."""
    try:
        return trusted.request(message, timeout)
    except WorkerFailure as f:
        return Failure("infra_error", f"the trusted worker failed: {f.message}")


def _words(got: CompareReply) -> str:
    if got.first < 0:
        return f"{got.numel} elements where the truth has another number"
    of = f"{got.sampled} elements checked (of {got.numel})" if 0 < got.sampled < got.numel else f"{got.numel} elements"
    return (f"{got.wrong} of {of} are wrong (the first at flat index {got.first}: "
            f"{one_line(got.got, 24)} where {one_line(got.want, 24)} is expected)")


def _checked(spec: Assignment, timed_files: list[str], layout: dict, workdir: Path, staging: Path, rec: list[str],
             ref_folder: Path, trusted: WorkerProcess, first: CallReply, linkable: bool) -> Prepare:
    """Both of the student's records and the reference's checked and copied into `staging`, the
    student's two compared; the input set beside them for the replay processes: a hard link
    where the student's worker cannot write it (`linkable`), else a copy."""
    staging.mkdir(parents=True, exist_ok=True)
    inputs = staging / "inputs.safetensors"
    inputs.unlink(missing_ok=True)
    if linkable:  # the worker cannot write the set (grader.sandbox.files.worker_cannot_write): the same file serves
        os.link(timed_files[0], inputs)
    else:  # a copy the student's worker never saw
        shutil.copyfile(timed_files[0], inputs)
    (staging / "layout.json").write_text(json.dumps(layout))
    sizes = replay_process.input_sizes(inputs, staging / "layout.json")
    parsed = []
    for i, name in enumerate(rec):
        dest = staging / f"student-{i}"
        shutil.rmtree(dest, ignore_errors=True)
        try:
            set_sizes = sizes if i == 0 else replay_process.input_sizes(Path(timed_files[1]), staging / "layout.json")
            plan = replay_process.checked_copy(workdir / "outputs" / name, dest, set_sizes)
        except (LaunchRecordError, OSError) as exc:
            return Prepare(fallback=f"your kernels could not be replayed: {one_line(exc, 300)}")
        if i == 0:
            torch_work = [one_line(w, 200) for w in plan.torch_work]
        parsed.append(json.loads((dest / "launches.json").read_text()))
    differ = replay_process.launches_differ(parsed[0], parsed[1])
    if differ:
        return Prepare(fallback=f"your function's launches change from call to call: {differ}")
    shutil.rmtree(staging / "reference", ignore_errors=True)
    try:
        replay_process.checked_copy(ref_folder, staging / "reference", sizes)
    except (LaunchRecordError, OSError) as exc:
        return Prepare(fallback=f"the reference could not be replayed: {one_line(exc, 300)}")
    student = staging / "student"
    shutil.rmtree(student, ignore_errors=True)
    (staging / "student-0").rename(student)
    recorded = parsed[0].get("launches") if isinstance(parsed[0], dict) else None
    recorded = recorded if isinstance(recorded, list) else []
    streams = len({launch.get("stream") for launch in recorded if isinstance(launch, dict)}) or 1
    return Prepare(Prepared(staging, inputs, staging / "layout.json", trusted, torch_work, dict(first.kernels),
                            launches=len(recorded) or 1, streams=streams))


def student_pids(student: StudentWorker) -> set[int]:
    """The student's processes now: its worker's tree and, where it runs as a lent uid, every
    process of that uid (a process that left the tree by forking twice is still the student's)."""
    pids: set[int] = set()
    if student.process is not None:
        pids = proctable.tree(student.process.proc.pid)
        lease = getattr(getattr(student.process, "started", None), "lease", None)
        uid = getattr(lease, "uid", None)
        if uid is not None:
            pids |= proctable.of_uid(uid)
    return pids


def stop_student(student: StudentWorker, grace_s: float = 10.0) -> tuple[str, set[int]]:
    """The student's worker and all it started gone: '' when the process table and the driver's
    list of GPU processes hold none of them, else why not; and their pids (one of them seen on the
    GPU during the replay means it was not gone after all; other jobs' workers may hold a context
    there too, but take the GPU only through its lock, which the replay holds). "All it started" is
    the worker's process tree and, where it ran as a lent uid, every process of that uid (a process that left
    the tree by forking twice is still the student's)."""
    pids = student_pids(student)
    student.close()
    deadline = time.monotonic() + grace_s
    while True:
        alive = {p for p in pids if proctable.exists(p)}
        on_gpu = set(replay_process.gpu_processes() or []) & pids
        if not alive and not on_gpu:
            return "", pids
        if time.monotonic() > deadline:
            return (f"your worker's processes are still running after it was stopped ({len(alive | on_gpu)} of them)",
                    pids)
        time.sleep(0.1)


@dataclass
class Replays:
    decision: Decision
    student: Replayed
    reference: Replayed
    wrong: str = ""
    reference_kept: bool = False  # the reference's figure came from the run's cache (`reference_key`)


DRIFT = 0.03  # a kept reference figure stands while torch's time in this job is within 3% of torch's when it was kept


def reference_key(prepared: Prepared, spec: Assignment, ctx: GradingContext, settings: Settings) -> str:
    """What a kept reference replay stands for: this GPU (as `settings` see it), the reference's
    record (its kernels' binaries by hash, grids, arguments), the input set (spec, case, dtype,
    seed, index) and the grader's version. Torch's time in each job anchors it (DRIFT)."""
    import grader
    from grader.judge.devicelock import device_id

    record = hashlib.sha256((prepared.staging / "reference" / "launches.json").read_bytes()).hexdigest()
    perf = spec.performance
    assert perf is not None  # the replay runs only for an assignment with a performance case
    parts = [device_id(ctx.gpu, settings), record, spec.name, perf.case.name, perf.dtype, str(ctx.performance_seed),
             "0", grader.__version__, str(PLACEMENTS), str(REPS)]
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:32]


def expected_key(spec: Assignment, ctx: GradingContext, settings: Settings) -> str:
    """`reference_key` without the reference's record (known only once it is recorded): under it
    the run keeps which record's figure it holds, so a job can tell before recording whether the
    reference's replay will likely be needed."""
    import grader
    from grader.judge.devicelock import device_id

    perf = spec.performance
    assert perf is not None  # the replay runs only for an assignment with a performance case
    parts = ["expected", device_id(ctx.gpu, settings), spec.name, perf.case.name, perf.dtype,
             str(ctx.performance_seed), grader.__version__, str(PLACEMENTS), str(REPS)]
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:32]


def spawn(staging: Path, c: str, start: ReplayFactory, timeout: float) -> ReplayProcess | Replayed:
    """Contender `c`'s replay process started by the session's factory (`start`:
    grader.judge.resources.Resources.replay_process) before its record exists: its imports
    overlap the recorded calls, and it touches the GPU only when told to go (`replay_process.go`)."""
    job = staging / f"run-{c}"
    shutil.rmtree(job, ignore_errors=True)
    staging.mkdir(parents=True, exist_ok=True)
    return start(job, REPS, timeout * 4, PLACEMENTS)


def place(prepared: Prepared, c: str, pending: ReplayProcess | Replayed) -> ReplayProcess | Replayed:
    """Contender `c`'s checked record and the input set handed to its started replay."""
    return replay_process.place(pending, prepared.staging / c, prepared.inputs, prepared.layout)


def loaded(pending: dict) -> dict:
    """Each placed replay waited for until its inputs are read on the host (no lock held)."""
    for c in pending:
        if pending[c] is not None:
            pending[c] = replay_process.loaded(pending[c])
    return pending


def arm(pending: dict) -> dict:
    """Each started replay told to set up on the GPU and waited for (the caller holds it shared)."""
    for c in pending:
        if pending[c] is not None:
            pending[c] = replay_process.arm(pending[c])
    return pending


def go(pending: dict, kept: Replayed | None) -> tuple[Replayed, Replayed]:
    """With the GPU held alone by the caller: the reference's replay (unless its kept figure
    stands) and the student's, told to go one after the other. Nothing else happens in the hold."""
    reference = kept if kept is not None else replay_process.go(pending["reference"])
    return reference, replay_process.go(pending["student"])


def settle(prepared: Prepared, runs: list[Replayed]) -> None:
    """After the hold, every replay's reps over: the judge's indices drawn (grader.judge.picks),
    told to each replay, and the elements of its last result there in place
    (`replay_process.settle`); each process then gone."""
    prepared.picks = _drawn(prepared.numel, prepared.staging / "picks-replay.safetensors")
    for run in runs:
        replay_process.settle(run, prepared.picks)


def judge(prepared: Prepared, spec: Assignment, reference: Replayed, student: Replayed, kept: bool,
          timeout: float = 300, sharing: Callable[[], ContextManager] = nullcontext) -> Replays:
    """After the hold: the replays' last results at the judge's indices in place (`settle`),
    compared by the trusted worker on the GPU (held shared: `sharing()`) with the truth, and the
    decision made."""
    for run in (reference, student):  # only the student's own processes make a replay's time suspect (stop_student)
        run.others = [p for p in run.others if p in prepared.student_pids]
    with sharing():
        return _judged(prepared, spec, reference, student, kept, timeout)


def _judged(prepared: Prepared, spec: Assignment, reference: Replayed, student: Replayed, kept: bool,
            timeout: float) -> Replays:
    if not kept and not (reference.refused or reference.failed):
        ref_wrong = _compare(prepared, reference, spec, timeout)
        if ref_wrong:
            reference.failed = f"the reference's replay is wrong: {ref_wrong}"
    wrong = ""
    if not (student.refused or student.failed or reference.refused or reference.failed):
        wrong = _compare(prepared, student, spec, timeout)
    return Replays(replay_process.decide(student, reference, wrong), student, reference, wrong, reference_kept=kept)


def _compare(prepared: Prepared, run: Replayed, spec: Assignment, timeout: float) -> str:
    """'' when the replay's last result is right at the judge's indices by the error model (a
    kernel with atomics sums in another order) and every other rep's result sums are the last's;
    else the evidence."""
    assert spec.performance is not None  # the replay runs only for an assignment with a performance case
    dtype = spec.performance.dtype
    tol = spec.tolerance
    assert run.folder is not None and prepared.picks is not None  # told its indices at `settle`
    got = _ask(prepared.trusted, Compare(str(run.folder / "last.safetensors"), "output.0", 0, TRUTH, REFERENCE,
                                         tol.atol[dtype], tol.rtol[dtype], indices=str(prepared.picks)), timeout * 2)
    if isinstance(got, Failure) and got.kind == "infra_error":  # ours: the stage says so, nobody is accused
        raise WorkerFailure("infra_error", got.message, "")
    got = cast("CompareReply | Failure", got)  # request(): the reply its request expects, or a Failure
    if isinstance(got, CompareReply) and got.ours:  # the trusted worker's own failure: ours, nobody is accused
        raise WorkerFailure("infra_error", one_line(got.ours, 300), "")
    if isinstance(got, Failure):
        return f"the last rep's result: {one_line(got.message, 200)}"
    if got.wrong:
        return f"the last rep: {_words(got)}"
    return replay_process.reps_differ(run)


def keep(prepared: Prepared, store: Path | None) -> dict:
    """The replay's records kept for `grader verify` in `store` (content-addressed: a folder per
    record, named by the SHA-256 of its launches.json); returns what the job's result records."""
    kept = {}
    for c in ("student", "reference"):
        folder = prepared.staging / c
        digest = hashlib.sha256((folder / "launches.json").read_bytes()).hexdigest()
        kept[c] = digest
        if store is not None:
            dest = Path(store) / digest
            if not dest.exists():
                tmp = Path(store) / f".{digest}.{os.getpid()}"
                shutil.rmtree(tmp, ignore_errors=True)
                shutil.copytree(folder, tmp)
                try:
                    tmp.rename(dest)
                except OSError:  # another job kept the same record meanwhile
                    shutil.rmtree(tmp, ignore_errors=True)
    return kept


def describe(r: Replays) -> ReplayDetails:
    """The replay's figures as the job's result records them."""
    def side(x: Replayed, kept: bool | None = None) -> ReplaySide:
        return ReplaySide(median_ms=round(x.median_ms, 5) if x.median_ms else None, reps=len(x.ms),
                          launches=x.launches, placements_ms=[round(sorted(p)[len(p) // 2], 5) for p in x.placements],
                          kept=kept)
    return ReplayDetails(student=side(r.student), reference=side(r.reference, r.reference_kept),
                         placements=PLACEMENTS)
