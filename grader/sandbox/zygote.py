"""A warm start for workers: a fork server that has imported torch and Triton once.

Starting a worker used to cost a fresh interpreter importing torch and Triton (2-4 s on a CPU
machine, about 10 s on the GPU machine), three or four times per job. A zygote is a process
started exactly as a worker would be (`python -I`, the worker's scrubbed environment, no CUDA
context: nothing has touched the GPU) that imports torch, Triton, numpy, safetensors and
grader.worker, and then only forks. Each fork goes through the same steps as a worker started
by `grader.sandbox.namespaces` with `unshare` and `grader.sandbox.init`:

  fork (A, the `unshare --fork --kill-child` of the exec path): its own session, output to the
  grader's pipe, every other descriptor closed, the worker's environment; unshare(2) of the
  network, PID and mount namespaces (and a user namespace mapping the grader to root when it
  is not root); mount propagation made private;
  fork (the init, PID 1 of the new PID namespace): a fresh /proc, then `sandbox_init.main`:
  the private view of the files, a fork for the worker, which drops every capability and to the
  job's uid, sets its limits and no_new_privs, points its `grader` package at the worker's own
  copy of the code, and runs `grader.worker.server.serve` where the exec path would exec it.

So a worker's namespaces, view, uid and limits are the same; only the interpreter is not new.
What it shares with the zygote is what every worker of this grader loads anyway: the imported
modules of torch, Triton, numpy and safetensors and the grader's worker module. The zygote
never holds anything private: it is started from the worker's environment, not forked from
the grader, holds no seed, input, reference or student file, and imports no student code;
every fork is single use. A zygote serves one job process (its pipes die with it) and one
(interpreter, GPU) setting; it dies with that process (PR_SET_PDEATHSIG).

The grader talks to it over a Unix socket: a request is the worker's configuration as JSON
with its pipe ends as SCM_RIGHTS; the reply is the pid of A; the zygote reports each A's wait
status when it ends, so the grader sees exit codes as it would of its own child.
"""

from __future__ import annotations

import atexit
import ctypes
import json
import os
import select
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from grader.sandbox.launch import Launch, Started

CLONE_NEWNS, CLONE_NEWUSER, CLONE_NEWPID, CLONE_NEWNET = 0x00020000, 0x10000000, 0x20000000, 0x40000000
MS_NOSUID, MS_NODEV, MS_NOEXEC, MS_REC, MS_PRIVATE = 2, 4, 8, 16384, 1 << 18
MAX_MESSAGE = 1 << 20
PRELOAD = ("import numpy, safetensors.torch, torch, triton, grader.worker.server, grader.worker.memcheck\n"
           "if os.environ.get('TRITON_INTERPRET') == '1':\n"
           "    import triton.runtime.interpreter\n"
           "else:\n"
           "    import grader.worker.timing, torch.profiler\n"
           # what grader.worker sets first anyway; its first call imports for seconds
           "torch.use_deterministic_algorithms(True, warn_only=True)\n"
           "torch.utils.deterministic.fill_uninitialized_memory = True\n"
           "if torch.cuda.is_initialized():\n"
           "    raise SystemExit('a zygote must not hold a CUDA context')\n")
BOOT = "import sys; sys.path.insert(0, {path!r}); from grader.sandbox.zygote import serve; serve(int(sys.argv[1]), int(sys.argv[2]))"
WARM_BOOT = ("import sys; sys.path.insert(0, {path!r}); from grader.sandbox.zygote import serve_warm; "
             "serve_warm(sys.argv[1], float(sys.argv[2]))")


class ZygoteError(OSError):
    """The zygote could not be started or did not answer: workers start the old way instead."""


_DISABLED: list[str] = []


def enabled() -> bool:
    """GRADER_ZYGOTE=0 starts every worker as a fresh interpreter (the exec path), as before;
    so does a process whose zygote failed once."""
    return os.environ.get("GRADER_ZYGOTE", "1") != "0" and sys.platform.startswith("linux") and not _DISABLED


def disable(why: str) -> None:
    """No zygote for the rest of this process (said once on stderr: it costs speed, not safety)."""
    if not _DISABLED:
        print(f"warning: workers start as fresh interpreters: {why}", file=sys.stderr, flush=True)
    _DISABLED.append(why)


# -- the zygote process ----------------------------------------------------------------------------

