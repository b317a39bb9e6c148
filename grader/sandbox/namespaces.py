"""The default backend (`--isolation sandbox`, no Docker): `grader.sandbox.init` runs first in
fresh network, PID and mount namespaces (`unshare`; a user namespace too when not root). It
gives the worker a view of the file system built from an allowlist (the system, the Python
install, its own copy of the worker code, its job folder: never the course folder), read-only
but its own folders, then drops every capability and, when the grader is root, switches to a
dedicated unprivileged uid, with resource limits. When the worker ends or times out, every process it
started dies with the namespace. Where namespaces are not available this is said once and the
worker runs with what is left: its own session, limits, a subreaper that sweeps its children and,
when the grader is root (a Docker container under its default seccomp profile, as Gradescope runs
one), a dedicated uid that reads only what every user may (see `degraded_user_switch`)."""

from __future__ import annotations

import functools
import json
import os
import shutil
import signal
import site
import stat
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

from grader.proctable import children_of
from grader.sandbox import zygote
from grader.sandbox.interpreter import CHECKOUT_TAG, PACKAGE_PARENT
from grader.sandbox.isolation import Isolation, SandboxError
from grader.sandbox.launch import Launch, Started, pipe_pair, worker_argv
from grader.sandbox.uids import JobLease, chown_tree
from grader.sandbox.zygote import SandboxState
from grader.settings import Settings

SUMMARY = "namespaces, no Docker"  # what `--isolation` help says of this mode


def detect(probe: Callable[[Isolation], str | None], settings: Settings) -> Isolation:
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
    if root:  # no namespaces, but still another uid: the course's files kept from it by their modes
        candidates.append(Isolation("sandbox", user_switch=True))
    candidates.append(Isolation("sandbox"))
    no_other_uid = None  # why the form without namespaces but with a uid of its own did not start
    for candidate in candidates:
        problem = probe(candidate)
        if problem is None:
            break
        if candidate.user_switch and not candidate.namespaces:
            no_other_uid = problem
        else:
            reasons.append(problem)
    else:  # not even the init runs here (not Linux?): plain processes, said once
        reasons += [no_other_uid] if no_other_uid else []
        return Isolation("none", warnings=(f"no sandbox can start here ({'; '.join(reasons)}): workers run as plain "
                                           "processes, as with --isolation none",))
    if not candidate.namespaces and candidate.user_switch:
        degraded_user_switch()
        warnings.append(f"sandbox without namespaces ({reasons[-1]}): a worker runs as a dedicated uid, so it reads "
                        "only what every user may (the grader's files are made 0700/0600), but it can use the network, "
                        "see other processes, and a process it starts could outlive it" + _container_hint())
    elif not candidate.namespaces:
        other = f"; as root, no worker uid of its own either ({no_other_uid})" if no_other_uid else ""
        warnings.append(f"sandbox without namespaces ({reasons[-1]}{other}): a worker can use the network, read every "
                        "file its user can, see other processes, and a process it starts could outlive it"
                        + _container_hint())
    elif root and not candidate.user_switch:
        warnings.append(f"sandbox without a separate user ({reasons[0]}): workers run as root inside their namespaces")
    return Isolation(candidate.mode, candidate.namespaces, candidate.user_namespace, candidate.user_switch,
                     tuple(warnings))


def degraded_user_switch() -> None:
    """Root without namespaces: the worker's uid shares the grader's file system, so from here on
    everything this process makes is its own alone (umask 077): its temporary folders, the inputs
    of every case, the reference's outputs, results.json. What a worker must read is opened to it
    by name (`_open_to_worker`): the job folder and the way to it, its inputs (0644), the worker's
    copy of the grader's code. A course folder made before (Gradescope's /autograder/source) is
    the caller's to close (grader.kit.gradescope)."""
    os.umask(os.umask(0o077) | 0o077)


def _open_to_worker(launch: Launch, uid: int) -> None:
    """Without namespaces (no view): the worker's own folders (cwd, scratch, outputs) become its
    uid's, and the job folder and every folder on the way to it under the temp folder become
    traversable (o+x: entered by name, never listed), all else in them being 0700/0600
    (`degraded_user_switch`). The job folder itself stays the grader's, so the worker cannot put
    a link where the grader writes its inputs. Refused (SandboxError) for a job outside the temp
    folder: opening a way there could open more than the job."""
    job = Path(os.path.realpath(launch.job))
    top = Path(os.path.realpath(tempfile.gettempdir()))
    if job != top and top not in job.parents:
        raise SandboxError(f"the job folder {job} is not under {top}: a worker uid without namespaces reaches "
                           "only what the temp folder holds")
    for folder in [job, *job.parents]:
        if folder == top:
            break
        st = os.lstat(folder)
        if st.st_uid == os.geteuid() and not st.st_mode & 0o001:
            os.chmod(folder, stat.S_IMODE(st.st_mode) | 0o001)
    for own in launch.writable:
        chown_tree(Path(own), uid, uid)


