"""Start and talk to a worker process, and contain it.

Three ways to contain a worker (`--isolation`), strongest first where it is available:

- `sandbox` (default, no Docker): `grader.sandbox_init` runs first in fresh network, PID and
  mount namespaces (`unshare`; a user namespace too when not root). It gives the worker a view
  of the file system in which the private folders (reference/, the grader's home, the temp
  dirs, the output folder and the submissions) are blank, everything is read-only but its
  job folder, and then drops it to a dedicated unprivileged uid (when the grader is root),
  with resource limits. When the worker ends or times out, every process it started dies
  with the namespace. Where namespaces are not available this is said once and the worker
  runs with what is left: its own session, limits, a subreaper that sweeps its children.
- `docker`: one container per worker (see `docker_command`).
- `none`: a plain child process with limits and a scrubbed environment (for debugging).

In every mode requests and replies go over a private pipe pair (FIFOs in docker), never
stdout, so printing cannot forge a reply; stdout/stderr are captured with head and tail
kept. A reply that does not come in time, or a worker that dies, raises WorkerFailure here;
the caller records the outcome and starts a fresh worker for what is left.
"""

from __future__ import annotations

import fcntl
import functools
import json
import os
import pwd
import secrets
import select
import shutil
import signal
import stat
import site
import subprocess
import sys
import tempfile
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import grader
from grader import zygote
from grader.sandbox_init import apply_limits, children_of

PACKAGE_PARENT = str(Path(grader.__file__).resolve().parent.parent)
MAX_REPLY_BYTES = 16 << 20
ISOLATION_MODES = ("sandbox", "docker", "none")
# uids for workers: above login.defs' UID_MAX (60000), below systemd's dynamic users (61184)
UID_RANGE = os.environ.get("GRADER_SANDBOX_UIDS", "60100-61099")
DOCKER_IMAGE = os.environ.get("GRADER_DOCKER_IMAGE", "grader")
# the image's `student` user (see the Dockerfile); a grader that is not root cannot give it the
# job folder, so its containers run as the grader's own uid (a user only inside the container)
DOCKER_USER = "10001:10001" if os.geteuid() == 0 else f"{os.getuid()}:{os.getgid()}"
# The worker's entry point: -I keeps the current folder (where a student could plant a
# torch.py or a grader/ package) and PYTHON* variables out of sys.path; the grader is put back.
BOOTSTRAP = "import sys; sys.path.insert(0, {path!r}); from grader.worker import main; main(sys.argv[1:])"


class SandboxError(Exception):
    """The sandbox cannot be set up at all: an infrastructure problem, not the student's."""


class WorkerFailure(Exception):
    """The worker did not answer: `outcome` is "timeout", "crashed" or "infra_error"."""

    def __init__(self, outcome: str, message: str, output: str) -> None:
        super().__init__(message)
        self.outcome = outcome
        self.message = message
        self.output = output


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


@dataclass
class Limits:
    """Resource limits of a worker (setrlimit). `processes` counts threads too and is per
    uid, so it is set only for a dedicated worker uid; `address_space` only in the CPU
    interpreter (CUDA reserves terabytes of virtual addresses)."""

    file_size: int = 4 << 30  # a worker writes outputs; a 100 GB file is an attack
    open_files: int = 1024
    cpu_seconds: int = 3600
    processes: int = 512
    address_space: int = field(default_factory=lambda: _memory_default())
    memory: int = field(default_factory=lambda: _memory_default())  # docker: --memory, swap included

    def for_worker(self, dedicated_uid: bool, interpret: bool) -> dict:
        return {
            "file_size": self.file_size,
            "open_files": self.open_files,
            "cpu_seconds": self.cpu_seconds,
            "core": 0,
            "processes": self.processes if dedicated_uid else None,
            "address_space": self.address_space if interpret else None,
        }


