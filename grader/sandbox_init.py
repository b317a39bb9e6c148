"""The sandbox's init: the first process inside a worker's sandbox, started by
`grader.sandbox` (under `unshare` where it works) with its configuration as JSON on stdin.

It is our code, started before any student code, and it does what must happen from inside:
1. builds the worker's view of the file system (in its own mount namespace): folders that
   must stay private (the grader's home, the temp dirs, reference/, the output folder, the
   submissions) are covered by empty tmpfs mounts; what the worker needs (the Python install,
   the grader package, its job folder) is bound back; everything else is made read-only;
2. forks the worker, which drops to an unprivileged uid/gid (when started as root), sets its
   resource limits and no_new_privs, and execs the worker (`grader.worker`);
3. reaps, and when the worker ends (or on SIGTERM from the grader) kills every process the
   worker left behind: as PID 1 of a PID namespace by `kill(-1)`, elsewhere as a child
   subreaper by killing its descendants until none is left;
4. reports how the worker ended (exit status or signal) on a status pipe the worker never
   holds, so the grader tells `os._exit(139)` from a real segfault and a sandbox failure
   (infra_error) from a student's crash.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import json
import os
import resource
import select
import signal
from typing import Callable

PR_SET_PDEATHSIG = 1
PR_SET_NO_NEW_PRIVS = 38
PR_SET_CHILD_SUBREAPER = 36
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC = 1, 2, 4, 8
MS_REMOUNT, MS_BIND, MS_REC = 32, 4096, 16384
MS_NOATIME, MS_NODIRATIME, MS_RELATIME, MS_STRICTATIME = 1024, 2048, 1 << 21, 1 << 24
# per-mount flags a remount must repeat (in a user namespace they are locked and may not be dropped)
MOUNT_FLAGS = {"nosuid": MS_NOSUID, "nodev": MS_NODEV, "noexec": MS_NOEXEC, "noatime": MS_NOATIME,
               "nodiratime": MS_NODIRATIME, "relatime": MS_RELATIME, "strictatime": MS_STRICTATIME}
SETUP_FAILED = 125

_libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)


def _check(result: int, what: str) -> None:
    if result != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")


def mount(source: str | None, target: str, fstype: str | None, flags: int, data: str | None = None) -> None:
    enc = lambda s: s.encode() if s is not None else None  # noqa: E731
    _check(_libc.mount(enc(source), enc(target), enc(fstype), ctypes.c_ulong(flags), enc(data)), f"mount {target}")


def prctl(option: int, arg: int) -> None:
    _check(_libc.prctl(option, ctypes.c_ulong(arg), 0, 0, 0), f"prctl {option}")


def _inside(path: str, folder: str) -> bool:
    return path == folder or path.startswith(folder.rstrip("/") + "/")


def _mounts() -> list[tuple[str, set[str]]]:
    """(mount point, per-mount options) of every mount in this namespace, in mount order."""
    result = []
    with open("/proc/self/mountinfo") as f:
        for line in f:
            fields = line.split()
            point = fields[4].encode().decode("unicode_escape")  # mountinfo writes a space as \040
            result.append((point, set(fields[5].split(","))))
    return result


def _remount(point: str, readonly: bool) -> None:
    """Set or clear read-only on the topmost mount at `point`, repeating its other per-mount
    flags. MS_BIND: this mount's flags only, never the file system's (which the host shares)."""
    options = [o for p, o in _mounts() if p == point][-1]
    flags = MS_REMOUNT | MS_BIND | (MS_RDONLY if readonly else 0)
    for name, bit in MOUNT_FLAGS.items():
        if name in options:
            flags |= bit
    mount(None, point, None, flags)


UNTOUCHED = ("/proc", "/sys", "/dev")  # kernel interfaces and devices (GPUs): left as they are


def build_view(view: dict) -> None:
    """The worker's file system, in this private mount namespace (nothing is seen outside it):
    every mount read-only; each `cover` folder replaced by an empty tmpfs (mode 1777: a
    private scratch that vanishes; else a read-only blank); each `keep` folder bound back at
    its own path, read-only or writable. Covers and keeps apply outermost first, so a keep
    inside a cover (the job folder in /tmp) and a cover inside a keep both come out right."""
    if os.readlink("/proc/self/ns/mnt") == view["outer_mount_namespace"]:
        raise OSError("refusing to build a view in the grader's own mount namespace")
    keeps = [(os.path.realpath(p), rw) for p, rw in view["keep"] if os.path.isdir(p)]
    covers = [(os.path.realpath(c), mode) for c, mode in view["cover"] if os.path.isdir(c)]
    # handles on what is bound back, taken before anything is covered
    fds = {path: os.open(path, os.O_PATH | os.O_DIRECTORY) for path, _ in keeps}
    if view.get("readonly_root"):
        for point, options in _mounts():
            if "ro" in options or any(_inside(point, u) for u in UNTOUCHED):
                continue
            try:
                _remount(point, readonly=True)
            except OSError:
                if point == "/":
                    raise
    steps = [(path.count("/"), 0, path, mode) for path, mode in covers] + [(path.count("/"), 1, path, rw) for path, rw in keeps]
    for _, kind, path, arg in sorted(steps):
        if kind == 0:
            if not os.path.isdir(path):
                continue  # already out of sight under an outer cover
            mount("tmpfs", path, "tmpfs", MS_NOSUID | MS_NODEV, f"mode={arg},size={view.get('tmpfs_size', '256m')}")
            for keep, _ in keeps:
                if _inside(keep, path) and keep != path:
                    os.makedirs(keep, exist_ok=True)  # a mount point for its bind
            if arg != "1777":
                _remount(path, readonly=True)
        else:
            mount(f"/proc/self/fd/{fds[path]}", path, None, MS_BIND | MS_REC)
            _remount(path, readonly=not arg)
    for fd in fds.values():
        os.close(fd)


def children_of(pid: int) -> list[int]:
    """The pids whose parent is `pid` (from /proc/PID/task/*/children, else a scan of /proc)."""
    kids: set[int] = set()
    try:
        for tid in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{tid}/children") as f:
                kids.update(int(p) for p in f.read().split())
    except FileNotFoundError:
        if not os.path.exists(f"/proc/{pid}/task"):
            return []
        for entry in os.listdir("/proc"):
            if entry.isdigit():
                try:
                    with open(f"/proc/{entry}/stat") as f:
                        if int(f.read().rsplit(")", 1)[1].split()[1]) == pid:
                            kids.add(int(entry))
                except (OSError, ValueError, IndexError):
                    pass
    except OSError:
        return []
    return sorted(kids)


def kill_everything(worker_pid: int | None, own_pid_namespace: bool = False) -> None:
    """Kill every process the worker left: all of the namespace when we are its PID 1, else
    (as a child subreaper, orphans come back to us) our descendants, round after round until
    none is left (a killed child's children are reparented to us and met in the next round)."""
    for _ in range(10000):
        if own_pid_namespace and os.getpid() == 1:  # never kill(-1) anywhere else: it would reach every process
            try:
                os.kill(-1, signal.SIGKILL)  # everything in this PID namespace but us
            except ProcessLookupError:
                pass
        if worker_pid:
            try:
                os.killpg(worker_pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        kids = children_of(os.getpid())
        if not kids:
            break
        for pid in kids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        for pid in kids:
            try:
                os.waitpid(pid, 0)
            except ChildProcessError:
                pass


def _drop_privileges(user: list[int]) -> None:
    uid, gid = user
    os.setgroups([])
    os.setresgid(gid, gid, gid)
    os.setresuid(uid, uid, uid)
    if os.getuid() != uid or os.geteuid() != uid:
        raise OSError("the user switch did not take")


def apply_limits(limits: dict) -> None:
    names = {"cpu_seconds": resource.RLIMIT_CPU, "file_size": resource.RLIMIT_FSIZE, "open_files": resource.RLIMIT_NOFILE,
             "processes": resource.RLIMIT_NPROC, "address_space": resource.RLIMIT_AS, "core": resource.RLIMIT_CORE}
    for name, value in limits.items():
        if value is not None:
            resource.setrlimit(names[name], (value, value))


def _start_worker(config: dict, status_fd: int, start: Callable[[], None] | None = None) -> tuple[int, str]:
    """Fork and exec the worker; (pid, "") or (pid, why it could not start). With `start` (a
    zygote's fork, grader.zygote), the same steps and then start() in place of the exec."""
    failed_rx, failed_tx = os.pipe2(os.O_CLOEXEC)  # closed by a successful exec, so EOF means it ran
    pid = os.fork()
    if pid:
        os.close(failed_tx)
        with os.fdopen(failed_rx, "rb") as f:
            return pid, f.read().decode(errors="replace")
    try:  # the worker-to-be: nothing of ours may leak into it
        for fd in (status_fd, failed_rx, config["lifeline_fd"]):
            os.close(fd)
        devnull = os.open(os.devnull, os.O_RDONLY)
        os.dup2(devnull, 0)  # not the init's stdin, which carried its configuration
        os.close(devnull)
        os.setsid()  # its own group, so one killpg reaches whatever it starts without setsid
        prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        apply_limits(config["limits"])
        if config.get("user"):
            _drop_privileges(config["user"])
        prctl(PR_SET_NO_NEW_PRIVS, 1)  # no setuid binary (sudo, su, ping) can give privileges back
        os.chdir(config["cwd"])
        if start is not None:
            os.environ.clear()
            os.environ.update(config["env"])
            os.close(failed_tx)  # as a successful exec would: setup is done
            start()
            os._exit(0)
        os.execve(config["argv"][0], config["argv"], config["env"])
    except BaseException as exc:  # noqa: BLE001 - report and leave; nothing else may run here
        try:
            os.write(failed_tx, f"the worker could not start: {exc}".encode())
        except OSError:  # closed: start() itself raised
            pass
    os._exit(SETUP_FAILED)


def _report(status_fd: int, message: dict) -> None:
    try:
        os.write(status_fd, (json.dumps(message) + "\n").encode())
    except OSError:
        pass


def _wait_for(worker_pid: int, lifeline: int) -> int | None:
    """The worker's wait status; None if the grader went away first (its lifeline closed)."""
    try:
        handle = os.pidfd_open(worker_pid)  # Linux 5.3+: readable when the worker ends
    except (AttributeError, OSError):
        handle = None
    while True:
        watched = [lifeline] + ([handle] if handle is not None else [])
        ready, _, _ = select.select(watched, [], [], None if handle is not None else 0.05)
        while True:  # reap whatever ended: the worker, or orphans handed to us
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return None
            if pid == 0:
                break
            if pid == worker_pid:
                return status
        if lifeline in ready:
            return None


def main(config: dict, start: Callable[[], None] | None = None) -> int:
    status_fd = config["status_fd"]
    worker_pid: int | None = None

    def terminate(signum, frame):  # the grader's timeout: leave nothing behind, then go
        kill_everything(worker_pid, config.get("own_pid_namespace", False))
        os._exit(SETUP_FAILED)

    signal.signal(signal.SIGTERM, terminate)
    try:
        prctl(PR_SET_CHILD_SUBREAPER, 1)
        if config.get("view"):
            build_view(config["view"])
    except Exception as exc:  # noqa: BLE001
        _report(status_fd, {"setup_error": f"the sandbox could not be built: {exc}"})
        return SETUP_FAILED
    worker_pid, failure = _start_worker(config, status_fd, start)
    for fd in config["pass_fds"]:
        os.close(fd)  # the worker's pipe ends: only it holds them now, so its death reads as EOF
    if failure:
        kill_everything(worker_pid, config.get("own_pid_namespace", False))
        _report(status_fd, {"setup_error": failure})
        return SETUP_FAILED
    status = _wait_for(worker_pid, config["lifeline_fd"])
    kill_everything(worker_pid, config.get("own_pid_namespace", False))
    if status is None:
        _report(status_fd, {"setup_error": "the grader went away; the worker was killed"})
        return SETUP_FAILED
    if os.WIFSIGNALED(status):
        _report(status_fd, {"signal": os.WTERMSIG(status)})
        return 128 + os.WTERMSIG(status)
    _report(status_fd, {"exit": os.WEXITSTATUS(status)})
    return os.WEXITSTATUS(status)
