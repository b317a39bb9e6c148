"""The grader's side of a zygote: `Zygote` (start or attach, fork a worker, learn how each fork
ended), `Forked` (a fork as the sandbox sees a Popen) and `SandboxState`, what one grading
session's sandbox keeps: its zygotes, one per (interpreter, GPU) setting, warm where `keep_warm`
named a folder, whether they failed, the workers' copy of the code and the probed isolations."""

from __future__ import annotations

import atexit
import errno
import json
import os
import secrets
import shutil
import signal
import socket
import stat
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from grader.safefiles import UnsafeFileError, UnsafeFolderError, make_folder, peer_uid, trusted_folder
from grader.sandbox.interpreter import PACKAGE_PARENT, unnamed_python
from grader.sandbox.isolation import Isolation
from grader.sandbox.launch import copy_worker_code
from grader.sandbox.zygote.server import MAX_MESSAGE, _at
from grader.sandbox.zygote.warm import warm_name

# one line each, written to the zygote's stdin (interpreter.FROM_STDIN): a fork's command line is the zygote's
BOOT = "import sys; sys.path.insert(0, {path!r}); from grader.sandbox.zygote.server import serve; serve({fd}, {parent})"
WARM_BOOT = ("import sys; sys.path.insert(0, {path!r}); from grader.sandbox.zygote.server import serve_warm; "
             "serve_warm({socket!r}, {idle!r})")


def _boot(proc: subprocess.Popen, code: str) -> None:
    """Give a zygote started with interpreter.unnamed_python its code (it waits on its stdin for it)."""
    assert proc.stdin is not None  # started with stdin=PIPE
    try:
        proc.stdin.write((code + "\n").encode())
        proc.stdin.close()
    except BrokenPipeError:
        pass  # it died at once: its end says why


class ZygoteError(OSError):
    """The zygote could not be started or did not answer: workers start the old way instead."""


