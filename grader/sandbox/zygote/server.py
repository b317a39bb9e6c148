"""The zygote process itself: it imports what every worker loads (PRELOAD) once, then only
forks, each fork set up as the exec path's `unshare` and init would set up a worker (see the
package's docstring); `serve` is a job process's own zygote, `serve_warm` the one a check leaves
warm for the next. Nothing here runs in the grader's process but the constants it shares with
the client (grader.sandbox.zygote.client)."""

from __future__ import annotations

import ctypes
import json
import os
import select
import shutil
import signal
import socket
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from grader.safefiles import peer_uid

CLONE_NEWNS, CLONE_NEWUSER, CLONE_NEWPID, CLONE_NEWNET = 0x00020000, 0x10000000, 0x20000000, 0x40000000
MS_NOSUID, MS_NODEV, MS_NOEXEC, MS_REC, MS_PRIVATE = 2, 4, 8, 16384, 1 << 18
MAX_MESSAGE = 1 << 20
PRELOAD = ("import numpy, safetensors.torch, torch, triton, grader.worker.server, grader.worker.memcheck\n"
           "if os.environ.get('TRITON_INTERPRET') == '1':\n"
           "    import triton.runtime.interpreter\n"
           "else:\n"
           "    import grader.worker.timing, torch.profiler\n"
           # what grader.worker sets first anyway; its first call imports for seconds
           "torch.use_deterministic_algorithms(False)\n"
           "torch.utils.deterministic.fill_uninitialized_memory = False\n"
           "if torch.cuda.is_initialized():\n"
           "    raise SystemExit('a zygote must not hold a CUDA context')\n")

NAME = "grader-worker"  # all a fork's command line says (its /proc/1 and /proc/self: see _unnamed)


def _unnamed() -> None:
    """A fork tells its worker nothing of how the zygote was started: /proc/PID/cmdline and
    /proc/PID/environ read the process's argument and environment areas, which a fork inherits
    (the interpreter's path, the checkout's tag, the zygote's HOME in the kept cache), so both
    are overwritten in place (as setproctitle does): the command line reads NAME, the initial
    environment nothing. sys.argv and sys.orig_argv go with them. The zygote keeps its own
    (grader.resident.stop_warm finds it by them), out of a sandboxed worker's view."""
    fields = Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()
    arg_start, arg_end, env_start, env_end = (int(fields[i]) for i in (45, 46, 47, 48))  # fields 48..51
    for start, end, text in ((arg_start, arg_end, NAME.encode()), (env_start, env_end, b"")):
        if end > start:
            text = text[:end - start - 1]
            ctypes.memmove(start, text + b"\0" * (end - start - len(text)), end - start)
    sys.argv[:] = [NAME]
    sys.orig_argv[:] = [NAME]


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
        waiting: list[int | socket.socket] = [wake_r, *clients, *([listener] if listener is not None else [])]
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
                if peer_uid(conn) == os.getuid():  # the folder is ours alone; this says so again
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


def _send(sock: socket.socket, message: dict) -> bool:
    try:
        sock.send(json.dumps(message).encode())
        return True
    except OSError:
        return False


def _child(request: dict, fds: list[int], keep_out: tuple[int, ...]) -> None:
    """Process A: what `unshare --fork --kill-child` and the init's exec did, without the exec."""
    status: int | None = None
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
        os.environ.update(config["env"])  # the C environment's strings no longer lie in the area _unnamed blanks
        _unnamed()
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
            if status is not None:
                os.write(status,
                         (json.dumps({"setup_error": f"the zygote could not start a worker: {exc}"}) + "\n").encode())
        except Exception:  # noqa: BLE001
            pass
    os._exit(125)


def _run_init(config: dict, probe: str | None) -> None:
    from grader.sandbox.init import main

    start = ((lambda: _run_probe(probe, config.get("code"))) if probe
             else (lambda: run_worker(config["pass_fds"], config.get("code"))))
    os._exit(main(config, start=start))


def _use_worker_code(code: str | None) -> None:
    """A fork imports what it has not yet imported from the worker's own copy of the code
    (launch.copy_worker_code), where an exec'd worker's bootstrap imports all of it: the zygote's
    grader package lies in the course folder, which the worker's view does not hold."""
    if not code:
        return
    import grader
    import grader.worker

    zygotes = os.path.dirname(os.path.dirname(grader.__file__))  # the folder the zygote's BOOT put first
    grader.__path__[:] = [os.path.join(code, "grader")]
    grader.worker.__path__[:] = [os.path.join(code, "grader", "worker")]
    rest = [p for p in sys.path if p != code]
    if zygotes in rest:
        # Only the copy BOOT inserted goes: installed from a wheel, that folder is also
        # site-packages, where torch, triton and numpy live, and stays on the path.
        rest.remove(zygotes)
    sys.path[:] = [code] + rest
    for name in [m for m in sys.modules if m == "grader" or m.startswith("grader.")]:
        module = sys.modules[name]
        if name.split(".")[1:2] in ([], ["codec"], ["protocol"], ["worker"]):
            found = getattr(module, "__file__", None)
            if found:  # where an exec'd worker's import found it
                module.__file__ = os.path.join(code, os.path.relpath(found, zygotes))
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
    def probe() -> None:
        _use_worker_code(worker_code)
        exec(code, {"__name__": "__probe__"})  # noqa: S102 - the sandbox's own probe (process.PROBE)

    _exit_after(probe)


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



def _at(path: Path | str, call: Callable[[str], None]) -> None:
    """`call` (bind, connect) on a socket path of any length: through the folder's descriptor
    (/proc/self/fd/N/name), as a socket's address holds 108 bytes at most."""
    folder = os.open(os.path.dirname(path) or ".", os.O_PATH | os.O_DIRECTORY)
    try:
        call(f"/proc/self/fd/{folder}/{os.path.basename(path)}")
    finally:
        os.close(folder)

