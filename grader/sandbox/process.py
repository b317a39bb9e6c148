"""Start and talk to a worker process, whatever contains it.

Three ways to contain a worker (`--isolation`), strongest first where it is available, each
a backend (see `grader.sandbox.backend`):

- `sandbox` (default, no Docker): namespaces and a private file view (`namespaces.py`).
- `docker`: one container per worker (`docker.py`).
- `none`: a plain child process with limits and a scrubbed environment (`plain.py`, for debugging).

In every mode requests and replies (`grader.protocol`) go over a private pipe pair (FIFOs in
docker), never stdout, so printing cannot forge a reply; stdout/stderr are captured with head
and tail kept. A reply that does not come in time, a worker that dies, or a reply that is not
what its request expects raises WorkerFailure here; the caller records the outcome and starts
a fresh worker for what is left.
"""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from pathlib import Path

from grader import protocol
from grader.environment import has_gpu
from grader.protocol import Failure
from grader.sandbox.backend import ISOLATION_MODES, backend_for
from grader.sandbox.isolation import Isolation, SandboxError
from grader.sandbox.launch import Launch, Limits, worker_env
from grader.sandbox.zygote import SandboxState
from grader.settings import Settings

MAX_REPLY_BYTES = 16 << 20


class WorkerFailure(Exception):
    """The worker did not answer, or not in the protocol: `failure.kind` is "timeout", "crashed"
    or "infra_error". Raised with a Failure, or with (kind, message, output) to build one."""

    def __init__(self, failure: Failure | str, message: str = "", output: str = "") -> None:
        if not isinstance(failure, Failure):
            failure = Failure(failure, message, output=output)
        super().__init__(failure.message)
        self.failure = failure

    @property
    def outcome(self) -> str:
        return self.failure.kind

    @property
    def message(self) -> str:
        return self.failure.message

    @property
    def output(self) -> str:
        return self.failure.output


class CappedOutput:
    """Keeps the first and last `keep` bytes of a stream and counts what was cut between,
    so 100 MB of prints cost neither memory nor the useful end of a traceback. A thread
    drains the pipe as fast as it fills, so a worker never blocks on its own output."""

    def __init__(self, stream, keep: int = 32 << 10) -> None:
        self.keep, self.head, self.tail, self.total = keep, bytearray(), bytearray(), 0
        self.thread = threading.Thread(target=self._pump, args=(stream,), daemon=True)
        self.thread.start()

    def _pump(self, stream) -> None:
        for chunk in iter(lambda: stream.read1(1 << 16), b""):
            self.total += len(chunk)
            room = self.keep - len(self.head)
            if room > 0:
                self.head += chunk[:room]
                chunk = chunk[room:]
            self.tail += chunk
            if len(self.tail) > 2 * self.keep:
                del self.tail[: len(self.tail) - self.keep]

    def text(self) -> str:
        self.thread.join(timeout=2)
        tail = self.tail[-self.keep :]
        elided = self.total - len(self.head) - len(tail)
        middle = f"\n[... {elided} bytes of output elided ...]\n" if elided > 0 else ""
        return (bytes(self.head) + middle.encode() + bytes(tail)).decode("utf-8", "replace")


# -- what this machine allows ---------------------------------------------------------------

def detect(mode: str, settings: Settings, sandbox: SandboxState) -> Isolation:
    """What `mode` can do here with `settings` (the uid range, the container command), tried for
    real once per session (`sandbox`: a worker start that imports nothing of the student's); what
    is missing is said in `warnings`, to be shown once per run."""
    if mode not in ISOLATION_MODES:
        raise SandboxError(f"--isolation must be one of {', '.join(ISOLATION_MODES)}, not {mode!r}")
    key = (mode, settings)
    if key not in sandbox.isolations:
        sandbox.isolations[key] = backend_for(mode).detect(lambda isolation: _probe(isolation, settings, sandbox),
                                                           settings)
    return sandbox.isolations[key]


def as_asked(mode: str, settings: Settings, sandbox: SandboxState) -> Isolation:
    """`detect(mode)`, where nothing less than `mode` will do: a batch and every CI run grade
    others' code unattended, so a sandbox that can only be built weaker here (no namespaces, no
    separate user, no sandbox at all) stops them with the reason and the fix, instead of a warning
    nobody reads. `--isolation none` is the one way to grade without it, asked for by name."""
    isolation = detect(mode, settings, sandbox)
    if mode == "none" or not isolation.warnings:
        return isolation
    raise SandboxError(f"the {mode} isolation cannot be built as asked on this machine: "
                       f"{'; '.join(isolation.warnings)}. "
                       "Fix it (the unshare command from util-linux; user namespaces the kernel allows: sysctl "
                       "user.max_user_namespaces > 0 and, on Ubuntu 23.10 and later, "
                       "kernel.apparmor_restrict_unprivileged_userns=0; root is refused them too where a seccomp "
                       "filter refuses them, as a container's default one does), or pass --isolation none to grade "
                       "without a sandbox, knowingly")