def _container_hint() -> str:
    """What to do where the grader itself runs in a container (which refuses namespaces unless
    given the privileges), else nothing."""
    if not (os.path.exists("/run/.containerenv") or os.path.exists("/.dockerenv")):
        return ""
    return ("; the grader runs in a container: give it --cap-add SYS_ADMIN --security-opt seccomp=unconfined, "
            "or grade with --isolation docker from the host (docs/security.md, \"The grading image\")")


def start(launch: Launch, isolation: Isolation, sandbox: SandboxState) -> Started:
    """The init (under `unshare` where namespaces work), its configuration on stdin, the worker
    its child; the init reports the worker's end on a status pipe and dies with the grader
    (its lifeline)."""
    # the same init, view, uid, limits
    code = sandbox.worker_code()
    forked = zygote.try_start(launch, sandbox, isolation, lambda channel, status_tx, lifeline_rx:
                              _config(launch, isolation, worker_argv(*map(str, channel), path=str(code)), channel,
                                      status_tx, lifeline_rx, code))
    if forked is not None:
        return forked
    (rx, tx), channel = pipe_pair()
    argv = launch.command or worker_argv(*map(str, channel), path=str(code))
    status_rx, status_tx = os.pipe()
    lifeline_rx, lifeline = os.pipe()  # the init's lifeline: EOF when the grader is gone
    lease = None
    try:
        config, lease = _config(launch, isolation, argv, channel, status_tx, lifeline_rx, code)
        # the configuration goes in on stdin, not argv, and so does the grader's folder: the worker
        # can read its init's /proc/1/cmdline
        init = [sys.executable, "-I", "-c", "import sys, json; sys.path.insert(0, json.loads(sys.stdin.readline())); "
                f"from grader.sandbox.init import main; sys.exit(main(json.load(sys.stdin)))  # {CHECKOUT_TAG}"]
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
    assert proc.stdin is not None  # started with stdin=PIPE
    try:
        proc.stdin.write((json.dumps(PACKAGE_PARENT) + "\n" + json.dumps(config)).encode())
        proc.stdin.close()
    except BrokenPipeError:
        pass  # it failed before reading: its output and status say why
    return Started(proc, rx, tx, status_rx, lifeline, lease)


