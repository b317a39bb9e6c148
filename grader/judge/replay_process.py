"""The judge's side of a replay (grader.replay): one contender's replay run in a process of its
own, contained by the same sandbox backend as a worker, what it hands back read as data (its
last result whole, or at the judge's indices where it was started `picked`), and what the figure
is worth.

A student's compiled kernel runs in the replay process's GPU context, so that process is treated
as a worker: its view holds the grader's own code, the record checked here first and copied
(read-only), the call's inputs, a private home and the folder it writes to; nothing of the
course, no other student file. It is told nothing of the truth: the comparison happens here.

Used by the timing stage's scored path (grader.judge.replay_stage: `spawn`, `place`, `loaded`,
`arm`, `go`, `settle`, one step of the stage each), by `grader verify` (grader.batch.verify: `run`)
and by `--profile` (grader.judge.profiling: `start` with its own entry point, under ncu).
"""

from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Protocol

import torch

from grader import proctable
from grader.replay import launchrecord
from grader.replay.launchrecord import LaunchRecordError
from grader.sandbox.files import WorkerFileError, read_worker_file
from grader.sandbox.isolation import Isolation, SandboxError
from grader.sandbox.launch import isolated_python
from grader.sandbox.process import WorkerProcess
from grader.sandbox.zygote import SandboxState
from grader.sanitize import one_line
from grader.settings import Settings

MAX_REPLY_BYTES = 1 << 20
MAX_HEADER_BYTES = 64 << 10  # a result file's safetensors header, beside its tensors' bytes
# the replay's entry point, from the private copy of the grader's code its view holds
BOOTSTRAP = ("import sys; sys.path.insert(0, {path!r}); "
             "from grader.replay.__main__ import main; sys.exit(main(sys.argv[1:]))")