PROBE = ("import os, sys, grader.worker.server, numpy, safetensors, torch, triton\n"
         # a forked worker has these imported already: its uid must still reach them for what it imports later
         "for m in (numpy, safetensors, torch, triton):\n"
         "    if not os.access(os.path.dirname(m.__file__), os.R_OK | os.X_OK):\n"
         "        sys.exit(f'the worker cannot read {os.path.dirname(m.__file__)} (its uid is not let in)')\n"
         "if os.environ.get('CUDA_VISIBLE_DEVICES') != '':\n"  # a GPU worker must reach the GPU from inside
         "    torch.zeros(1, device='cuda')\n")


def _probe(isolation: Isolation, settings: Settings, sandbox: SandboxState) -> str | None:
    """None if a worker can start under `isolation`, else why not (one line)."""
    with tempfile.TemporaryDirectory(prefix="grader-probe-") as tmp:
        job = Path(tmp)
        (job / "repo").mkdir()
        try:
            proc = WorkerProcess(job / "repo", job / "scratch", interpret=not has_gpu(), isolation=isolation,
                                 command=[sys.executable, "-I", "-B", "-c",
                                          f"import sys; sys.path.insert(0, {str(sandbox.worker_code())!r})\n" + PROBE],
                                 probe=PROBE, settings=settings, sandbox=sandbox)
        except (OSError, SandboxError) as exc:
            return str(exc)
        try:
            code = proc.proc.wait(timeout=120)
        except subprocess.TimeoutExpired:
            proc.kill()
            return "a test worker did not start within 120 s"
        status = proc.status()
        proc.close()
        if code == 0 and status.get("exit") == 0:
            return None
        lines = [line for line in proc.output.text().splitlines() if line.strip()]
        return status.get("setup_error") or (lines[-1] if lines else f"a test worker failed (status {code})")


# -- a worker ---------------------------------------------------------------------------------------