class Zygote:
    """A running zygote for one (interpreter, GPU) setting: this job process's own, or, where
    `keep_warm` named a folder, the warm one there that outlives this command."""

    def __init__(self, env: dict[str, str], warm: tuple[Path, float] | None = None) -> None:
        self.proc: subprocess.Popen | None = None
        self.home: str | None = None
        self.started_here = True
        ours: socket.socket | None
        if warm is not None:
            ours = self._attach_warm(warm[0], warm[1], env)
        else:
            ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
            self.home = tempfile.mkdtemp(prefix="grader-zygote-")
            env = dict(env, HOME=self.home, TMPDIR=self.home)
            try:
                self.proc = subprocess.Popen(unnamed_python(), pass_fds=(theirs.fileno(),), env=env, cwd="/",
                                             stdin=subprocess.PIPE, start_new_session=True)
                _boot(self.proc, BOOT.format(path=PACKAGE_PARENT, fd=theirs.fileno(), parent=os.getpid()))
            except OSError as exc:
                raise ZygoteError(f"the zygote could not start: {exc}") from None
            finally:
                theirs.close()
        self.lock = threading.Lock()  # one request at a time
        self.replies: list[dict] = []
        self.cond = threading.Condition()
        self.exited: dict[int, int] = {}
        self.sock: socket.socket | None = None
        if ours is not None:
            self._connected(ours)

    def _connected(self, sock: socket.socket) -> None:
        self.sock = sock
        self.reader = threading.Thread(target=self._read, daemon=True, name="zygote-reader")
        self.reader.start()

    def _read(self) -> None:
        assert self.sock is not None  # the reader starts once connected
        while True:
            try:
                data = self.sock.recv(MAX_MESSAGE)
            except OSError:
                data = b""
            with self.cond:
                if not data:
                    self.dead = True
                    self.cond.notify_all()
                    return
                message = json.loads(data)
                if "exited" in message:
                    self.exited[message["exited"]] = message["status"]
                else:
                    self.replies.append(message)
                self.cond.notify_all()

    dead = False

    def _attach_warm(self, folder: Path, idle: float, env: dict[str, str]) -> socket.socket | None:
        """Connect to the warm zygote for this environment and this grader's code, starting it
        (detached, in its own session) when none answers; one starter at a time (a lock). The
        folder is pinned once (`trusted_folder`: ours, 0700, nobody else may change its path) and
        its socket, lock, log and the zygote's home are reached through that descriptor alone,
        never by path again; a socket answered by another user's process is never used."""
        name = warm_name(env)
        try:
            self._folder = trusted_folder(folder, "warm workers' folder")
        except UnsafeFolderError as exc:
            raise ZygoteError(str(exc)) from None
        try:
            lock = _open_plain_for_write(f"{name}.lock", self._folder, os.O_RDWR)
        except OSError as exc:
            raise ZygoteError(f"the warm zygote's lock in {folder}: {exc}") from None
        path = f"/proc/self/fd/{self._folder}/{name}.sock"
        try:
            import fcntl

            fcntl.flock(lock, fcntl.LOCK_EX)
            sock = _connect(path)
            if sock is not None:
                self.started_here = False
                return sock
            self._starting = (path, lock, time.monotonic() + 300)
            lock = -1  # held until the new zygote answers (`_ready`): a second command waits, not starts another
            home_name = f"{name}.home-{secrets.token_hex(6)}"  # its own: removed when it ends
            os.close(make_folder(home_name, 0o700, self._folder))
            home = folder / home_name  # by path for its HOME: the folder's path is one only we may change
            log = _open_plain_for_write(f"{name}.log", self._folder, os.O_WRONLY | os.O_APPEND)
            try:
                # the zygote binds its socket through the same folder's descriptor, handed to it
                proc = subprocess.Popen(unnamed_python(), env=dict(env, HOME=str(home), TMPDIR=str(home)), cwd="/",
                                        stdin=subprocess.PIPE, stdout=log, stderr=log, start_new_session=True,
                                        pass_fds=(self._folder,))
                _boot(proc, WARM_BOOT.format(path=PACKAGE_PARENT, socket=path, idle=float(idle)))
            except OSError as exc:
                os.close(self._starting[1])
                self._starting = None
                shutil.rmtree(home, ignore_errors=True)
                raise ZygoteError(f"the warm zygote could not start: {exc}") from None
            finally:
                os.close(log)
            self.proc_starting = proc  # its imports overlap whatever this command does first
            return None
        finally:
            if lock >= 0:
                os.close(lock)

    _folder = -1
    _starting: tuple | None = None
    proc_starting: subprocess.Popen | None = None

    def _ready(self) -> None:
        """Connect to the warm zygote this command started, once it has imported and answers."""
        if self.sock is not None:
            return
        assert self._starting is not None and self.proc_starting is not None  # a warm zygote being started
        path, lock, deadline = self._starting
        try:
            while time.monotonic() < deadline:
                sock = _connect(path)
                if sock is not None:
                    self._connected(sock)
                    return
                if self.proc_starting.poll() is not None:
                    self.dead = True
                    raise ZygoteError(f"the warm zygote ended (status {self.proc_starting.returncode}): see its "
                                      f"log, {os.path.basename(path).removesuffix('.sock')}.log in the warm folder")
                time.sleep(0.05)
            self.proc_starting.kill()
            self.dead = True
            raise ZygoteError("the warm zygote did not start within 300 s")
        finally:
            if self.sock is not None or self.dead:
                os.close(lock)
                self._starting = (path, -1, deadline)

    def alive(self) -> bool:
        if self.sock is None and self.proc_starting is not None:
            return not self.dead and self.proc_starting.poll() is None
        return not self.dead and (self.proc is None or self.proc.poll() is None)

    def fork(self, request: dict, fds: dict[str, int | list[int]], timeout: float = 300) -> int:
        """Send a worker's configuration and its descriptors; the pid of its process A."""
        flat: list[int] = []
        names: dict[str, int | list[int]] = {}
        for name, value in fds.items():
            if isinstance(value, list):
                names[name] = list(range(len(flat), len(flat) + len(value)))
                flat += value
            else:
                names[name] = len(flat)
                flat.append(value)
        with self.lock:
            self._ready()
            assert self.sock is not None  # _ready connected it, or raised
            try:
                socket.send_fds(self.sock, [json.dumps(dict(request, fds=names)).encode()], flat)
            except OSError as exc:
                raise ZygoteError(f"the zygote is gone: {exc}") from None
            with self.cond:
                if not self.cond.wait_for(lambda: self.replies or self.dead, timeout):
                    raise ZygoteError(f"the zygote did not answer within {timeout:.0f} s")
                if not self.replies:
                    raise ZygoteError(f"the zygote ended (status {self.proc.poll() if self.proc else 'unknown'})")
                return self.replies.pop(0)["pid"]

    def wait_for(self, pid: int, timeout: float | None) -> int | None:
        with self.cond:
            self.cond.wait_for(lambda: pid in self.exited or self.dead, timeout)
            return self.exited.get(pid)

    def close(self) -> None:
        if self.sock is not None:
            try:  # shutdown first: a close alone neither wakes our reader blocked in recv nor tells the zygote
                self.sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            try:
                self.sock.close()
            except OSError:
                pass
        if self._starting is not None and self._starting[1] >= 0:
            os.close(self._starting[1])  # never connected: let the next command wait for it instead
            self._starting = None
        if self._folder >= 0:
            os.close(self._folder)
            self._folder = -1
        if self.proc is None:  # a warm zygote: it stays for the next command
            return
        try:
            self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        if self.home is not None:
            shutil.rmtree(self.home, ignore_errors=True)


