"""The default backend (`--isolation sandbox`, no Docker): `grader.sandbox.init` runs first in
fresh network, PID and mount namespaces (`unshare`; a user namespace too when not root). It
gives the worker a view of the file system in which the private folders (reference/, the
grader's home, the temp dirs, the output folder and the submissions) are blank, everything is
read-only but its job folder, and then drops it to a dedicated unprivileged uid (when the
grader is root), with resource limits. When the worker ends or times out, every process it
started dies with the namespace. Where namespaces are not available this is said once and the
worker runs with what is left: its own session, limits, a subreaper that sweeps its children."""

from __future__ import annotations

import json
import os
import shutil
import signal
import site
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

from grader.sandbox import zygote
from grader.sandbox.init import children_of
from grader.sandbox.isolation import Isolation
from grader.sandbox.launch import PACKAGE_PARENT, Launch, Started, pipe_pair, worker_argv
from grader.sandbox.uids import JobLease, chown_tree

SUMMARY = "namespaces, no Docker"  # what `--isolation` help says of this mode


def detect(probe: Callable[[Isolation], str | None]) -> Isolation:
    """The strongest form that starts here: `probe` tries each for real (None if it works,
    else why not); what is missing is said in `warnings`."""
    root = os.geteuid() == 0
    warnings: list[str] = []
    reasons = []
    candidates = []
    if shutil.which("unshare") is None:
        reasons.append("the unshare command is missing (util-linux)")
    else:
        if root:
            candidates.append(Isolation("sandbox", namespaces=True, user_switch=True))
        candidates.append(Isolation("sandbox", namespaces=True, user_namespace=not root))
    candidates.append(Isolation("sandbox"))
    for candidate in candidates:
        problem = probe(candidate)
        if problem is None:
            break
        reasons.append(problem)
    else:  # not even the init runs here (not Linux?): plain processes, said once
        return Isolation("none", warnings=(f"no sandbox can start here ({'; '.join(reasons)}): workers run as plain "
                                           "processes, as with --isolation none",))
    if not candidate.namespaces:
        warnings.append(f"sandbox without namespaces ({reasons[-1]}): a worker can use the network, read every file its user "
                        "can, see other processes, and a process it starts could outlive it")
    elif root and not candidate.user_switch:
        warnings.append(f"sandbox without a separate user ({reasons[0]}): workers run as root inside their namespaces")
    return Isolation(candidate.mode, candidate.namespaces, candidate.user_namespace, candidate.user_switch, tuple(warnings))


def start(launch: Launch, isolation: Isolation) -> Started:
    """The init (under `unshare` where namespaces work), its configuration on stdin, the worker
    its child; the init reports the worker's end on a status pipe and dies with the grader
    (its lifeline)."""
    forked = zygote.try_start(launch, isolation, lambda channel, status_tx, lifeline_rx:  # the same init, view, uid, limits
                              _config(launch, isolation, worker_argv(*map(str, channel)), channel, status_tx, lifeline_rx))
    if forked is not None:
        return forked
    (rx, tx), channel = pipe_pair()
    argv = launch.command or worker_argv(*map(str, channel))
    status_rx, status_tx = os.pipe()
    lifeline_rx, lifeline = os.pipe()  # the init's lifeline: EOF when the grader is gone
    lease = None
    try:
        config, lease = _config(launch, isolation, argv, channel, status_tx, lifeline_rx)
        # the configuration goes in on stdin, not argv: the worker can read its init's /proc/1/cmdline
        init = [sys.executable, "-I", "-c", "import sys, json; sys.path.insert(0, sys.argv[1]); "
                "from grader.sandbox.init import main; sys.exit(main(json.load(sys.stdin)))", PACKAGE_PARENT]
        if isolation.namespaces:
            init = ["unshare", *(["--user", "--map-root-user"] if isolation.user_namespace else []),
                    "--net", "--pid", "--fork", "--kill-child", "--mount-proc", *init]
        proc = subprocess.Popen(init, cwd="/", env=launch.env, pass_fds=(*channel, status_tx, lifeline_rx),
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                start_new_session=True)
    except BaseException:
        for fd in (status_rx, lifeline, tx, rx):
            os.close(fd)
        if lease:
            lease.release()
        raise
    finally:
        for fd in (*channel, status_tx, lifeline_rx):
            os.close(fd)
    try:
        proc.stdin.write(json.dumps(config).encode())
        proc.stdin.close()
    except BrokenPipeError:
        pass  # it failed before reading: its output and status say why
    return Started(proc, rx, tx, status_rx, lifeline, lease)