class WorkerProcess:
    """One worker: `cwd` is the private repo copy, `scratch` its home/temp/Triton cache, both
    writable, as is every folder in `writable` (where it saves outputs); `job` (default: the
    folder holding cwd and scratch) is readable, as is every folder in `readable` (a tool of the
    host's the worker runs: Nsight Compute's install), and `loopback` brings up its network
    namespace's own loopback (that tool talks to the process it watches over it); `hide` names
    more private folders; `settings`
    are the session's (its warm starts, uid range, container command and threads), and so is
    `sandbox`, what its sandbox keeps (the zygote it forks from, the copy of the code it runs)."""

    def __init__(self, cwd: Path, scratch: Path, interpret: bool, gpu: str | None = None, limits: Limits | None = None,
                 isolation: Isolation | str = "sandbox", writable: Sequence[Path] = (), hide: Sequence[Path] = (),
                 job: Path | None = None, command: list[str] | None = None, triton_cache: Path | None = None,
                 probe: str | None = None, keep_autotuning: bool = False, *, settings: Settings,
                 sandbox: SandboxState, readable: Sequence[Path] = (), loopback: bool = False) -> None:
        self.isolation = isolation if isinstance(isolation, Isolation) else detect(isolation, settings, sandbox)
        self.backend = backend_for(self.isolation)
        self._status = b""
        scratch.mkdir(parents=True, exist_ok=True)
        limits = limits or Limits()
        writable = [Path(cwd), Path(scratch), *map(Path, writable)]
        for w in writable:
            w.mkdir(parents=True, exist_ok=True)
        job = Path(job or os.path.commonpath([cwd, scratch]))
        env = worker_env(scratch, interpret, gpu, settings.threads)
        if triton_cache is not None:  # the trusted worker's, shared by a run (never a student's)
            env["TRITON_CACHE_DIR"] = str(triton_cache)
        if triton_cache is not None or keep_autotuning:
            # @triton.autotune's choice kept in the Triton cache with the kernels: the reference is
            # tuned once per run (every student then times against the same configuration), and
            # a check's kept kernels are not tuned again on the next check
            env["TRITON_CACHE_AUTOTUNING"] = "1"
        launch = Launch(Path(cwd), Path(scratch), job, writable, list(hide), env, limits, interpret, gpu, command,
                        probe, settings=settings, readable=[Path(r) for r in readable], loopback=loopback)
        self.started = self.backend.start(launch, self.isolation, sandbox)  # the one start, whatever the backend
        self.proc = self.started.proc
        self._rx, self._tx = self.started.rx, self.started.tx
        self._status_rx, self._lifeline = self.started.status_rx, self.started.lifeline
        self.lease = self.started.lease
        self.output = CappedOutput(self.proc.stdout)
        self._buffer = b""

    # -- requests --------------------------------------------------------------------------------
    def request(self, message: protocol.Request, timeout: float) -> protocol.Reply | Failure:
        """The worker's reply to `message`: the reply its type expects, or the worker's Failure
        (the student's code raised, say). A reply of any other shape is the worker's fault:
        it is killed and WorkerFailure("crashed") raised, as for one that never comes."""
        self._send(message)
        line = self._read_reply(time.monotonic() + timeout, timeout)
        try:
            return protocol.decode_reply(message, line)
        except protocol.ProtocolError as exc:
            self.kill()
            raise WorkerFailure("crashed", f"the worker sent a malformed reply: {exc}", self.output.text()) from None

    def unasked(self) -> bool:
        """Whether the worker has written anything it was not asked for yet: a reply sent ahead
        would end a request the grading process times by its own clock before the work is done."""
        while select.select([self._rx], [], [], 0)[0]:
            chunk = os.read(self._rx, 1 << 16)
            if not chunk:
                break
            self._buffer += chunk
            if len(self._buffer) > MAX_REPLY_BYTES:
                break
        return bool(self._buffer)

    def _send(self, message: protocol.Request) -> None:
        try:
            os.write(self._tx, protocol.encode(message).encode())
        except BrokenPipeError:
            pass  # it died already; reading says how

    def _read_reply(self, deadline: float, timeout: float) -> bytes:
        while b"\n" not in self._buffer:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                self.kill()
                raise WorkerFailure("timeout", f"no answer within {timeout:.0f} s: killed", self.output.text())
            ready, _, _ = select.select([self._rx], [], [], min(remaining, 1.0))
            if not ready:
                if self.proc.poll() is not None:  # gone, though a pipe end is still held somewhere
                    raise self._died()
                continue
            chunk = os.read(self._rx, 1 << 16)
            if not chunk:
                raise self._died()
            self._buffer += chunk
            if len(self._buffer) > MAX_REPLY_BYTES:
                self.kill()
                raise WorkerFailure("crashed", "the worker's reply channel was flooded", self.output.text())
        line, self._buffer = self._buffer.split(b"\n", 1)
        return line

    def status(self) -> dict:
        """What the sandbox's init reported about the worker's end ({} if nothing)."""
        if self._status_rx >= 0:
            while True:
                ready, _, _ = select.select([self._status_rx], [], [], 0)
                if not ready:
                    break
                chunk = os.read(self._status_rx, 4096)
                if not chunk:
                    break
                self._status += chunk
        report: dict = {}
        for line in self._status.splitlines():
            try:
                report.update(json.loads(line))
            except ValueError:
                pass
        return report

    def _died(self) -> WorkerFailure:
        try:
            code = self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.kill()
            code = self.proc.wait()
        self.kill()  # whatever it left behind
        status = self.status()
        if "setup_error" in status:
            return WorkerFailure("infra_error",
                                 f"the sandbox failed (not the submission's fault): {status['setup_error']}",
                                 self.output.text())
        if "signal" in status:
            code = -status["signal"]
        elif "exit" in status:
            code = status["exit"]
        else:
            code = self.backend.exit_code(code)  # docker: a signal is 128 + its number
        if code < 0:
            name = signal.Signals(-code).name
            how = f"killed by signal {name}" + {"SIGSEGV": " (segmentation fault)", "SIGABRT": " (abort)",
                                                "SIGXCPU": " (CPU time limit)",
                                                "SIGXFSZ": " (file size limit)"}.get(name, "")
        else:
            how = f"exited with status {code} (sys.exit, os._exit or a fatal error)"
        return WorkerFailure("crashed", f"the worker process died: {how}", self.output.text())

    def kill(self) -> None:
        """Kill the worker and everything it started: what its backend started beyond the
        process group (a PID namespace, a container), then the group; returns once reaped."""
        self.backend.kill(self.started, self.isolation)
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        self.proc.wait()

    def close(self) -> None:
        try:
            os.write(self._tx, protocol.encode(protocol.Exit()).encode())
        except OSError:
            pass
        try:
            self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            pass
        self.kill()
        self.backend.cleanup(self.started)
        for fd in (self._rx, self._tx, self._status_rx, self._lifeline):
            if fd >= 0:
                try:
                    os.close(fd)
                except OSError:
                    pass
        self._rx = self._tx = self._status_rx = self._lifeline = -1
        if self.lease:
            self.lease.release()
            self.lease = None