def _connect(path: Path | str) -> socket.socket | None:
    """A connection to the zygote listening at `path`, checked to be this user's own process
    (SO_PEERCRED) before anything is sent; None where none answers. ZygoteError where another
    user's process answers: nothing is sent to it, and workers start the old way."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET | socket.SOCK_CLOEXEC)
    try:
        _at(path, sock.connect)
    except OSError:  # none there, or one that stopped answering (its file is replaced below)
        sock.close()
        return None
    uid = peer_uid(sock)
    if uid != os.getuid():
        sock.close()
        raise ZygoteError(f"the warm zygote's socket {os.path.basename(path)} is answered by uid {uid}, not by this "
                          f"user: nothing sent to it")
    return sock


def _open_plain_for_write(name: str, dir_fd: int, flags: int) -> int:
    """`name` in the pinned folder `dir_fd`, made 0600 where missing: never through a link, never
    blocking on a FIFO, nothing but a regular file."""
    fd = os.open(name, flags | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, 0o600, dir_fd=dir_fd)
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise UnsafeFileError(errno.EINVAL, f"{name} is not a plain file")
    return fd


class Forked:
    """A worker's process A as the sandbox sees a Popen: pid, poll, wait, stdout."""

    def __init__(self, zygote: Zygote, pid: int, stdout) -> None:
        self.zygote, self.pid, self.stdout, self.stdin = zygote, pid, stdout, None
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None:
            status = self.zygote.exited.get(self.pid)
            if status is not None:
                self.returncode = os.waitstatus_to_exitcode(status)
            elif self.zygote.dead:
                self.returncode = -signal.SIGKILL if not _exists(self.pid) else None
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while (code := self.poll()) is None:
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                raise subprocess.TimeoutExpired("worker", timeout or 0)
            self.zygote.wait_for(self.pid, 0.5 if left is None else min(left, 0.5))
        return code


def _exists(pid: int) -> bool:
    try:
        os.kill(pid, 0)
        return True
    except ProcessLookupError:
        return False
    except PermissionError:
        return True


class SandboxState:
    """What the sandbox keeps for one grading session, made once by whoever opens it (a session's
    resources, `grader check`'s set-up, a replay's caller) and handed down with its settings: the
    zygotes its workers fork from, one per environment (`zygote`), warm ones in a folder once
    `keep_warm` named it, the reason they were turned off once one failed (`disabled`), the
    workers' private copy of the code (`worker_code`) and what each isolation was found to allow
    here (`isolations`, grader.sandbox.process.detect). Its zygotes end with it (`close`) or with
    this process."""

    def __init__(self) -> None:
        self._zygotes: dict[tuple, Zygote] = {}
        self._lock = threading.Lock()
        self._warm: tuple[Path, float] | None = None
        self.disabled: str | None = None
        self._code: Path | None = None
        self._code_lock = threading.Lock()
        self.isolations: dict[tuple, Isolation] = {}
        atexit.register(self.close)

    def disable(self, why: str) -> None:
        """No zygote for the rest of this session (said once on stderr: it costs speed, not safety)."""
        if self.disabled is None:
            print(f"warning: workers start as fresh interpreters: {why}", file=sys.stderr, flush=True)
            self.disabled = why

    def keep_warm(self, folder: Path, idle: float) -> None:
        """This session's zygotes are the warm ones in `folder` (grader check: kept between
        commands for `idle` seconds); set before the first worker starts."""
        if idle > 0 and not self._zygotes:
            self._warm = (Path(folder), float(idle))

    def zygote(self, key: tuple, env: dict[str, str]) -> Zygote:
        """This session's zygote for `key` (started on first use, restarted if it died)."""
        with self._lock:
            z = self._zygotes.get(key)
            if z is None or not z.alive():
                if z is not None:
                    z.close()
                z = self._zygotes[key] = Zygote(env, self._warm)
            return z

    def worker_code(self) -> Path:
        """The private read-only copy of the grader code this session's workers run
        (grader.sandbox.launch.copy_worker_code), made on first use."""
        with self._code_lock:
            if self._code is None or not (self._code / "grader" / "worker" / "server.py").is_file():
                self._code = copy_worker_code()
            return self._code

    def close(self) -> None:
        """Close this session's zygotes (a warm one stays for the next check)."""
        with self._lock:
            for z in self._zygotes.values():
                z.close()
            self._zygotes.clear()