def _memory_default() -> int:
    """Three quarters of this machine's memory, at most 32 GiB."""
    try:
        total = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError):
        total = 32 << 30
    return min(32 << 30, total * 3 // 4)


def worker_env(scratch: Path, interpret: bool, gpu: str | None) -> dict[str, str]:
    """Only what a worker needs: no tokens, no seed, no grader settings."""
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": str(scratch),
        "TMPDIR": str(scratch),
        "LANG": "C.UTF-8",
        # a worker's uid may have no passwd entry: getpass.getuser() (torch calls it at import)
        # reads these first, and torch's compile caches go to the worker's own scratch
        "USER": "grader-worker",
        "LOGNAME": "grader-worker",
        "TORCHINDUCTOR_CACHE_DIR": str(scratch / "inductor-cache"),
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


def worker_argv(*channel: str) -> list[str]:
    return [sys.executable, "-I", "-u", "-B", "-c", BOOTSTRAP.format(path=PACKAGE_PARENT), *channel]


# -- what this machine allows ---------------------------------------------------------------

@dataclass(frozen=True)
class Isolation:
    """How workers are contained on this machine, found once per process by `detect`."""

    mode: str  # sandbox | docker | none
    namespaces: bool = False  # network, PID and mount namespaces (unshare)
    user_namespace: bool = False  # not root: the namespaces hang off a user namespace
    user_switch: bool = False  # root: each worker runs as a dedicated unprivileged uid
    warnings: tuple[str, ...] = ()

    def describe(self) -> dict:
        if self.mode != "sandbox":
            return {"mode": self.mode, "warnings": list(self.warnings)}
        return {
            "mode": self.mode,
            "network": "none (own network namespace)" if self.namespaces else "the host's",
            "processes": "own PID namespace: all killed with the worker" if self.namespaces else "own session; children swept",
            "files": "private view: job folder writable, the rest read-only, private folders blank" if self.namespaces
            else "everything its user can reach",
            "user": "a dedicated unprivileged uid" if self.user_switch else ("the grader's own (in a user namespace)"
                                                                            if self.user_namespace else "the grader's own"),
            "warnings": list(self.warnings),
        }


@functools.lru_cache(maxsize=None)
def detect(mode: str = "sandbox") -> Isolation:
    """What `mode` can do here, tried for real once (a worker start that imports nothing of
    the student's); what is missing is said in `warnings`, to be shown once per run."""
    if mode not in ISOLATION_MODES:
        raise SandboxError(f"--isolation must be one of {', '.join(ISOLATION_MODES)}, not {mode!r}")
    if mode == "none":
        return Isolation("none", warnings=("--isolation none: the worker runs as you, on the network, and sees every file you can",))
    if mode == "docker":
        if shutil.which("docker") is None:
            raise SandboxError("--isolation docker: no `docker` command on this machine (use the default, --isolation sandbox)")
        return Isolation("docker")
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
        problem = _probe(candidate)
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


PROBE = ("import os, grader.worker, numpy, safetensors, torch, triton\n"
         "if os.environ.get('CUDA_VISIBLE_DEVICES') != '':\n"  # a GPU worker must reach the GPU from inside
         "    torch.zeros(1, device='cuda')\n")


def _has_gpu() -> bool:
    import torch

    return torch.cuda.is_available()


def _probe(isolation: Isolation) -> str | None:
    """None if a worker can start under `isolation`, else why not (one line)."""
    with tempfile.TemporaryDirectory(prefix="grader-probe-") as tmp:
        job = Path(tmp)
        (job / "repo").mkdir()
        try:
            proc = WorkerProcess(job / "repo", job / "scratch", interpret=not _has_gpu(), isolation=isolation,
                                 command=[sys.executable, "-I", "-c", f"import sys; sys.path.insert(0, {PACKAGE_PARENT!r})\n" + PROBE],
                                 probe=PROBE)
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


# -- dedicated uids ---------------------------------------------------------------------------

class UidLease:
    """A uid (and gid of the same number) from UID_RANGE that no account owns, no process
    runs as, and no other worker holds (an flock on a file per uid, across grader processes)."""

    def __init__(self) -> None:
        first, last = (int(x) for x in UID_RANGE.split("-"))
        folder = Path("/run/grader-sandbox") if os.access("/run", os.W_OK) else Path(tempfile.gettempdir()) / "grader-sandbox-uids"
        folder.mkdir(mode=0o700, exist_ok=True)
        if folder.is_symlink() or folder.stat().st_uid != os.geteuid():
            raise SandboxError(f"{folder} is not the grader's own folder")
        busy = _uids_in_use()
        for uid in range(first, last + 1):
            if uid in busy or _has_account(uid):
                continue
            fd = os.open(folder / str(uid), os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                continue
            self.uid, self.fd = uid, fd
            return
        raise SandboxError(f"no free worker uid in {UID_RANGE} (set GRADER_SANDBOX_UIDS=first-last)")

    def release(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


class JobLease:
    """The uid of a job's workers, shared by every worker of that job alive at once. Each
    start hands the job folder to its worker's uid, so a second uid (the interpreter replay
    started beside the GPU worker) would lock the first worker out of its own outputs/."""

    _held: dict[str, list] = {}  # job folder -> [UidLease, workers using it]
    _lock = threading.Lock()

    def __init__(self, job: Path) -> None:
        self.key = str(Path(job).resolve())
        with self._lock:
            entry = self._held.get(self.key)
            if entry is None:
                entry = self._held[self.key] = [UidLease(), 0]
            entry[1] += 1
            self.uid = entry[0].uid

    def release(self) -> None:
        if self.key is None:
            return
        key, self.key = self.key, None
        with self._lock:
            entry = self._held[key]
            entry[1] -= 1
            if entry[1] == 0:
                entry[0].release()
                del self._held[key]


def _has_account(uid: int) -> bool:
    try:
        pwd.getpwuid(uid)
        return True
    except KeyError:
        return False


def _uids_in_use() -> set[int]:
    uids = set()
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                uids.add(os.stat(f"/proc/{entry}").st_uid)
            except OSError:
                pass
    return uids


def _chown_tree(folder: Path, uid: int, gid: int) -> None:
    """Give the worker's uid its job folder. Never follows a link: a submission may hold a
    symlink to /etc/shadow, and chown through it would hand that file over. Never hands over a
    file with a second hard link either: it is shared beyond the job (the run's input sets,
    grader.runcache), and its owner is who may write it."""
    os.chown(folder, uid, gid, follow_symlinks=False)
    for parent, dirs, files in os.walk(folder):
        for name in dirs + files:
            path = os.path.join(parent, name)
            st = os.lstat(path)
            if stat.S_ISREG(st.st_mode) and st.st_nlink > 1:
                continue
            os.chown(path, uid, gid, follow_symlinks=False)


# -- warm starts ------------------------------------------------------------------------------

def _zygote_key(env: dict[str, str]) -> tuple[tuple, dict[str, str]]:
    """Workers whose environments differ only in their own folders share a zygote."""
    base = {k: v for k, v in env.items() if k not in ("HOME", "TMPDIR", "TRITON_CACHE_DIR", "TORCHINDUCTOR_CACHE_DIR")}
    return tuple(sorted(base.items())), base


def prewarm(interpret: bool, gpu: str | None, isolation: str = "sandbox") -> None:
    """Start the zygotes this grade will fork from (a GPU run also replays in the interpreter),
    so their imports overlap whatever comes first. Starting one does not wait for it."""
    if isolation == "docker" or not zygote.enabled():
        return
    for interp in ({True} if interpret else {False, True}):
        try:
            zygote.get(*_zygote_key(worker_env(Path(tempfile.gettempdir()), interp, None if interp else gpu)))
        except zygote.ZygoteError:
            return


# -- the worker's view of the file system -------------------------------------------------------

NEVER_COVERED = {"/", "/usr", "/etc", "/lib", "/lib64", "/lib32", "/bin", "/sbin", "/var", "/opt", "/dev", "/proc", "/sys", "/run"}


def sandbox_view(job: Path, writable: list[Path], hide: list[Path]) -> dict:
    """Folders blanked (private), kept read-only (what Python and the grader need) and kept
    writable (the worker's own) in the worker's mount namespace; see sandbox_init.build_view."""
    from grader.spec import COURSE_ROOT

    # assignments/ too: every assignment's hidden.py and the course secret (a worker could print them)
    private = [COURSE_ROOT / "reference", COURSE_ROOT / "assignments", Path.home(), *hide]
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


# -- a worker ---------------------------------------------------------------------------------------

class WorkerProcess:
    """One worker: `cwd` is the private repo copy, `scratch` its home/temp/Triton cache, both
    writable, as is every folder in `writable` (where it saves outputs); `job` (default: the
    folder holding cwd and scratch) is readable; `hide` names more private folders."""

    def __init__(self, cwd: Path, scratch: Path, interpret: bool, gpu: str | None = None, limits: Limits | None = None,
                 isolation: Isolation | str = "sandbox", writable: list[Path] = (), hide: list[Path] = (),
                 job: Path | None = None, command: list[str] | None = None, triton_cache: Path | None = None,
                 probe: str | None = None) -> None:
        self.isolation = isolation if isinstance(isolation, Isolation) else detect(isolation)
        self.lease: JobLease | None = None
        self.container: str | None = None
        self._status_rx = self._lifeline = -1
        self._status = b""
        scratch.mkdir(parents=True, exist_ok=True)
        limits = limits or Limits()
        writable = [Path(cwd), Path(scratch), *map(Path, writable)]
        for w in writable:
            w.mkdir(parents=True, exist_ok=True)
        job = Path(job or os.path.commonpath([cwd, scratch]))
        env = worker_env(scratch, interpret, gpu)
        if triton_cache is not None:  # the trusted worker's, shared by a run (never a student's)
            env["TRITON_CACHE_DIR"] = str(triton_cache)
        mode = self.isolation.mode
        if mode == "docker":
            self._start_docker(cwd, scratch, job, writable, env, gpu, limits, interpret, command)
            return
        if zygote.enabled() and (command is None or probe is not None):
            try:  # a fork of this process's zygote: the same sandbox, no fresh interpreter
                self._start_forked(cwd, job, writable, list(hide), env, limits, interpret, gpu, probe)
                self.output = CappedOutput(self.proc.stdout)
                self._buffer = b""
                return
            except zygote.ZygoteError as exc:  # ours, not the student's: start them as fresh interpreters from now on
                zygote.disable(str(exc))
        child_rx, self._tx = os.pipe()
        self._rx, child_tx = os.pipe()
        argv = command or worker_argv(str(child_rx), str(child_tx))
        if mode == "none":
            self.proc = subprocess.Popen(
                argv, cwd=cwd, env=env, pass_fds=(child_rx, child_tx), stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True,
                preexec_fn=functools.partial(apply_limits, limits.for_worker(False, interpret)),
            )
            os.close(child_rx)
            os.close(child_tx)
            self.output = CappedOutput(self.proc.stdout)
        else:
            self._start_sandbox(cwd, scratch, job, writable, list(hide), env, limits, interpret, argv, (child_rx, child_tx))
            self.output = CappedOutput(self.proc.stdout)
        self._buffer = b""

    # -- the default sandbox ------------------------------------------------------------------
    def _sandbox_config(self, cwd, job, writable, hide, env, limits, interpret, argv, channel, status_tx, lifeline_rx) -> dict:
        """What the sandbox's init is told (grader.sandbox_init.main); takes the job's uid."""
        iso = self.isolation
        user = None
        if iso.user_switch:
            self.lease = JobLease(job)
            user = [self.lease.uid, self.lease.uid]
            _chown_tree(job, *user)
        return {
            "argv": argv,
            "cwd": str(cwd),
            "env": env,
            "limits": limits.for_worker(user is not None, interpret),
            "user": user,
            "view": sandbox_view(job, writable, hide) if iso.namespaces else None,
            "pass_fds": list(channel),
            "status_fd": status_tx,
            "lifeline_fd": lifeline_rx,
            "own_pid_namespace": iso.namespaces,
        }

    def _start_forked(self, cwd, job, writable, hide, env, limits, interpret, gpu, probe) -> None:
        """The same worker, forked by this process's zygote (grader.zygote) instead of a fresh
        interpreter: same configuration, same init, same view, uid and limits."""
        iso = self.isolation
        child_rx, self._tx = os.pipe()
        self._rx, child_tx = os.pipe()
        channel = (child_rx, child_tx)
        argv = worker_argv(str(child_rx), str(child_tx))
        self._status_rx, status_tx = os.pipe()
        lifeline_rx, self._lifeline = os.pipe()
        out_rx, out_tx = os.pipe()
        try:
            if iso.mode == "none":
                config = {"cwd": str(cwd), "env": env, "limits": limits.for_worker(False, interpret), "pass_fds": list(channel),
                          "status_fd": status_tx, "lifeline_fd": lifeline_rx}
            else:
                config = self._sandbox_config(cwd, job, writable, hide, env, limits, interpret, argv, channel, status_tx, lifeline_rx)
            z = zygote.get(*_zygote_key(env))
            pid = z.fork({"mode": iso.mode, "namespaces": iso.namespaces, "user_namespace": iso.user_namespace,
                          "config": config, "probe": probe},
                         {"status_fd": status_tx, "lifeline_fd": lifeline_rx, "output": out_tx, "pass": list(channel)})
        except BaseException:
            for fd in (self._status_rx, self._lifeline, self._tx, self._rx, out_rx):
                os.close(fd)
            self._status_rx = self._lifeline = -1
            if self.lease:
                self.lease.release()
                self.lease = None
            raise
        finally:
            for fd in (*channel, status_tx, lifeline_rx, out_tx):
                os.close(fd)
        self.proc = zygote.Forked(z, pid, os.fdopen(out_rx, "rb"))

    def _start_sandbox(self, cwd, scratch, job, writable, hide, env, limits, interpret, argv, channel) -> None:
        iso = self.isolation
        self._status_rx, status_tx = os.pipe()
        lifeline_rx, self._lifeline = os.pipe()  # the init's lifeline: EOF when the grader is gone
        try:
            config = self._sandbox_config(cwd, job, writable, hide, env, limits, interpret, argv, channel, status_tx, lifeline_rx)
            # the configuration goes in on stdin, not argv: the worker can read its init's /proc/1/cmdline
            init = [sys.executable, "-I", "-c", "import sys, json; sys.path.insert(0, sys.argv[1]); "
                    "from grader.sandbox_init import main; sys.exit(main(json.load(sys.stdin)))", PACKAGE_PARENT]
            if iso.namespaces:
                init = ["unshare", *(["--user", "--map-root-user"] if iso.user_namespace else []),
                        "--net", "--pid", "--fork", "--kill-child", "--mount-proc", *init]
            self.proc = subprocess.Popen(init, cwd="/", env=env, pass_fds=(*channel, status_tx, lifeline_rx),
                                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                         start_new_session=True)
        except BaseException:
            for fd in (self._status_rx, self._lifeline, self._tx, self._rx):
                os.close(fd)
            if self.lease:
                self.lease.release()
            raise
        finally:
            for fd in (*channel, status_tx, lifeline_rx):
                os.close(fd)
        try:
            self.proc.stdin.write(json.dumps(config).encode())
            self.proc.stdin.close()
        except BrokenPipeError:
            pass  # it failed before reading: its output and status say why

    # -- containers ----------------------------------------------------------------------------
    def _start_docker(self, cwd, scratch, job, writable, env, gpu, limits, interpret, command) -> None:
        channel = Path(scratch) / ".channel"
        channel.mkdir(exist_ok=True)
        requests, replies = channel / "requests", channel / "replies"
        for fifo in (requests, replies):
            os.mkfifo(fifo, 0o600)
        if os.geteuid() == 0:
            uid, gid = (int(x) for x in DOCKER_USER.split(":"))
            _chown_tree(job, uid, gid)
        self._rx = os.open(replies, os.O_RDONLY | os.O_NONBLOCK)  # never blocks; EOF only once a writer came and went
        self._tx = os.open(requests, os.O_RDWR)  # holds a reader too, so neither side's open blocks
        self.container = f"grader-worker-{secrets.token_hex(6)}"
        argv = docker_command(self.container, cwd, job, writable, env, gpu, limits, interpret,
                              command or ["python", "-I", "-u", "-B", "-c", BOOTSTRAP.format(path="/opt/grader-host"),
                                          str(requests), str(replies)])
        self.proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                     start_new_session=True)
        self.output = CappedOutput(self.proc.stdout)
        self._buffer = b""

    # -- requests --------------------------------------------------------------------------------
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
        try:
            return json.loads(line)
        except ValueError:
            self.kill()
            raise WorkerFailure("crashed", "the worker sent a malformed reply", self.output.text()) from None

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
            return WorkerFailure("infra_error", f"the sandbox failed (not the submission's fault): {status['setup_error']}",
                                 self.output.text())
        if "signal" in status:
            code = -status["signal"]
        elif "exit" in status:
            code = status["exit"]
        elif self.container and code > 128:
            code = -(code - 128)  # docker reports a signal as 128 + its number
        if code < 0:
            name = signal.Signals(-code).name
            how = f"killed by signal {name}" + {"SIGSEGV": " (segmentation fault)", "SIGABRT": " (abort)",
                                                "SIGXCPU": " (CPU time limit)", "SIGXFSZ": " (file size limit)"}.get(name, "")
        else:
            how = f"exited with status {code} (sys.exit, os._exit or a fatal error)"
        return WorkerFailure("crashed", f"the worker process died: {how}", self.output.text())

    def kill(self) -> None:
        """Kill the worker and everything it started. In namespaces: SIGKILL to the init,
        whose death takes the whole PID namespace with it; the wait returns once all are gone."""
        if self.container:
            subprocess.run(["docker", "kill", self.container], capture_output=True, timeout=60)
        elif self.isolation.mode == "sandbox" and self.proc.poll() is None:
            if self.isolation.namespaces:
                for init in children_of(self.proc.pid):  # unshare's child: PID 1 of the namespace
                    _signal(init, signal.SIGKILL)
            else:
                _signal(self.proc.pid, signal.SIGTERM)  # the init sweeps its descendants, then exits
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                pass
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
        if self.container:
            subprocess.run(["docker", "rm", "-f", self.container], capture_output=True, timeout=60)
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


def _signal(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def docker_command(name: str, cwd: Path, job: Path, writable: list[Path], env: dict[str, str], gpu: str | None,
                   limits: Limits, interpret: bool, command: list[str], image: str = DOCKER_IMAGE) -> list[str]:
    """`docker run` for one worker: no network, a read-only root with a private /tmp, the job
    folder mounted at its own path (read-only, its writable folders on top), the grader
    package mounted read-only (so the worker speaks this grader's protocol), a non-root user,
    no capabilities, no privilege gain, a pids limit, memory without swap, and one GPU."""
    memory = f"{max(1, limits.memory >> 20)}m"
    argv = [
        "docker", "run", "--rm", "--name", name, "--init",
        "--network", "none", "--read-only", "--tmpfs", "/tmp:rw,nosuid,nodev,size=256m",
        "--user", DOCKER_USER, "--cap-drop", "ALL", "--security-opt", "no-new-privileges",
        "--pids-limit", str(limits.processes), "--memory", memory, "--memory-swap", memory,
        "--ulimit", f"nofile={limits.open_files}", "--ulimit", f"fsize={limits.file_size}",
        "--ulimit", f"cpu={limits.cpu_seconds}", "--ulimit", "core=0",
        "--mount", f"type=bind,source={job},target={job},readonly",
    ]
    for w in writable:
        argv += ["--mount", f"type=bind,source={w},target={w}"]
    argv += ["--mount", f"type=bind,source={Path(PACKAGE_PARENT) / 'grader'},target=/opt/grader-host/grader,readonly"]
    if not interpret:
        argv += ["--gpus", f'"device={gpu or 0}"']
    argv += ["--workdir", str(cwd)]
    for key, value in env.items():
        if key == "CUDA_VISIBLE_DEVICES" and not interpret:
            continue  # inside, the one GPU given is device 0
        if key == "PATH":
            continue  # the image's own
        argv += ["--env", f"{key}={value if key != 'PYTHONPATH' else '/opt/grader-host'}"]
    return argv + [image, *command]


def place(source: Path, dest: Path, link: bool) -> None:
    """dest becomes source's content: a hard link if asked and possible, else a copy."""
    if link:
        try:
            os.link(source, dest)
            return
        except OSError:  # another file system, or links not allowed: copy
            pass
    shutil.copyfile(source, dest)


@contextmanager
def shown_to_worker(source: Path, workdir: Path, link: bool = False):
    """Inputs are made outside the worker's view; each file is shown to it (a readable copy in
    the job's inputs/ folder, or a hard link where the worker cannot write it: see
    `worker_cannot_write`) only for the request that needs it, so no input can be read ahead,
    at import, and answered from a precomputed cache."""
    shown = workdir / "inputs" / source.name
    shown.parent.mkdir(mode=0o755, parents=True, exist_ok=True)
    place(source, shown, link)
    os.chmod(shown, 0o644)  # readable by the worker's uid, whatever the umask
    try:
        yield shown
    finally:
        shown.unlink(missing_ok=True)


def worker_cannot_write(isolation: "Isolation") -> bool:
    """Whether a grader-owned 0644 file in a job folder is safe from that job's worker: it runs
    as another uid, or sees the job folder through a read-only mount. Then a file may be shared
    with other jobs by a hard link instead of copied."""
    return isolation.mode == "sandbox" and (isolation.user_switch or isolation.namespaces)


def output_path(workdir: Path, name: str) -> Path:
    """Where a worker may write: the job's outputs/ folder (read back without following links)."""
    path = workdir / "outputs" / name
    path.parent.mkdir(parents=True, exist_ok=True)
    return path


def read_worker_file(path: Path, limit: int = 4 << 30) -> bytes:
    """Read a file the worker wrote, never through a symlink it planted in its place (the
    grader runs with more rights than the worker, so a link to /etc/shadow must not work)."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    with os.fdopen(fd, "rb") as f:
        if not os.path.stat.S_ISREG(os.fstat(f.fileno()).st_mode):
            raise OSError(f"{path.name} is not a regular file")
        return f.read(limit)
