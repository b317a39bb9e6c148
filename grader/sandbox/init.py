"""The sandbox's init: the first process inside a worker's sandbox, started by
`grader.sandbox.namespaces` (under `unshare` where it works) with its configuration as JSON on stdin.

It is our code, started before any student code, and it does what must happen from inside:
1. builds the worker's view of the file system (in its own mount namespace): a fresh, empty
   tmpfs root into which only an allowlist is bound (the system folders, the Python install,
   the worker's own code, its job folder; see `grader.sandbox.namespaces.sandbox_view`), private
   scratch tmpfs for the temp folders, then pivot_root into it, the old root detached, the new
   root read-only. Nothing else of the host (the course folder above all) exists in the view;
2. forks the worker, which drops every capability (bounding set, ambient, effective, permitted,
   inheritable), drops to an unprivileged uid/gid (when started as root), sets its resource
   limits and no_new_privs, and execs the worker (`grader.worker.server`). Without capabilities
   it cannot undo a mount, and a user namespace it makes gets these mounts locked;
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
import errno
import json
import os
import re
import resource
import select
import signal
import sys
from typing import Callable

from grader.proctable import children_of

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
            result.append((unescape_mount_point(fields[4]), set(fields[5].split(","))))
    return result


_OCTAL = re.compile(r"\\([0-7]{3})")


def unescape_mount_point(field: str) -> str:
    """A mount point as mountinfo writes it (a space as \\040, a backslash as \\134) made a path
    again, with no codec: once the view's base hides an interpreter installed under it (Python
    under /tmp), a codec not imported yet (unicode_escape) can no longer be, and the sandbox failed."""
    return _OCTAL.sub(lambda m: chr(int(m.group(1), 8)), field)


def _remount(point: str, readonly: bool) -> None:
    """Set or clear read-only on the topmost mount at `point`, repeating its other per-mount
    flags. MS_BIND: this mount's flags only, never the file system's (which the host shares)."""
    options = [o for p, o in _mounts() if p == point][-1]
    flags = MS_REMOUNT | MS_BIND | (MS_RDONLY if readonly else 0)
    for name, bit in MOUNT_FLAGS.items():
        if name in options:
            flags |= bit
    mount(None, point, None, flags)


MS_PRIVATE = 1 << 18
MNT_DETACH = 2
# pivot_root(2) has no libc wrapper: its system call number, per architecture
SYS_PIVOT_ROOT = {"x86_64": 155, "aarch64": 41, "riscv64": 41, "ppc64le": 203, "s390x": 217}


def umount(target: str, flags: int = 0) -> None:
    _check(_libc.umount2(target.encode(), ctypes.c_int(flags)), f"umount {target}")


def pivot_root(new_root: str, put_old: str) -> None:
    number = SYS_PIVOT_ROOT.get(os.uname().machine)
    if number is None:
        raise OSError(f"pivot_root: no system call number known for {os.uname().machine}")
    _check(_libc.syscall(ctypes.c_long(number), new_root.encode(), put_old.encode()), "pivot_root")


def _depth(path: str) -> int:
    return path.rstrip("/").count("/")


def _readonly_tree(point: str) -> None:
    """Read-only: the mount at `point` and every mount under it (a recursive bind brings the
    host's submounts: /dev/pts, /sys/fs/cgroup). A submount that refuses stays as it was."""
    for mounted, _ in _mounts():
        if _inside(mounted, point):
            try:
                _remount(mounted, readonly=True)
            except OSError:
                if mounted == point:
                    raise


def build_base(*interpreter: str) -> str:
    """Where the new root is assembled: any folder will do (it is hidden only in this namespace)
    but one that holds this interpreter, which still has to import after it is covered."""
    for base in ("/tmp", "/mnt", "/media", "/opt", "/srv"):
        if os.path.isdir(base) and not any(_inside(os.path.realpath(p), base) for p in interpreter if p):
            return base
    raise OSError("no folder to build the view in that does not hold the Python interpreter")


def build_view(view: dict) -> None:
    """The worker's file system, in this private mount namespace (nothing is seen outside it),
    from an allowlist: a fresh tmpfs root holding only `binds` (each host folder at its own
    path, read-only unless writable, its submounts with it), `links` (symbolic links: /bin ->
    usr/bin, a path by which a bound folder is also known), `scratch` (an empty tmpfs, mode
    1777, that vanishes with the worker) and `covers` (an empty read-only tmpfs over a private
    folder that lies inside a bound one). Outermost first, so the job folder inside the private
    /tmp and /dev/shm inside /dev come out right. Then pivot_root into it, the old root detached
    (nothing of it is reachable any more), and the new root made read-only."""
    if os.readlink("/proc/self/ns/mnt") == view["outer_mount_namespace"]:
        raise OSError("refusing to build a view in the grader's own mount namespace")
    mount(None, "/", None, MS_REC | MS_PRIVATE)  # nothing of this propagates out (pivot_root needs it too)
    size = view.get("tmpfs_size", "256m")
    sources: dict[str, int] = {}  # handles on what is bound, taken before anything is covered
    for path, _ in view["binds"]:
        try:
            sources[path] = os.open(path, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
        except (FileNotFoundError, NotADirectoryError):
            continue  # gone meanwhile (an optional library folder): not in the view
    base = build_base(sys.prefix, sys.base_prefix, os.path.dirname(os.__file__))
    mount("tmpfs", base, "tmpfs", MS_NOSUID | MS_NODEV, "mode=0755,size=4m")
    # the folders made on the way stay 0755, whatever the grader's umask: any worker uid enters them
    umask = os.umask(0o022)
    steps = ([(_depth(p), 0, p, target) for p, target in view.get("links", [])]
             + [(_depth(p), 1, p, None) for p in view.get("scratch", [])]
             + [(_depth(p), 2, p, writable) for p, writable in view["binds"] if p in sources]
             + [(_depth(p), 3, p, None) for p in view.get("covers", [])])
    try:
        for _, kind, path, arg in sorted(steps):
            target = base + path
            if kind == 0:
                if not os.path.lexists(target):
                    os.makedirs(os.path.dirname(target), mode=0o755, exist_ok=True)
                    os.symlink(arg, target)
                continue
            os.makedirs(target, mode=0o755, exist_ok=True)  # a mount point: in our tmpfs, or already there
            if kind == 1:
                mount("tmpfs", target, "tmpfs", MS_NOSUID | MS_NODEV, f"mode=1777,size={size}")
            elif kind == 2:
                mount(f"/proc/self/fd/{sources[path]}", target, None, MS_BIND | MS_REC)
                if not arg:
                    _readonly_tree(target)
            else:
                mount("tmpfs", target, "tmpfs", MS_NOSUID | MS_NODEV, "mode=0755,size=16k")
                _remount(target, readonly=True)
    finally:
        os.umask(umask)
        for fd in sources.values():
            os.close(fd)
    os.chdir(base)
    pivot_root(".", ".")  # the new root on top of the old one (pivot_root(2): new_root == put_old)
    umount(".", MNT_DETACH)  # the old root, and every mount under it, out of this namespace
    os.chdir("/")
    _remount("/", readonly=True)


# -- the worker's capabilities -----------------------------------------------------------------

PR_CAPBSET_DROP, PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL = 24, 47, 4
CAPABILITY_VERSION_3 = 0x20080522


class _CapHeader(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]


class _CapData(ctypes.Structure):
    _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32), ("inheritable", ctypes.c_uint32)]


