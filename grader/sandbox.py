"""Start and talk to a worker process, and contain it.

A worker is a fresh interpreter in its own session and process group, with a scrubbed
environment, its own Triton cache and temp dir, resource limits, and stdout/stderr captured
with head and tail kept. Requests and replies go over a private pipe pair, never stdout, so
printing cannot forge a reply. A reply that does not come in time, or a worker that dies,
raises here; the caller records the outcome and starts a fresh worker for what is left.
"""

from __future__ import annotations

import json
import os
import resource
import select
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import grader

PACKAGE_PARENT = str(Path(grader.__file__).resolve().parent.parent)
MAX_REPLY_BYTES = 16 << 20


class WorkerFailure(Exception):
    """The worker did not answer: `outcome` is "timeout" or "crashed"."""

    def __init__(self, outcome: str, message: str, output: str) -> None:
        super().__init__(message)
        self.outcome = outcome
        self.message = message
        self.output = output


class CappedOutput:
    """Keeps the first and last `keep` bytes of a stream and counts what was cut between,
    so 100 MB of prints cost neither memory nor the useful end of a traceback."""

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
            self.tail = (self.tail + chunk)[-self.keep :]

    def text(self) -> str:
        self.thread.join(timeout=2)
        elided = self.total - len(self.head) - len(self.tail)
        middle = f"\n[... {elided} bytes of output elided ...]\n" if elided > 0 else ""
        return (bytes(self.head) + middle.encode() + bytes(self.tail)).decode("utf-8", "replace")


@dataclass
class Limits:
    file_size: int = 4 << 30  # a worker writes outputs; a 100 GB file is an attack
    open_files: int = 1024
    cpu_seconds: int = 3600


def _apply_limits(limits: Limits) -> None:
    resource.setrlimit(resource.RLIMIT_FSIZE, (limits.file_size, limits.file_size))
    resource.setrlimit(resource.RLIMIT_NOFILE, (limits.open_files, limits.open_files))
    resource.setrlimit(resource.RLIMIT_CPU, (limits.cpu_seconds, limits.cpu_seconds))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))


def worker_env(scratch: Path, interpret: bool, gpu: str | None) -> dict[str, str]:
    """Only what a worker needs: no tokens, no seed, no grader settings."""
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": str(scratch),
        "TMPDIR": str(scratch),
        "LANG": "C.UTF-8",
        "PYTHONPATH": PACKAGE_PARENT,
        "PYTHONUNBUFFERED": "1",
        "PYTHONDONTWRITEBYTECODE": "1",
        "TRITON_CACHE_DIR": str(scratch / "triton-cache"),
    }
    if interpret:
        env["TRITON_INTERPRET"] = "1"
        env["CUDA_VISIBLE_DEVICES"] = ""
    elif gpu is not None:
        env["CUDA_VISIBLE_DEVICES"] = gpu
    for var in ("LD_LIBRARY_PATH", "CUDA_HOME", "OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE"):
        if var in os.environ:
            env[var] = os.environ[var]
    return env


class WorkerProcess:
    def __init__(self, cwd: Path, scratch: Path, interpret: bool, gpu: str | None = None, limits: Limits | None = None) -> None:
        scratch.mkdir(parents=True, exist_ok=True)
        child_rx, self._tx = os.pipe()
        self._rx, child_tx = os.pipe()
        limits = limits or Limits()
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "grader.worker", str(child_rx), str(child_tx)],
            cwd=cwd,
            env=worker_env(scratch, interpret, gpu),
            pass_fds=(child_rx, child_tx),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            preexec_fn=lambda: _apply_limits(limits),
        )
        os.close(child_rx)
        os.close(child_tx)
        self.output = CappedOutput(self.proc.stdout)
        self._buffer = b""

    def request(self, message: dict, timeout: float) -> dict:
        self._send(message)
        return self._read_reply(time.monotonic() + timeout, timeout)

    def request_timed(self, message: dict, timeout: float) -> tuple[dict, float]:
        """For a `time` request: the worker says "timing" just before its timed loop; the
        milliseconds from that line to the reply are measured here, outside the worker,
        where student code cannot touch the clock."""
        self._send(message)
        deadline = time.monotonic() + timeout
        first = self._read_reply(deadline, timeout)
        if first.get("phase") != "timing":
            return first, float("nan")
        start = time.monotonic()
        reply = self._read_reply(deadline, timeout)
        return reply, (time.monotonic() - start) * 1e3

    def _send(self, message: dict) -> None:
        try:
            os.write(self._tx, (json.dumps(message) + "\n").encode())
        except BrokenPipeError:
            pass  # it died already; reading says how

    def _read_reply(self, deadline: float, timeout: float) -> dict:
        while b"\n" not in self._buffer:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                self.kill()
                raise WorkerFailure("timeout", f"no answer within {timeout:.0f} s: killed", self.output.text())
            ready, _, _ = select.select([self._rx], [], [], remaining)
            if not ready:
                continue
            chunk = os.read(self._rx, 1 << 16)
            if not chunk:
                raise self._died()
            self._buffer += chunk
            if len(self._buffer) > MAX_REPLY_BYTES:
                self.kill()
                raise WorkerFailure("crashed", "the worker's reply channel was flooded", self.output.text())
        line, self._buffer = self._buffer.split(b"\n", 1)
        try:
            return json.loads(line)
        except ValueError:
            self.kill()
            raise WorkerFailure("crashed", "the worker sent a malformed reply", self.output.text()) from None

    def _died(self) -> WorkerFailure:
        try:
            code = self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.kill()
            code = self.proc.wait()
        self.kill()  # whatever it left behind in its group
        if code < 0:
            name = signal.Signals(-code).name
            how = f"killed by signal {name}" + (" (segmentation fault)" if name == "SIGSEGV" else "")
        else:
            how = f"exited with status {code} (os._exit or a fatal error)"
        return WorkerFailure("crashed", f"the worker process died: {how}", self.output.text())

    def kill(self) -> None:
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        self.proc.wait()

    def close(self) -> None:
        try:
            os.write(self._tx, b'{"op": "exit"}\n')
        except OSError:
            pass
        try:
            self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            pass
        self.kill()
        for fd in (self._rx, self._tx):
            try:
                os.close(fd)
            except OSError:
                pass