def _config(launch: Launch, isolation: Isolation, argv: list[str], channel: tuple[int, int], status_tx: int,
            lifeline_rx: int, code: Path) -> tuple[dict, JobLease | None]:
    """What the init is told (grader.sandbox.init.main), and the job's uid lease it takes;
    `code`: the session's copy of the worker's code (SandboxState.worker_code)."""
    lease = None
    user = None
    if isolation.user_switch:
        lease = JobLease(launch.job, launch.settings.sandbox_uids)
        user = [lease.uid, lease.uid]
        if isolation.namespaces:  # the job folder is mounted read-only in its view
            chown_tree(launch.job, *user)
        else:
            _open_to_worker(launch, lease.uid)
    return {
        "argv": argv,
        "cwd": str(launch.cwd),
        "env": launch.env,
        "limits": launch.limits.for_worker(user is not None, launch.interpret),
        "user": user,
        "view": (sandbox_view(launch.job, launch.writable, launch.hide, launch.settings, code, launch.readable)
                 if isolation.namespaces else None),
        "pass_fds": list(channel),
        "status_fd": status_tx,
        "lifeline_fd": lifeline_rx,
        "own_pid_namespace": isolation.namespaces,
        "loopback": launch.loopback,
        "code": str(code),  # a forked worker's imports from here on (grader.sandbox.zygote)
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

# what a Python, torch and Triton process needs of the system (read-only): programs, libraries
# (libcuda under /usr/lib*), the loader's cache, gcc and Python's headers for Triton's launcher
SYSTEM = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/etc")
DEVICES = ("/dev", "/sys")  # GPUs' device nodes, the driver's files (read-only)
SCRATCH = ("/tmp", "/var/tmp", "/dev/shm")  # private and empty in every worker


def _inside(path: str, folder: str) -> bool:
    return path == folder or path.startswith(folder.rstrip("/") + "/")


@functools.lru_cache(maxsize=None)
def _worker_sys_path() -> tuple[str, ...]:
    """The folders a worker's interpreter (`python -I`) imports from: the standard library,
    site-packages and what their .pth files add (an editable torch or Triton, say)."""
    try:
        out = subprocess.run([sys.executable, "-I", "-c", "import json, sys; print(json.dumps(sys.path))"], cwd="/",
                             env={"PATH": os.environ.get("PATH", "/usr/bin:/bin")}, capture_output=True, text=True,
                             timeout=60)
        return tuple(json.loads(out.stdout))
    except (OSError, ValueError, subprocess.SubprocessError):
        return tuple(sys.path)


def private_folders(hide: list[Path], settings: Settings) -> list[str]:
    """Folders no worker may see, wherever they lie: the course `settings` name or imply (its
    checkout, whatever it holds), the grader's own code, the grader's home, and `hide` (the
    submissions, the output folder, the references)."""
    installed = installed_package()
    folders = [settings.course_folder(), Path(PACKAGE_PARENT) if installed is None else Path(installed), Path.home(),
               *hide]
    return sorted({os.path.realpath(p) for p in folders})


def installed_package() -> str | None:
    """The grader's package folder where it is installed (from a wheel, in the image): the folder
    above it is then site-packages, which the worker imports torch and Triton from, so only
    `grader/` is hidden (covered) there; in a checkout (None) the whole folder above is private."""
    parent = Path(PACKAGE_PARENT)
    return os.path.realpath(parent / "grader") if parent.name in ("site-packages", "dist-packages") else None


def sandbox_view(job: Path, writable: list[Path], hide: list[Path], settings: Settings, code: Path,
                 also_readable: list[Path] | None = None) -> dict:
    """The worker's view (grader.sandbox.init.build_view): an allowlist, nothing else of the host.
    Read-only: the system folders, the Python install (prefixes, site-packages, the user site,
    what its .pth files add), CUDA's folders (LD_LIBRARY_PATH, CUDA_HOME), the worker's own copy
    of the grader's code (`code`, SandboxState.worker_code), the job folder, the folders in `also_readable`
    (the grader's own choice: Nsight Compute's install for a profiled replay); /dev and /sys read-only, the
    namespace's own /proc; the worker's own folders writable; /tmp, /var/tmp, /dev/shm and the
    temp folder private and empty. No folder that holds a private one (the course, above all) is
    bound; a private folder inside a bound one is covered by an empty read-only tmpfs."""
    private = private_folders(hide, settings)
    site_dirs = {sys.prefix, sys.base_prefix, sys.exec_prefix, *site.getsitepackages(), *_worker_sys_path()}
    user_site = site.getusersitepackages()
    if user_site:
        site_dirs.add(user_site)
    libraries = os.environ.get("LD_LIBRARY_PATH", "").split(os.pathsep) + [os.environ.get("CUDA_HOME", "")]
    wanted = [p for p in (*site_dirs, *libraries, *map(str, also_readable or ()))
              if p and os.path.isabs(p) and os.path.isdir(p)]
    # never a folder that is, or holds, the course or another private folder
    # (an installed grader's package is covered instead: its site-packages is the worker's too)
    readable = {os.path.realpath(p) for p in wanted
                if not any(_inside(c, os.path.realpath(p)) for c in private if c != installed_package())}
    readable |= {os.path.realpath(p) for p in (*SYSTEM, *DEVICES) if os.path.isdir(p) and not os.path.islink(p)}
    readable.add(str(code))
    readable.add(os.path.realpath(job))
    # one bind for a folder and what it holds (the prefix and its site-packages), unless a private
    # folder lies between them (a course's own .venv: its prefix is bound, the course is not)
    readable = {p for p in readable
                if not any(_inside(p, q) and p != q and not any(_inside(p, c) and _inside(c, q) for c in private)
                                               for q in readable)}
    binds = {p: False for p in readable}
    binds["/proc"] = True  # this PID namespace's own (mounted fresh by unshare --mount-proc, or the zygote)
    binds.update({os.path.realpath(p): True for p in writable})
    links = [(p, os.readlink(p)) for p in SYSTEM if os.path.islink(p)]  # /bin -> usr/bin
    known: list[str | Path] = [*wanted, job, *writable]
    for p in known:  # a folder also known by another path (a link on the way)
        alias = os.path.abspath(p)
        real = os.path.realpath(p)
        if alias != real and any(_inside(real, b) for b in binds) and not any(_inside(alias, b) for b in binds):
            links.append((alias, real))
    links = [(p, t) for p, t in set(links) if not any(_inside(p, q) and p != q for q, _ in links)]  # one link is enough
    scratch = sorted({os.path.realpath(d) for d in (*SCRATCH, tempfile.gettempdir())} - set(binds))
    covers = sorted(p for p in private if any(_inside(p, b) and p != b for b in binds))
    return {"binds": sorted(binds.items()), "links": sorted(set(links)), "scratch": scratch, "covers": covers,
            "tmpfs_size": "256m", "outer_mount_namespace": os.readlink("/proc/self/ns/mnt")}