@dataclass
class Replayed:
    """What a replay process handed back: its per-rep times, or why it did not time."""

    ms: list[float] = field(default_factory=list)
    refused: str = ""  # the record was refused (the fallback times this contender)
    failed: str = ""  # the replay broke (a kernel faulted, the process died or ran out of time)
    ours: bool = False  # it broke setting up, before any kernel of its record ran (no GPU, out of memory)
    others: list[int] = field(default_factory=list)  # other processes that held the GPU meanwhile
    folder: Path | None = None  # last.safetensors: the result of its last rep
    placements: list[list[float]] = field(default_factory=list)  # the times per placement of its buffers
    launches: int = 0  # kernel launches per rep, as the replay counted them
    # per rep, per result: sum, sum of magnitudes, non-finite count
    sums: list[list[list[float]]] = field(default_factory=list)
    # the process while it writes the last rep's result (`settle` waits for it and stops it)
    pending: ReplayProcess | None = field(default=None, repr=False, compare=False)

    @property
    def median_ms(self) -> float | None:
        return sorted(self.ms)[len(self.ms) // 2] if self.ms else None


def gpu_processes() -> list[int] | None:
    """PIDs of the processes that hold a context on the GPU, by the driver's own list (None if
    it cannot be read). Seen from here, not from the replay: its word is not taken, and in its
    own PID namespace it could not name itself in the driver's list anyway."""
    try:
        out = subprocess.run(["nvidia-smi", "--query-compute-apps=pid", "--format=csv,noheader"], capture_output=True,
                             text=True, timeout=20)
    except (OSError, subprocess.SubprocessError):
        return None
    if out.returncode != 0:
        return None
    return sorted(int(p) for p in out.stdout.split() if p.strip().isdigit())


def input_sizes(inputs: Path, layout: Path) -> dict[str, int]:
    """Each tensor input's storage in bytes, from the grader's own inputs file: its safetensors
    header alone (each stored tensor is one input's whole storage, grader.codec), so a set of
    gigabytes is not read to learn its sizes."""
    from grader.codec import ResultFileError, read_header

    tensors = [name for name, entry in json.loads(Path(layout).read_text()).items() if "value" not in entry]
    fd = os.open(inputs, os.O_RDONLY | os.O_CLOEXEC)
    try:
        header, _ = read_header(fd)
    except ResultFileError as exc:
        raise LaunchRecordError(f"the inputs file: {exc}") from None
    finally:
        os.close(fd)
    sizes = {}
    for name in tensors:
        entry = header.get(name)
        if not isinstance(entry, dict) or not isinstance(entry.get("data_offsets"), list):
            raise LaunchRecordError(f"the inputs file holds no storage for {name!r}")
        start, end = entry["data_offsets"]
        sizes[name] = int(end) - int(start)
    return sizes


def checked_copy(record: Path, dest: Path, sizes: dict[str, int], fresh: bool = True) -> launchrecord.ReplayPlan:
    """The record in `record` (a worker wrote it) copied to `dest`, only launches.json and the
    files its kernels name by hash, each read bounded and never through a link, then the copy
    checked whole (LaunchRecordError if refused). The replay's view holds this copy, nothing else of
    the worker's."""
    raw = launchrecord.read_file(Path(record) / "launches.json", launchrecord.MAX_RECORD_BYTES)
    try:
        parsed = json.loads(raw)
    except ValueError as exc:
        raise LaunchRecordError(f"the record is not JSON ({str(exc)[:80]})") from None
    dest.mkdir(parents=True, exist_ok=not fresh)
    (dest / "launches.json").write_bytes(raw)
    kernels = parsed.get("kernels") if isinstance(parsed, dict) else None
    for k in list(kernels.values() if isinstance(kernels, dict) else [])[:launchrecord.MAX_KERNELS]:
        files = k.get("files") if isinstance(k, dict) else None
        for digest in list(files.values() if isinstance(files, dict) else [])[:8]:
            # else the check says why
            if type(digest) is str and launchrecord.SHA.match(digest) and not (dest / digest).exists():
                (dest / digest).write_bytes(launchrecord.read_file(Path(record) / digest, launchrecord.MAX_FILE_BYTES))
    return launchrecord.load(dest, sizes)


class ReplayProcess(Protocol):
    """One contender's replay process as the timing stage drives it, one step at a time: `Pending`
    is the real one (started by `spawn`); a test hands a fake through the session's factory
    (grader.judge.resources.Resources.replay_process). A step returns the process again, or what
    it handed back (a Replayed) where it ended there: refused, failed or answered."""

    def place(self, record: Path, inputs: Path, layout: Path) -> ReplayProcess | Replayed:
        """Its checked record and the call's inputs handed to it."""

    def loaded(self) -> ReplayProcess | Replayed:
        """Waited for until its inputs are read on the host."""

    def arm(self) -> ReplayProcess | Replayed:
        """Set up on the GPU (the caller holds it shared), and waited for."""

    def go(self, allowed: frozenset[int] = frozenset()) -> Replayed:
        """Told to go: its times, read back (its last result may still be on its way)."""

    def settle(self, replay: Replayed, picks: Path | None = None) -> Replayed:
        """`replay`, its answer to `go`, with its last result in place (with `picks`, the judge's
        indices file, only the result's elements there); the process gone."""

    def cancel(self) -> None:
        """Stopped, unless it was told to go."""

    def stop(self) -> None:
        """Stopped wherever it is."""


# what starts one: (its job folder, reps, timeout, placements) -> the process, or why it did not start
ReplayFactory = Callable[[Path, int, float, int], "ReplayProcess | Replayed"]


@dataclass
class Pending:
    """A replay process started and waiting: it has imported torch and Triton and read its record
    and inputs; it sets up on the GPU once armed (`arm`, the GPU held shared: another job's timing
    never sees it) and runs the record's kernels only once told to go (`go`), so neither its start
    nor its set-up costs anything inside the timing's exclusive hold. The real ReplayProcess."""

    proc: WorkerProcess
    job: Path
    timeout: float
    done: bool = False  # told to go and waited for (or stopped)
    armed: bool = False  # set up on the GPU (or answered already: refused, failed)
    closed: bool = False  # killed and reaped
    picked: bool = False  # started with --pick: it hands back the elements at the judge's indices (`settle`)

    def place(self, record: Path, inputs: Path, layout: Path) -> Pending | Replayed:
        """The record checked and copied into the started replay's job folder with the call's
        inputs, then READY: the process reads them. A refused record stops the process (a
        Replayed that says why)."""
        job = self.job
        try:
            checked_copy(Path(record), job / "record", input_sizes(inputs, layout), fresh=False)
        except LaunchRecordError as exc:
            self.cancel()
            return Replayed(refused=str(exc)[:400])
        try:  # the grader's own file, read-only in the replay's view: linked where it can be, else copied
            os.link(inputs, job / "inputs.safetensors")
        except OSError:
            shutil.copyfile(inputs, job / "inputs.safetensors")
        shutil.copyfile(layout, job / "layout.json")
        for f in [job / "inputs.safetensors", job / "layout.json", *(job / "record").iterdir()]:
            os.chmod(f, 0o644)
        (job / READY).touch()
        return self

    def loaded(self) -> Pending | Replayed:
        """Waited for until it has read its inputs and checked its record on the host (before
        the GPU is held: what is left for `arm` is the GPU's part). A replay that answers
        instead, or ends, is read back as `arm` does; one that overruns is stopped."""
        if self.armed:
            return self
        return _until(self, LOADED, "did not read its inputs", 0.005) or self

    def arm(self) -> Pending | Replayed:
        """Told to set up on the GPU (its context, the kernels loaded, the inputs and the first
        placement's buffers), and waited for: the caller holds the GPU shared meanwhile. A replay
        that answers instead (no GPU, a record refused against this GPU) or ends is read back."""
        if self.armed:
            return self
        if not (self.job / ARM).exists():
            (self.job / ARM).touch()
        stopped = _until(self, ARMED, "was not set up", 0.002)
        if stopped is not None:
            return stopped
        self.armed = True
        return self

    def go(self, allowed: frozenset[int] = frozenset()) -> Replayed:
        """Armed here if it is not yet, told to go, its times waited for and read back bounded:
        a process that fails or overruns is a failed replay. The times end the wait; the last
        rep's result is written after them (`settle` waits for it, outside the hold). `allowed`:
        GPU processes not counted as sharing the GPU."""
        armed = self.arm()
        if isinstance(armed, Replayed):
            return armed
        result = self.job / "result"
        self.done = True
        own = proctable.tree(self.proc.proc.pid)  # the replay itself holds the GPU since its set-up
        before = gpu_processes() or []
        (self.job / GO).touch()
        answer, deadline = result / "replay.json", time.monotonic() + self.timeout
        while not answer.exists():  # its answer, once in place, ends the wait
            ended = _ended(self)
            if ended is not None and not answer.exists():
                _close(self)
                return ended
            if time.monotonic() > deadline:
                _close(self)
                return Replayed(failed=f"the replay did not finish in {self.timeout:.0f} s")
            time.sleep(0.002)
        replay = read(result)
        own |= proctable.tree(self.proc.proc.pid)
        others = sorted({p for p in before + (gpu_processes() or []) if p != os.getpid() and p not in allowed | own})
        replay.others = others[:16]
        if replay.folder is None:  # refused or failed: nothing more to wait for
            _close(self)
        else:
            replay.pending = self
        return replay

    def settle(self, replay: Replayed, picks: Path | None = None) -> Replayed:
        """`replay`'s last result in place (the process writes it after its times) and the
        process gone. A process that ends or overruns without writing it is a failed replay.
        Started with `picked`, it is told the judge's indices first (`picks`, copied into its
        job folder, which it reads and cannot write) and writes only the elements there."""
        last, deadline = replay.folder / "last.safetensors" if replay.folder else None, time.monotonic() + self.timeout
        try:
            if self.picked and last is not None:
                if picks is None:
                    raise ValueError("a replay started to hand back picked elements needs the judge's indices")
                _appear(Path(picks), self.job / PICK)
            while last is not None and not last.exists():
                if self.proc.proc.poll() is not None and not last.exists():
                    replay.failed = "the replay ended before its last result was written"
                    break
                if time.monotonic() > deadline:
                    replay.failed = f"the replay's last result was not written in {self.timeout:.0f} s"
                    break
                time.sleep(0.002)
        finally:
            _close(self)
        return replay

    def cancel(self) -> None:
        if not self.done:
            self.done = True
            _close(self)

    def stop(self) -> None:
        self.done = True
        _close(self)


def spawn(job: Path, reps: int, timeout: float, isolation: Isolation | str = "sandbox", gpu: str | None = None,
          boot: str = BOOTSTRAP, placements: int = 1, picked: bool = False, *, settings: Settings,
          sandbox: SandboxState, readable: tuple[Path, ...] = ()) -> Pending | Replayed:
    """A replay process started in `job` (a new folder) through the sandbox backend (as a worker
    is: the same view rules, uid, limits, no network) before its record exists: it imports torch
    and Triton, then waits for `place` to put its checked record and inputs there (READY), and
    touches the GPU only once told to go (GO). `boot` replaces the entry point (a test's probe
    of the view), given the same arguments. `placements`: the reps spread over that many fresh
    sets of buffers at other addresses. `picked`: it hands back its last result's elements at the
    judge's indices (`settle`), not the whole result. `settings`: the grading session's (its uids, threads,
    container command) and `sandbox` what its sandbox keeps (the copy of the code the process
    imports), handed to the process as to a worker; `readable`: host folders its view shows
    read-only besides (Nsight Compute's install, for a replay run under ncu, which also gets its
    network namespace's loopback: ncu talks to the process it profiles over a local socket)."""
    job = Path(job)
    job.mkdir(parents=True, exist_ok=True)
    (job / "record").mkdir(exist_ok=True)
    os.chmod(job / "record", 0o755)  # readable by a worker's uid, read-only in its view
    result, home = job / "result", job / "home"
    argv = isolated_python(boot, str(job / "record"), str(job / "inputs.safetensors"), str(job / "layout.json"),
                           str(result), "--reps", str(int(reps)), "--placements", str(int(placements)),
                           "--ready", str(job / READY), "--loaded", str(result / LOADED), "--arm", str(job / ARM),
                           "--armed", str(result / ARMED),
                           "--go", str(job / GO), *(["--pick", str(job / PICK)] if picked else []),
                           path=str(sandbox.worker_code()))
    try:
        proc = WorkerProcess(home, home, interpret=False, gpu=gpu, isolation=isolation, writable=[result], job=job,
                             command=argv, settings=settings, sandbox=sandbox, readable=readable,
                             loopback=bool(readable))
    except (OSError, SandboxError) as exc:
        return Replayed(failed=f"the replay process could not be started: {one_line(exc, 200)}")
    return Pending(proc, job, timeout, picked=picked)


def place(pending: ReplayProcess | Replayed, record: Path, inputs: Path, layout: Path) -> ReplayProcess | Replayed:
    """`pending`'s record and inputs handed to it (ReplayProcess.place); a Replayed passes as it is."""
    return pending if isinstance(pending, Replayed) else pending.place(record, inputs, layout)


def start(record: Path, inputs: Path, layout: Path, job: Path, reps: int, timeout: float,
          isolation: Isolation | str = "sandbox", gpu: str | None = None, boot: str = BOOTSTRAP,
          placements: int = 1, *, settings: Settings, sandbox: SandboxState,
          readable: tuple[Path, ...] = ()) -> ReplayProcess | Replayed:
    """`spawn` and `place` at once: a replay ready to go. A refused record starts nothing."""
    job = Path(job)
    job.mkdir(parents=True)
    try:
        checked_copy(Path(record), job / "record", input_sizes(inputs, layout))
    except LaunchRecordError as exc:
        return Replayed(refused=str(exc)[:400])
    started = spawn(job, reps, timeout, isolation, gpu, boot, placements, settings=settings, sandbox=sandbox,
                    readable=readable)
    return place(started, record, inputs, layout)


READY = "ready"  # the file whose appearance tells a started replay its record and inputs are in place
LOADED = "loaded"  # the file the replay makes in its result folder once its inputs are read (on the host)
ARM = "arm"  # ... that it may set up on the GPU (the judge holds it shared)
ARMED = "armed"  # the file the replay makes in its result folder once set up
GO = "go"  # the file whose appearance in the job folder lets a started replay run the record's kernels
PICK = "pick.safetensors"  # the judge's indices in the job folder: which elements of its last result it hands back


def _appear(source: Path, dest: Path) -> None:
    """A copy of `source` (the judge's file, which stays the judge's alone) at `dest`, whole the
    moment it appears there, readable by the replay's uid."""
    tmp = dest.with_name(f".{dest.name}.tmp")
    tmp.unlink(missing_ok=True)
    shutil.copyfile(source, tmp)
    os.chmod(tmp, 0o644)
    tmp.replace(dest)


def _ended(pending: Pending) -> Replayed | None:
    """The process ended without an answer: why, as a failed replay; None while it runs."""
    proc = pending.proc
    code = proc.proc.poll()
    if code is None:
        return None
    status = proc.status()
    if "setup_error" in status:
        return Replayed(failed=f"the replay's sandbox failed: {one_line(status['setup_error'], 200)}")
    code = status.get("exit", status.get("signal") and -status["signal"] or proc.backend.exit_code(code))
    tail = ([line for line in proc.output.text().splitlines() if line.strip()] or ["no output"])[-1]
    return Replayed(failed=f"the replay process ended without an answer (exit {code}: {one_line(tail, 200)})")


def _until(pending: Pending, mark: str, late: str, poll_s: float) -> Replayed | None:
    """Wait until the replay makes `mark` in its result folder or answers (None); if it ends
    first, or overruns (`late`: what it did not do in time, ours), it is stopped and read back."""
    result, deadline = pending.job / "result", time.monotonic() + pending.timeout
    while not (result / mark).exists() and not (result / "replay.json").exists():
        ended = _ended(pending)
        if ended is not None:
            _close(pending)
            return ended
        if time.monotonic() > deadline:
            _close(pending)
            return Replayed(failed=f"the replay {late} in {pending.timeout:.0f} s", ours=True)
        time.sleep(poll_s)
    return None


def loaded(pending: ReplayProcess | Replayed) -> ReplayProcess | Replayed:
    """A placed replay waited for until its inputs are read (ReplayProcess.loaded); a Replayed
    passes as it is."""
    return pending if isinstance(pending, Replayed) else pending.loaded()


def arm(pending: ReplayProcess | Replayed) -> ReplayProcess | Replayed:
    """A placed replay set up on the GPU (ReplayProcess.arm); a Replayed passes as it is."""
    return pending if isinstance(pending, Replayed) else pending.arm()


def go(pending: ReplayProcess | Replayed, allowed: frozenset[int] = frozenset()) -> Replayed:
    """A started replay told to go, its times read back (ReplayProcess.go); a Replayed passes as
    it is."""
    return pending if isinstance(pending, Replayed) else pending.go(allowed)


def settle(replay: Replayed, picks: Path | None = None) -> Replayed:
    """A replay's last result in place and its process gone (ReplayProcess.settle): what `go`
    handed back, once only; `picks`: the judge's indices, for a replay started `picked`."""
    pending, replay.pending = replay.pending, None
    return replay if pending is None else pending.settle(replay, picks)


def _close(pending: Pending) -> None:
    if not pending.closed:
        pending.closed = True
        pending.proc.kill()  # reads no request: killed, not asked to exit and waited for
        pending.proc.close()


def cancel(pending: ReplayProcess | Replayed | None) -> None:
    """A started replay not needed after all, never told to go: stopped."""
    if pending is not None and not isinstance(pending, Replayed):
        pending.cancel()


def stop(run: ReplayProcess | Replayed | None) -> None:
    """A replay stopped wherever it is (told to go or not): on the way out of an error."""
    if isinstance(run, Replayed):
        run = run.pending
    if run is not None:
        run.stop()


def run(record: Path, inputs: Path, layout: Path, job: Path, reps: int, timeout: float,
        isolation: Isolation | str = "sandbox", gpu: str | None = None, boot: str = BOOTSTRAP,
        placements: int = 1, allowed: frozenset[int] = frozenset(), *, settings: Settings,
        sandbox: SandboxState) -> Replayed:
    """`start`, `go` and `settle` at once: one contender's replay, start to last result."""
    started = start(record, inputs, layout, job, reps, timeout, isolation, gpu, boot, placements, settings=settings,
                    sandbox=sandbox)
    return settle(go(started, allowed))


def read(out: Path) -> Replayed:
    """replay.json in `out`, bounded and typed, as a worker's file is read (the process ran a
    student's binary). Which processes shared the GPU is `run`'s own observation, not read here."""
    try:
        data = json.loads(read_worker_file(Path(out) / "replay.json", MAX_REPLY_BYTES))
    except (WorkerFileError, ValueError) as exc:
        return Replayed(failed=f"the replay's answer cannot be read ({str(exc)[:120]})")
    if not isinstance(data, dict):
        return Replayed(failed="the replay's answer is not an object")
    if "refused" in data:
        return Replayed(refused=one_line(data["refused"], 400))
    if "failed" in data:
        return Replayed(failed=one_line(data["failed"], 400), ours=data.get("setup") is True)
    ms = data.get("ms")
    if not (isinstance(ms, list) and 0 < len(ms) <= 10_000
            and all(type(t) in (int, float) and math.isfinite(t) and t > 0 for t in ms)):
        return Replayed(failed="the replay's times are not positive numbers")
    placements = data.get("placements")
    if not (isinstance(placements, list) and 0 < len(placements) <= 16
            and all(isinstance(p, list) and p for p in placements)
            and sorted(float(t) for p in placements for t in p if type(t) in (int, float))
            == sorted(float(t) for t in ms)):
        placements = [ms]  # one placement, or none that add up to the times: the times as one
    launches = data.get("launches")
    sums = data.get("sums")
    if not (isinstance(sums, list) and len(sums) == len(ms) and all(
            isinstance(rep, list) and 0 < len(rep) <= 8 and all(
                isinstance(x, list) and len(x) == 3 and all(type(v) in (int, float) and math.isfinite(v) for v in x)
                for x in rep)
            for rep in sums)):
        return Replayed(failed="the replay's result sums are not one triple per result per rep")
    return Replayed(ms=[float(t) for t in ms], folder=Path(out),
                    placements=[[float(t) for t in p] for p in placements],
                    launches=launches if type(launches) is int and 0 <= launches <= 10_000 else 0,
                    sums=[[[float(v) for v in x] for x in rep] for rep in sums])


def reps_differ(replay: Replayed, rtol: float = 1e-5) -> str:
    """'' when every rep's result sums are the last rep's (within `rtol` of the magnitudes: a
    kernel with atomics sums in another order), else which rep computed something else."""
    if not replay.sums:
        return ""
    last = replay.sums[-1]
    for i, rep in enumerate(replay.sums):
        for j, (x, y) in enumerate(zip(rep, last)):
            if x[2] != y[2] or abs(x[0] - y[0]) > rtol * max(x[1], y[1]) + 1e-30 \
                    or abs(x[1] - y[1]) > rtol * max(x[1], y[1]) + 1e-30:
                return (f"rep {i + 1} of {len(replay.sums)} computed another result {j} than the last rep, "
                        f"which was checked against torch's (sums {x[0]:.6g} and {y[0]:.6g}, "
                        f"{int(x[2])} and {int(y[2])} non-finite)")
    return ""


class ReplyError(ValueError):
    """A replay's result file that cannot be read as the results it must hold."""


def results(replayed: Replayed, expected: list[torch.Tensor]) -> list[torch.Tensor]:
    """The replay's results of its last rep, read as a worker's file is: never
    through a link, never more than the expected results' bytes and a header, exactly the
    expected names, dtypes and shapes; ReplyError says what is wrong."""
    from safetensors.torch import load

    assert replayed.folder is not None
    limit = sum(t.numel() * t.element_size() for t in expected) + MAX_HEADER_BYTES
    try:
        tensors = load(read_worker_file(replayed.folder / "last.safetensors", limit))
    except Exception as exc:  # noqa: BLE001 - WorkerFileError, or safetensors' own error for a bad header
        raise ReplyError(f"the replay's last result cannot be read ({one_line(exc, 160)})") from None
    names = [f"output.{i}" for i in range(len(expected))]
    if sorted(tensors) != sorted(names):
        raise ReplyError(f"the replay's last result holds {len(tensors)} tensors where {len(names)} are expected")
    got = [tensors[n] for n in names]
    for i, (g, w) in enumerate(zip(got, expected)):
        if g.dtype != w.dtype:
            raise ReplyError(f"the replay's result {i} is {str(g.dtype)[6:]}, not {str(w.dtype)[6:]}")
    return got


def mismatch(replayed: list[torch.Tensor], expected: list[torch.Tensor], rtol: float, atol: float) -> str:
    """'' when every element of every result matches, else the evidence in words."""
    if len(replayed) != len(expected):
        return f"{len(replayed)} results where {len(expected)} are expected"
    for i, (got, want) in enumerate(zip(replayed, expected)):
        if got.shape != want.shape:
            return f"result {i} has shape {list(got.shape)}, not {list(want.shape)}"
        g, w = got.double(), want.double()
        same_nan = torch.isnan(g) & torch.isnan(w)
        bad = ~(same_nan | (torch.isclose(g, w, rtol=rtol, atol=atol) & ~torch.isnan(g)))
        count = int(bad.sum())
        if count:
            where = int(bad.reshape(-1).nonzero()[0])
            return (f"{count} of {g.numel()} elements of result {i} are wrong "
                    f"(the first at flat index {where}: {float(g.reshape(-1)[where]):.6g} "
                    f"where {float(w.reshape(-1)[where]):.6g} is expected)")
    return ""


def launches_differ(a: dict, b: dict) -> str:
    """'' when two records of the same function on inputs of the same shape make the same
    launches (kernels, grids, argument roles), else how they differ: then no one record stands
    for the function, and it is timed the fallback way."""
    def shape(record: dict) -> list:
        return [(x.get("kernel"), x.get("grid"),
                 [(y.get("kind"), y.get("role"), y.get("ref")) for y in x.get("args", [])])
                for x in record.get("launches", []) if isinstance(x, dict)]

    sa, sb = shape(a), shape(b)
    if len(sa) != len(sb):
        return f"one call made {len(sa)} launches, another {len(sb)}"
    for i, (x, y) in enumerate(zip(sa, sb)):
        if x != y:
            return f"launch {i} differs between two calls (kernel, grid or arguments)"
    return ""


@dataclass
class Decision:
    kind: str  # scored | fallback | retry | review | conclusive
    message: str
    ratio: float | None = None


def decide(student: Replayed, reference: Replayed, wrong: str, differ: str = "") -> Decision:
    """What a replay's figure is worth. `wrong`: `mismatch` of the student's replayed results
    against the expected ones; `differ`: `launches_differ` of two of its records."""
    if student.ours or reference.ours:  # nobody's kernel ran: ours, and the job can be graded again
        return Decision("retry", "the replay could not be set up on the GPU: "
                        f"{student.failed if student.ours else reference.failed}")
    if reference.refused or reference.failed:
        return Decision("fallback", f"the reference could not be replayed ({reference.refused or reference.failed})")
    if student.others or reference.others:
        return Decision("retry", "other processes held the GPU while the replay was timed: "
                        f"{student.others + reference.others}")
    if student.refused:
        return Decision("fallback", f"your kernels could not be replayed: {student.refused}")
    if differ:
        return Decision("fallback", f"your function's launches change from call to call: {differ}")
    if student.failed:  # a clean record whose replay breaks: evidence for a TA, not a verdict
        return Decision("review", "your recorded kernels failed when launched again on the grader's own buffers: "
                        f"{student.failed}")
    if wrong:
        return Decision("conclusive", "the Triton kernels your function launched do not compute the result "
                        f"on their own: launched again on the grader's own buffers, {wrong}")
    student_ms, reference_ms = student.median_ms, reference.median_ms
    assert student_ms is not None and reference_ms is not None  # a replay neither refused nor failed has its times
    return Decision("scored", "timed by replay", student_ms / reference_ms)
