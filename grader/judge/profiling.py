"""TRUSTED: `--profile`, Nsight Compute on the replays of an assignment already graded.

After grading, apart from it: for each assignment the timing stage timed by replay, the records it
kept (GradingContext.replay_store) are replayed again, the reference's and the student's each in a
sandboxed replay process of its own (grader.judge.replay_process, as `grader verify` does), this time
started under `ncu` (grader.profile.ncu) for one rep of the record's launches, on the input set
made again from the run's seed. ncu runs inside the sandbox with the replay (it injects itself into
the process it profiles): Nsight Compute's install folder, resolved here (ncu.locate), is added to
that replay's view read-only, and the install's own `ncu` runs it. No student Python runs; the grade
is made and written before, and nothing here changes it. ncu's CSV comes back from the replay's
result folder, read bounded, and grader.profile.explain says what it shows. Imported only when `--profile` is asked for.

Where no profile can be made (no GPU, no ncu, counters open to admin users only, an assignment not
timed by replay), `unavailable` / `Profile.why_not` say why in one line and the check goes on."""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from grader.device import Device
from grader.payloads import PerformancePayload, ReplayDetails, ReplayInputs
from grader.profile import ncu
from grader.profile.explain import Explanation, explain
from grader.results import RunResult
from grader.sanitize import one_line
from grader.settings import Settings
from grader.spec import Assignment, Course

if TYPE_CHECKING:  # the replay's side is imported where a profile is made
    from grader.judge.replay_process import Replayed
    from grader.sandbox.zygote import SandboxState

TIMEOUT_S = 600.0  # one contender's replay under ncu: its start, ~40 metrics' passes over one rep


@dataclass
class Profile:
    assignment: str
    explanation: Explanation | None = None
    why_not: str = ""  # one line: no profile was made

    def to_json(self) -> dict:
        return {"assignment": self.assignment, "why_not": self.why_not,
                **(self.explanation.to_json() if self.explanation else {})}


def unavailable(device: Device, isolation: str, params: Path = Path("/proc/driver/nvidia/params")) -> str:
    """'' where a profile can be tried on this machine, else why not (one line)."""
    if device != Device.CUDA:
        return "no profile: it needs an NVIDIA GPU, and this ran in Triton's CPU interpreter"
    found = ncu.find_ncu()
    if found is None:
        return f"no profile: Nsight Compute (ncu) is not installed here (not on PATH, nor {ncu.NCU_DEFAULT})"
    install = ncu.locate(found)
    if isinstance(install, str):
        return "no profile: Nsight Compute's install folder, which the profiled replay must see, was not found: " \
            + one_line(install, 400)
    # the replay runs as an unprivileged user without capabilities, unless --isolation none as root
    if ncu.counters_restricted(params) and not (isolation == "none" and os.geteuid() == 0):
        return "no profile: " + ncu.RESTRICTED
    return ""


def kept_replay(details: PerformancePayload | dict[str, Any]) -> ReplayDetails | None:
    """The performance payload (or its stored JSON: a batch's record)'s replay (its kept records'
    hashes and input set), where it was timed by replay."""
    payload = details if isinstance(details, PerformancePayload) else PerformancePayload.from_json(details)
    replay = payload.replay
    if payload.timed_by != "replay" or not isinstance(replay, ReplayDetails) or not isinstance(replay.kept, dict):
        return None
    return replay