def drop_bounding_set() -> bool:
    """Every capability out of the bounding set, so no exec (uid 0's own, a setuid or
    file-capability program) gives one back. Needs CAP_SETPCAP: done before the uid switch.
    False where this process may not (an ordinary user without namespaces: it holds none)."""
    try:
        with open("/proc/sys/kernel/cap_last_cap") as f:
            last = int(f.read())
    except (OSError, ValueError):
        last = 63
    for cap in range(last + 1):
        if _libc.prctl(PR_CAPBSET_DROP, ctypes.c_ulong(cap), 0, 0, 0) != 0:
            err = ctypes.get_errno()
            if err == errno.EINVAL:
                break  # past the last capability this kernel knows
            if err == errno.EPERM and cap == 0 and os.geteuid() != 0:
                return False
            raise OSError(err, f"dropping capability {cap} from the bounding set: {os.strerror(err)}")
    return True


def drop_capabilities() -> None:
    """No ambient, effective, permitted or inheritable capability left (capset to nothing)."""
    if _libc.prctl(PR_CAP_AMBIENT, ctypes.c_ulong(PR_CAP_AMBIENT_CLEAR_ALL), 0, 0,
                   0) != 0 and ctypes.get_errno() != errno.EINVAL:
        _check(-1, "clearing the ambient capabilities")  # EINVAL: a kernel before ambient capabilities
    header = _CapHeader(CAPABILITY_VERSION_3, 0)
    data = (_CapData * 2)()
    _check(_libc.capset(ctypes.byref(header), data), "capset")