def serve(fd: int, parent: int) -> None:
    """The zygote of one job process: fork a worker per request, report each one's end; gone
    with that process (its socket's end, or PR_SET_PDEATHSIG)."""
    from grader.sandbox.init import prctl

    prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG: gone with the job process that started it
    if os.getppid() != parent:  # it died before the line above
        os._exit(1)
    exec(PRELOAD, {"os": os})  # noqa: S102 - our own constant: the modules every worker needs
    _loop([socket.socket(fileno=fd)])


def serve_warm(path: str, idle: float) -> None:
    """A zygote that outlives the `grader check` that started it, so the next check forks its
    workers at once: it listens at `path` (a socket in the check's cache folder: 0700, hidden
    from every worker), serves each connecting grader process of this user as the private
    zygote serves its one, kills what a client forked when that client goes, and ends after
    `idle` seconds without a client. It is published (the socket renamed into place) only
    once its imports are done."""
    exec(PRELOAD, {"os": os})  # noqa: S102 - our own constant: the modules every worker needs
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    tmp = f"{path}.{os.getpid()}.tmp"
    _at(tmp, listener.bind)
    listener.listen(16)
    os.replace(tmp, path)
    published = os.stat(path).st_ino
    try:
        _loop([], listener, idle)
    finally:
        try:  # ours still (not a newer zygote's, published after we stopped answering)
            if os.stat(path).st_ino == published:
                os.unlink(path)
        except OSError:
            pass
        shutil.rmtree(os.environ.get("HOME", "/nonexistent/home"), ignore_errors=True)
        os._exit(0)


def _loop(clients: list[socket.socket], listener: socket.socket | None = None, idle: float = 0.0) -> None:
    """Fork a worker per request of any client; report each fork's end to the client that
    asked for it. Without a listener, the zygote ends with its one client."""
    wake_r, wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    owner: dict[int, socket.socket | None] = {}  # fork -> its client (None: that client is gone)
    quiet_since = time.monotonic()
    while True:
        if listener is None and not clients:
            os._exit(0)  # a private zygote's one client is gone
        waiting = [wake_r, *clients] + ([listener] if listener is not None else [])
        timeout = None
        if listener is not None and not clients and not owner:
            timeout = max(0.0, idle - (time.monotonic() - quiet_since))
        try:
            ready, _, _ = select.select(waiting, [], [], timeout)
        except InterruptedError:
            continue
        if not ready and timeout is not None:
            return  # idle long enough
        if wake_r in ready:
            while True:
                try:
                    if not os.read(wake_r, 4096):
                        break
                except BlockingIOError:
                    break
        for pid in list(owner):  # reap our own forks only
            try:
                done, status = os.waitpid(pid, os.WNOHANG)
            except ChildProcessError:
                owner.pop(pid)
                continue
            if done:
                client = owner.pop(pid)
                if client is not None and not _send(client, {"exited": pid, "status": status}):
                    _drop(client, clients, owner)
        if listener is not None and listener in ready:
            try:
                conn, _ = listener.accept()
            except OSError:
                conn = None
            if conn is not None:
                if _peer_uid(conn) == os.getuid():  # the folder is ours alone; this says so again
                    clients.append(conn)
                else:
                    conn.close()
        for client in [c for c in clients if c in ready]:
            try:
                data, fds, _, _ = socket.recv_fds(client, MAX_MESSAGE, 16)
            except OSError:
                data, fds = b"", []
            if not data:  # that grader process is gone: so is what it forked
                _drop(client, clients, owner)
                continue
            request = json.loads(data)
            pid = os.fork()
            if pid == 0:
                signal.set_wakeup_fd(-1)
                signal.signal(signal.SIGCHLD, signal.SIG_DFL)
                others = [c.fileno() for c in clients] + ([listener.fileno()] if listener is not None else [])
                _child(request, fds, keep_out=(*others, wake_r, wake_w))  # never returns
            owner[pid] = client
            for f in fds:
                os.close(f)
            if not _send(client, {"pid": pid}):
                _drop(client, clients, owner)
        if clients or owner:
            quiet_since = time.monotonic()