def _config(launch: Launch, isolation: Isolation, argv: list[str], channel: tuple[int, int], status_tx: int,
            lifeline_rx: int) -> tuple[dict, JobLease | None]:
    """What the init is told (grader.sandbox.init.main), and the job's uid lease it takes."""
    lease = None
    user = None
    if isolation.user_switch:
        lease = JobLease(launch.job)
        user = [lease.uid, lease.uid]
        chown_tree(launch.job, *user)
    return {
        "argv": argv,
        "cwd": str(launch.cwd),
        "env": launch.env,
        "limits": launch.limits.for_worker(user is not None, launch.interpret),
        "user": user,
        "view": sandbox_view(launch.job, launch.writable, launch.hide) if isolation.namespaces else None,
        "pass_fds": list(channel),
        "status_fd": status_tx,
        "lifeline_fd": lifeline_rx,
        "own_pid_namespace": isolation.namespaces,
    }, lease


def kill(started: Started, isolation: Isolation) -> None:
    """In namespaces: SIGKILL to the init, whose death takes the whole PID namespace with it;
    the wait returns once all are gone. Without: SIGTERM to the init, which sweeps its
    descendants, then exits."""
    proc = started.proc
    if proc.poll() is not None:
        return
    if isolation.namespaces:
        for init in children_of(proc.pid):  # unshare's child: PID 1 of the namespace
            _signal(init, signal.SIGKILL)
    else:
        _signal(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        pass


def cleanup(started: Started) -> None:
    """Nothing outlives the init."""


def exit_code(code: int) -> int:
    return code  # the init reports the worker's own status; this is the init's


def _signal(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


# -- the worker's view of the file system -------------------------------------------------------

NEVER_COVERED = {"/", "/usr", "/etc", "/lib", "/lib64", "/lib32", "/bin", "/sbin", "/var", "/opt", "/dev", "/proc", "/sys", "/run"}


def sandbox_view(job: Path, writable: list[Path], hide: list[Path]) -> dict:
    """Folders blanked (private), kept read-only (what Python and the grader need) and kept
    writable (the worker's own) in the worker's mount namespace; see grader.sandbox.init.build_view."""
    from grader.spec import course_root

    # assignments/ too: every assignment's hidden.py and the course secret (a worker could print them)
    private = [course_root() / "reference", course_root() / "assignments", Path.home(), *hide]
    private = list({str(Path(p).resolve()): p for p in private}.values())  # each folder blanked once
    scratch_dirs = {tempfile.gettempdir(), "/tmp", "/var/tmp", "/dev/shm"}
    cover = [(str(p), "0755") for p in private if str(Path(p).resolve()) not in NEVER_COVERED]
    cover += [(d, "1777") for d in sorted(scratch_dirs) if d not in NEVER_COVERED]
    keep_ro = {sys.prefix, sys.base_prefix, sys.exec_prefix, *site.getsitepackages(), str(Path(PACKAGE_PARENT) / "grader"), str(job)}
    user_site = site.getusersitepackages()
    if user_site and os.path.isdir(user_site):
        keep_ro.add(user_site)
    for entry in sys.path:  # other install locations (a .pth, a --target dir); never the folder we run from
        if entry and os.path.isdir(entry) and os.path.realpath(entry) not in (os.path.realpath(os.getcwd()), PACKAGE_PARENT):
            keep_ro.add(entry)
    libraries = os.environ.get("LD_LIBRARY_PATH", "").split(os.pathsep) + [os.environ.get("CUDA_HOME", "")]
    keep_ro.update(d for d in libraries if d and os.path.isabs(d) and os.path.isdir(d))  # CUDA, wherever it lives
    keep = [(p, False) for p in sorted(keep_ro)] + [(str(p), True) for p in writable]
    return {"cover": cover, "keep": keep, "readonly_root": True, "tmpfs_size": "256m",
            "outer_mount_namespace": os.readlink("/proc/self/ns/mnt")}