def held_capabilities() -> dict[str, int]:
    """This process's capability sets (CapInh, CapPrm, CapEff, CapBnd, CapAmb) and NoNewPrivs."""
    held = {}
    with open("/proc/self/status") as f:
        for line in f:
            name, _, value = line.partition(":")
            if name.startswith("Cap"):
                held[name] = int(value, 16)
            elif name == "NoNewPrivs":
                held[name] = int(value)
    return held


def contain(user: list[int] | None) -> None:
    """The worker's own process, before any of its code runs: the bounding set emptied, then the
    uid switch (when the grader is root), then every other capability and no_new_privs; checked
    after, so a worker that still holds one never starts (a sandbox failure, not the student's)."""
    bounded = drop_bounding_set()
    if user:
        _drop_privileges(user)
    drop_capabilities()
    prctl(PR_SET_NO_NEW_PRIVS, 1)  # no setuid binary (sudo, su, ping) can give privileges back
    held = held_capabilities()
    left = [name for name in ("CapInh", "CapPrm", "CapEff", "CapAmb") + (("CapBnd",) if bounded else ())
            if held.get(name)]
    if left or held.get("NoNewPrivs") != 1:
        raise OSError(f"the worker would keep capabilities ({', '.join(left) or 'no no_new_privs'})")


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
    names = {"cpu_seconds": resource.RLIMIT_CPU, "file_size": resource.RLIMIT_FSIZE,
             "open_files": resource.RLIMIT_NOFILE,
             "processes": resource.RLIMIT_NPROC, "address_space": resource.RLIMIT_AS, "core": resource.RLIMIT_CORE}
    for name, value in limits.items():
        if name == "cpus":
            if value:  # the worker's own CPUs (grader.sandbox.launch.Limits.cpus); a mask the host lacks is not ours
                try:
                    os.sched_setaffinity(0, value)
                except OSError:
                    pass
        elif value is not None:
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
        contain(config.get("user"))  # no capability, the job's uid, no_new_privs
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


SIOCGIFFLAGS, SIOCSIFFLAGS, IFF_UP = 0x8913, 0x8914, 0x1


def loopback_up() -> None:
    """The network namespace's own loopback, up (a fresh one has it down): for a tool that talks
    to the process it watches over a local socket (Nsight Compute's ncu and its target). Nothing
    outside the namespace is reached through it; the namespace has no other interface."""
    import fcntl
    import socket
    import struct

    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        request = struct.pack("16sH22x", b"lo", 0)
        flags = struct.unpack("16sH22x", fcntl.ioctl(s, SIOCGIFFLAGS, request))[1]
        fcntl.ioctl(s, SIOCSIFFLAGS, struct.pack("16sH22x", b"lo", flags | IFF_UP))


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
        if config.get("loopback") and config.get("own_pid_namespace"):
            loopback_up()
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