def _drop(client: socket.socket, clients: list[socket.socket], owner: dict) -> None:
    """A client gone: kill what it forked (each fork leads its own session), forget it."""
    if client in clients:
        clients.remove(client)
    for pid, who in list(owner.items()):
        if who is client:
            owner[pid] = None
            try:
                os.killpg(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
    try:
        client.close()
    except OSError:
        pass


def _peer_uid(conn: socket.socket) -> int:
    import struct

    try:
        _, uid, _ = struct.unpack("3i", conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i")))
        return uid
    except OSError:
        return -1


def _send(sock: socket.socket, message: dict) -> bool:
    try:
        sock.send(json.dumps(message).encode())
        return True
    except OSError:
        return False


def _child(request: dict, fds: list[int], keep_out: tuple[int, ...]) -> None:
    """Process A: what `unshare --fork --kill-child` and the init's exec did, without the exec."""
    status = None
    try:
        names = request["fds"]  # name -> index in fds
        config = request["config"]
        status = fds[names["status_fd"]]
        out = fds[names["output"]]
        for f in keep_out:
            os.close(f)
        os.setsid()
        from grader.sandbox.init import prctl

        prctl(1, signal.SIGKILL)  # gone with the zygote, which is gone with the job process
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.dup2(out, 1)
        os.dup2(out, 2)
        os.close(null)
        os.close(out)
        # the descriptors as numbered here (they came over the socket)
        config["status_fd"], config["lifeline_fd"] = fds[names["status_fd"]], fds[names["lifeline_fd"]]
        config["pass_fds"] = [fds[i] for i in names["pass"]]
        _close_others({config["status_fd"], config["lifeline_fd"], *config["pass_fds"]})
        os.environ.clear()
        os.environ.update(config["env"])
        tempfile.tempdir = None  # the zygote's TMPDIR is not the worker's
        if request["mode"] == "none":
            from grader.sandbox.init import apply_limits

            apply_limits(config["limits"])
            os.chdir(config["cwd"])
            for f in (config["status_fd"], config["lifeline_fd"]):
                os.close(f)
            run_worker(config["pass_fds"])
        if request.get("namespaces"):
            _unshare(request.get("user_namespace", False))
            init = os.fork()
            if init == 0:
                from grader.sandbox.init import prctl

                prctl(1, signal.SIGKILL)  # --kill-child: the init dies with A
                _mount_proc()
                _run_init(config, request.get("probe"))
            _wait_and_exit(init)
        _run_init(config, request.get("probe"))
    except BaseException as exc:  # noqa: BLE001 - say why on the status pipe if we can, then go
        try:
            os.write(status, (json.dumps({"setup_error": f"the zygote could not start a worker: {exc}"}) + "\n").encode())
        except Exception:  # noqa: BLE001
            pass
    os._exit(125)


def _run_init(config: dict, probe: str | None) -> None:
    from grader.sandbox.init import main

    start = (lambda: _run_probe(probe, config.get("code"))) if probe else (lambda: run_worker(config["pass_fds"], config.get("code")))
    os._exit(main(config, start=start))


def _use_worker_code(code: str | None) -> None:
    """A fork imports what it has not yet imported from the worker's own copy of the code
    (launch.worker_code), where an exec'd worker's bootstrap imports all of it: the zygote's
    grader package lies in the course folder, which the worker's view does not hold."""
    if not code:
        return
    import grader
    import grader.worker

    zygotes = os.path.dirname(os.path.dirname(grader.__file__))  # the folder the zygote's BOOT put first
    grader.__path__[:] = [os.path.join(code, "grader")]
    grader.worker.__path__[:] = [os.path.join(code, "grader", "worker")]
    sys.path[:] = [code] + [p for p in sys.path if p not in (code, zygotes)]
    for name in [m for m in sys.modules if m == "grader" or m.startswith("grader.")]:
        module = sys.modules[name]
        if name.split(".")[1:2] in ([], ["codec"], ["protocol"], ["worker"]):
            if getattr(module, "__file__", None):  # where an exec'd worker's import found it
                module.__file__ = os.path.join(code, os.path.relpath(module.__file__, zygotes))
        else:
            del sys.modules[name]  # grader.sandbox, imported by the zygote: not what a worker imports


def run_worker(channel: list[int], code: str | None = None) -> None:
    """What the exec'd worker's bootstrap would run."""

    def serve() -> None:
        _use_worker_code(code)
        from grader.worker.server import serve as serve_worker

        serve_worker(int(channel[0]), int(channel[1]))

    _exit_after(serve)


def _run_probe(code: str, worker_code: str | None = None) -> None:
    _exit_after(lambda: (_use_worker_code(worker_code), exec(code, {"__name__": "__probe__"})))  # noqa: S102 - the sandbox's own probe (process.PROBE)


def _exit_after(body: Callable[[], None]) -> None:
    """Run `body` as an interpreter's main would end: its SystemExit's status, or a traceback on
    stderr and status 1; output flushed, then exit without running the zygote's own cleanup."""
    code = 0
    try:
        body()
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
    except BaseException:  # noqa: BLE001
        import traceback

        traceback.print_exc()
        code = 1
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def _close_others(keep: set[int]) -> None:
    for entry in os.listdir("/proc/self/fd"):
        fd = int(entry)
        if fd > 2 and fd not in keep:
            try:
                os.close(fd)
            except OSError:
                pass


def _libc():
    return ctypes.CDLL(None, use_errno=True)


def _unshare(user_namespace: bool) -> None:
    uid, gid = os.getuid(), os.getgid()
    flags = CLONE_NEWNS | CLONE_NEWPID | CLONE_NEWNET | (CLONE_NEWUSER if user_namespace else 0)
    if _libc().unshare(flags) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"unshare: {os.strerror(err)}")
    if user_namespace:  # as `unshare --map-root-user`
        Path("/proc/self/setgroups").write_text("deny")
        Path("/proc/self/uid_map").write_text(f"0 {uid} 1")
        Path("/proc/self/gid_map").write_text(f"0 {gid} 1")
    from grader.sandbox.init import mount

    mount("none", "/", None, MS_REC | MS_PRIVATE)  # nothing of the view propagates to the host


def _mount_proc() -> None:
    from grader.sandbox.init import mount

    mount("none", "/proc", None, MS_REC | MS_PRIVATE)
    mount("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)


def _wait_and_exit(pid: int) -> None:
    while True:
        try:
            _, status = os.waitpid(pid, 0)
            break
        except ChildProcessError:
            os._exit(125)
        except InterruptedError:
            continue
    if os.WIFSIGNALED(status):
        sig = os.WTERMSIG(status)
        signal.signal(sig, signal.SIG_DFL)
        os.kill(os.getpid(), sig)
    os._exit(os.WEXITSTATUS(status))


# -- the grader's side -----------------------------------------------------------------------------

class Zygote:
    """A running zygote for one (interpreter, GPU) setting: this job process's own, or, where
    `keep_warm` named a folder, the warm one there that outlives this command."""

    def __init__(self, env: dict[str, str]) -> None:
        from grader.sandbox.launch import isolated_python

        self.proc: subprocess.Popen | None = None
        self.home: str | None = None
        self.started_here = True
        ours: socket.socket | None
        if _WARM:
            ours = self._attach_warm(Path(_WARM[0]), float(_WARM[1]), env)
        else:
            ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
            self.home = tempfile.mkdtemp(prefix="grader-zygote-")
            env = dict(env, HOME=self.home, TMPDIR=self.home)
            try:
                self.proc = subprocess.Popen(isolated_python(BOOT, str(theirs.fileno()), str(os.getpid())),
                                             pass_fds=(theirs.fileno(),), env=env, cwd="/", stdin=subprocess.DEVNULL,
                                             start_new_session=True)
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
        (detached, in its own session) when none answers; one starter at a time (a lock)."""
        from grader.sandbox.files import private_folder
        from grader.sandbox.launch import isolated_python

        name = warm_name(env)
        path = folder / f"{name}.sock"
        private_folder(folder)
        lock = os.open(folder / f"{name}.lock", os.O_RDWR | os.O_CREAT, 0o600)
        try:
            import fcntl

            fcntl.flock(lock, fcntl.LOCK_EX)
            sock = _connect(path)
            if sock is not None:
                self.started_here = False
                return sock
            self._starting = (path, lock, time.monotonic() + 300)
            lock = -1  # held until the new zygote answers (`_ready`): a second command waits, not starts another
            home = Path(tempfile.mkdtemp(prefix=f"{name}.home-", dir=folder))  # its own: removed when it ends
            with open(folder / f"{name}.log", "ab") as log:
                try:
                    proc = subprocess.Popen(isolated_python(WARM_BOOT, str(path), str(idle)),
                                            env=dict(env, HOME=str(home), TMPDIR=str(home)), cwd="/", stdin=subprocess.DEVNULL,
                                            stdout=log, stderr=log, start_new_session=True)
                except OSError as exc:
                    os.close(self._starting[1])
                    self._starting = None
                    shutil.rmtree(home, ignore_errors=True)
                    raise ZygoteError(f"the warm zygote could not start: {exc}") from None
            self.proc_starting = proc  # its imports overlap whatever this command does first
            return None
        finally:
            if lock >= 0:
                os.close(lock)

    _starting: tuple | None = None
    proc_starting: subprocess.Popen | None = None

    def _ready(self) -> None:
        """Connect to the warm zygote this command started, once it has imported and answers."""
        if self.sock is not None:
            return
        path, lock, deadline = self._starting
        try:
            while time.monotonic() < deadline:
                sock = _connect(path)
                if sock is not None:
                    self._connected(sock)
                    return
                if self.proc_starting.poll() is not None:
                    self.dead = True
                    raise ZygoteError(f"the warm zygote ended (status {self.proc_starting.returncode}): "
                                      f"see {path.with_suffix('.log')}")
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
        flat, names = [], {}
        for name, value in fds.items():
            if isinstance(value, list):
                names[name] = list(range(len(flat), len(flat) + len(value)))
                flat += value
            else:
                names[name] = len(flat)
                flat.append(value)
        with self.lock:
            self._ready()
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
        if self.proc is None:  # a warm zygote: it stays for the next command
            return
        try:
            self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        shutil.rmtree(self.home, ignore_errors=True)


def _connect(path: Path) -> socket.socket | None:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    try:
        _at(path, sock.connect)
        return sock
    except OSError:  # none there, or one that stopped answering (its file is replaced below)
        sock.close()
        return None


def _at(path: Path | str, call: Callable[[str], None]) -> None:
    """`call` (bind, connect) on a socket path of any length: through the folder's descriptor
    (/proc/self/fd/N/name), as a socket's address holds 108 bytes at most."""
    folder = os.open(os.path.dirname(path) or ".", os.O_PATH | os.O_DIRECTORY)
    try:
        call(f"/proc/self/fd/{folder}/{os.path.basename(path)}")
    finally:
        os.close(folder)


def warm_name(env: dict[str, str]) -> str:
    """The warm zygote's name: its environment and the code it has imported (this grader's
    files, this Python, torch's and Triton's installs), so a changed grader or an upgraded
    torch starts a new one and no worker is forked from stale code."""
    import hashlib
    import importlib.util

    from grader.sandbox.launch import PACKAGE_PARENT

    digest = hashlib.sha256(json.dumps([sorted(env.items()), sys.executable, sys.version]).encode())
    for source in sorted(Path(PACKAGE_PARENT, "grader").rglob("*.py")):
        digest.update(str(source).encode() + source.read_bytes())
    for package in ("torch", "triton", "numpy", "safetensors"):
        found = importlib.util.find_spec(package)
        origin = found.origin if found is not None and found.origin else ""
        digest.update(f"{package}={origin}:{os.stat(origin).st_mtime_ns if origin else 0}".encode())
    return digest.hexdigest()[:16]


_WARM: list = []  # [folder, idle seconds] once keep_warm was called


def warm_seconds() -> float:
    """How long a warm zygote waits for the next check: GRADER_WARM_SECONDS, else 600; 0 in
    CI (each job there is one command in a fresh machine), or where it is not a number."""
    raw = os.environ.get("GRADER_WARM_SECONDS")
    if raw is None:
        return 0.0 if os.environ.get("CI") or os.environ.get("GITHUB_ACTIONS") else 600.0
    try:
        return max(0.0, float(raw))
    except ValueError:
        return 0.0


def stop_warm(folder: Path) -> int:
    """Stop the warm zygotes serving from `folder` now (their command line names their socket
    there); returns how many. A test's or a benchmark's cleanup: they end by themselves when idle."""
    stopped = 0
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            argv = open(f"/proc/{pid}/cmdline", "rb").read().split(b"\0")
        except OSError:
            continue
        if any(b"serve_warm" in a for a in argv) and any(a.startswith(os.fsencode(Path(folder))) for a in argv):
            try:
                os.kill(int(pid), signal.SIGKILL)
                stopped += 1
            except OSError:
                pass
    return stopped


def keep_warm(folder: Path, idle: float) -> None:
    """This process's zygotes are the warm ones in `folder` (grader check: kept between
    commands for `idle` seconds); set before the first worker starts."""
    if idle > 0 and not _ZYGOTES:
        _WARM[:] = [str(folder), idle]


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
        while self.poll() is None:
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                raise subprocess.TimeoutExpired("worker", timeout)
            self.zygote.wait_for(self.pid, 0.5 if left is None else min(left, 0.5))
        return self.returncode


def _exists(pid: int) -> bool:
    try:
        os.kill(pid, 0)
        return True
    except ProcessLookupError:
        return False
    except PermissionError:
        return True


_ZYGOTES: dict[tuple, Zygote] = {}
_ZYGOTES_LOCK = threading.Lock()


def get(key: tuple, env: dict[str, str]) -> Zygote:
    """This process's zygote for `key` (started on first use, restarted if it died)."""
    with _ZYGOTES_LOCK:
        z = _ZYGOTES.get(key)
        if z is None or not z.alive():
            if z is not None:
                z.close()
            z = _ZYGOTES[key] = Zygote(env)
        return z


@atexit.register
def close_all() -> None:
    with _ZYGOTES_LOCK:
        for z in _ZYGOTES.values():
            z.close()
        _ZYGOTES.clear()


# -- a backend's forked start ------------------------------------------------------------------------

def usable(launch: "Launch") -> bool:
    """A worker (or the sandbox's probe) can be forked; a test's own command needs its exec."""
    return enabled() and (launch.command is None or launch.probe is not None)


def zygote_key(env: dict[str, str]) -> tuple[tuple, dict[str, str]]:
    """Workers whose environments differ only in their own folders share a zygote."""
    base = {k: v for k, v in env.items()  # what is read only when a kernel is compiled or tuned, not at import
            if k not in ("HOME", "TMPDIR", "TRITON_CACHE_DIR", "TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_AUTOTUNING")}
    return tuple(sorted(base.items())), base


def start(launch: "Launch", isolation, config: Callable[[tuple[int, int], int, int], tuple[dict, object]]) -> "Started":
    """The worker `launch` describes, forked by this process's zygote: `config(channel,
    status_fd, lifeline_fd)` is the backend's own configuration of its init (and the uid lease
    it took), the same one its exec path sends, so the view, uid and limits are the same."""
    from grader.sandbox.launch import Started, pipe_pair

    (rx, tx), channel = pipe_pair()
    status_rx, status_tx = os.pipe()
    lifeline_rx, lifeline = os.pipe()  # EOF when the grader is gone, as for the exec path's init
    out_rx, out_tx = os.pipe()
    lease = None
    try:
        settings, lease = config(channel, status_tx, lifeline_rx)
        z = get(*zygote_key(launch.env))
        pid = z.fork({"mode": isolation.mode, "namespaces": isolation.namespaces, "user_namespace": isolation.user_namespace,
                      "config": settings, "probe": launch.probe},
                     {"status_fd": status_tx, "lifeline_fd": lifeline_rx, "output": out_tx, "pass": list(channel)})
    except BaseException:
        for fd in (rx, tx, status_rx, lifeline, out_rx):
            os.close(fd)
        if lease is not None:
            lease.release()
        raise
    finally:
        for fd in (*channel, status_tx, lifeline_rx, out_tx):
            os.close(fd)
    return Started(Forked(z, pid, os.fdopen(out_rx, "rb")), rx, tx, status_rx, lifeline, lease)


def try_start(launch: "Launch", isolation, config: Callable[[tuple[int, int], int, int], tuple[dict, object]]) -> "Started | None":
    """A backend's first choice: the worker forked by the zygote (see `start`); None where it
    cannot be (off, a test's own command) or the zygote failed, which turns it off for the rest
    of this process (ours, not the student's): the backend then starts a fresh interpreter."""
    if not usable(launch):
        return None
    try:
        return start(launch, isolation, config)
    except ZygoteError as exc:
        disable(str(exc))
        return None


def prewarm(interpret: bool, gpu: str | None, isolation: str = "sandbox") -> None:
    """Start the zygotes a grade will fork from (a GPU run also replays in the interpreter),
    so their imports overlap whatever comes first. Starting one does not wait for it."""
    from grader.sandbox.launch import worker_env

    if isolation == "docker" or not enabled():
        return
    for interp in ({True} if interpret else {False, True}):
        try:
            get(*zygote_key(worker_env(Path(tempfile.gettempdir()), interp, None if interp else gpu)))
        except ZygoteError:
            return