def profile_assignment(spec: Assignment, details: PerformancePayload | dict[str, Any], store: Path, isolation: str,
                       gpu: str | None, settings: Settings) -> Profile:
    """`spec`'s graded performance test (its payload, `details`) profiled from the records kept in `store`."""
    from grader.judge import devicelock, replay_process
    from grader.judge.runcache import write_perf_set
    from grader.replay import launchrecord
    from grader.sandbox.zygote import SandboxState

    name = spec.name
    payload = details if isinstance(details, PerformancePayload) else PerformancePayload.from_json(details)
    replay = kept_replay(payload)
    if replay is None or not isinstance(replay.kept, dict):
        why = payload.replay_refused or "its speed was not timed by replay"
        return Profile(name, why_not=f"no profile of {name}: {one_line(why, 200)}")
    inputs = replay.inputs if isinstance(replay.inputs, ReplayInputs) else ReplayInputs()
    perf = spec.performance
    if perf is None or perf.case.name != inputs.case or perf.dtype != inputs.dtype:
        return Profile(name, why_not=f"no profile of {name}: its scoring case is not the one graded")
    if not isinstance(inputs.seed, int):
        return Profile(name, why_not=f"no profile of {name}: the replay's input set was not recorded")
    folders = {c: Path(store) / str(replay.kept.get(c, "")) for c in ("reference", "student")}
    if not all((f / "launches.json").is_file() for f in folders.values()):
        return Profile(name, why_not=f"no profile of {name}: the replay's records were not kept")
    found = ncu.find_ncu()
    install = ncu.locate(found) if found is not None else "no ncu on PATH"
    if isinstance(install, str):
        return Profile(name, why_not=f"no profile of {name}: Nsight Compute's install folder: {one_line(install, 300)}")
    work = Path(tempfile.mkdtemp(prefix="grader-profile-"))
    sandbox = SandboxState()  # the profiled replays' own: they run after the grading session
    try:
        layout = write_perf_set(spec, perf.case, perf.dtype, inputs.seed, int(inputs.set or 0),
                                work / "inputs.safetensors")
        (work / "layout.json").write_text(json.dumps(layout))
        sizes = replay_process.input_sizes(work / "inputs.safetensors", work / "layout.json")
        launches = {}
        for c, folder in folders.items():
            try:
                plan = launchrecord.load(folder, sizes)
            except launchrecord.LaunchRecordError as exc:
                return Profile(name, why_not=f"no profile of {name}: the {c}'s record: {one_line(exc, 200)}")
            kernels = [k.name for k in plan.kernels.values()]
            count = sum(1 for s in plan.steps if isinstance(s, launchrecord.RecordedLaunch))
            log = work / c / "result" / ncu.LOG_NAME
            entry = boot(install.command, ncu.options(kernels, count, str(log)))
            # the GPU alone while ncu profiles: its counters serve one profiling session at a time (two
            # overlapping, as a class's jobs or checks side by side would, fail with "An error was
            # reported by the driver"), and another job's kernels would run inside the measured window
            with devicelock.timing_lock(gpu, settings):
                run = _under_ncu(folder, work, work / c, entry, isolation, gpu, settings, sandbox, (install.folder,))
            try:
                launches[c] = ncu.parse(_read(log))
            except ncu.NcuError as exc:
                failed = f" (the replay: {one_line(run.failed or run.refused, 150)})" if run.failed or run.refused \
                    else ""
                return Profile(name, why_not=f"no profile of {name}: {one_line(exc, 300)}{failed}")
        return Profile(name, explain(launches["student"], launches["reference"], payload.bytes))
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _under_ncu(record: Path, work: Path, job: Path, entry: str, isolation: str, gpu: str | None,
               settings: Settings, sandbox: SandboxState, readable: tuple[Path, ...] = ()) -> Replayed:
    """One replay (a rep, no placements) through the sandbox with `entry` as its entry point, told
    to go at once; then, unlike a timed replay (whose process is stopped once its last result is
    written), waited for until it ends: ncu writes its CSV as the replayed process exits.
    `readable`: Nsight Compute's install folder, which the sandbox's view shows read-only (ncu runs
    inside the sandbox with the replay it profiles: it injects itself into that process)."""
    from grader.judge import replay_process

    run = replay_process.go(replay_process.start(record, work / "inputs.safetensors", work / "layout.json", job, 1,
                                                 TIMEOUT_S, isolation=isolation, gpu=gpu, boot=entry,
                                                 settings=settings, sandbox=sandbox, readable=readable))
    pending = run.pending
    if isinstance(pending, replay_process.Pending):  # the real process, started here
        deadline = time.monotonic() + TIMEOUT_S
        while pending.proc.proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
    replay_process.stop(run)
    return run


def _read(log: Path) -> str:
    """ncu's log, bounded, never through a link (the process that wrote it ran a student's binary)."""
    from grader.sandbox.files import WorkerFileError, read_worker_file

    try:
        return read_worker_file(log, ncu.MAX_LOG_BYTES).decode("utf-8", errors="replace")
    except (WorkerFileError, OSError):
        return ""


def boot(ncu_path: Path, options: list[str]) -> str:
    """The replay's entry point (a `replay_process` boot template, given the grader's code folder as
    `path`) that becomes `ncu OPTIONS python -I -u -B -c REPLAY ARGS...`: the replay process
    itself runs under the profiler, with the arguments it was started with."""
    replay = ("import sys; sys.path.insert(0, ' + repr(P) + '); "
              "from grader.replay.__main__ import main; sys.exit(main(sys.argv[1:]))")
    argv = f"[{str(ncu_path)!r}, *{options!r}, sys.executable, '-I', '-u', '-B', '-c', '{replay}', *sys.argv[1:]]"
    return "import os, sys; P = {path!r}; A = " + argv.replace("{", "{{").replace("}", "}}") + "; os.execv(A[0], A)"


def profile_run(run: RunResult, course: Course, store: Path, isolation: str, gpu: str | None,
                settings: Settings) -> list[Profile]:
    """Every assignment of a graded `run` (a RunResult) that has a performance test, profiled."""
    from grader.spec import UnknownAssignment

    out = []
    for a in run.assignments:
        perf = next((t.details for t in a.tests if isinstance(t.details, PerformancePayload) and t.details.timed_by),
                    None)
        if perf is None:
            continue
        try:
            spec = course.get(a.name)
        except UnknownAssignment:
            continue
        out.append(profile_assignment(spec, perf, store, isolation, gpu, settings))
    return out
