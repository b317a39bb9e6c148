"""What every backend starts a worker with, and what it hands back: the worker's command,
its scrubbed environment and resource limits (`Launch`), and the started process with its
channel (`Started`). No backend logic here, so backends and `WorkerProcess` share it."""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Protocol

from grader.sandbox.interpreter import BOOTSTRAP, PACKAGE_PARENT, isolated_python
from grader.sandbox.uids import JobLease
from grader.settings import Settings

# What a worker runs of the grader: the package's marker, the shared codec and protocol, worker/;
# and replay/, which the replay process (grader.judge.replay_process.run) runs in a sandbox alike.
WORKER_CODE = ("__init__.py", "codec.py", "protocol.py", "worker", "replay")


def copy_worker_code() -> Path:
    """A private read-only copy of the grader code a worker runs (WORKER_CODE), made once per
    session (grader.sandbox.zygote.SandboxState.worker_code): the folder to put on a worker's
    sys.path, and all a sandbox shows it of the grader. So a worker's view holds no part of the
    course folder (its .git, tests, reference/, rosters), whatever else lies beside the grader
    package there. Removed when this process ends."""
    private = Path(tempfile.mkdtemp(prefix="grader-worker-code-"))
    os.chmod(private, 0o711)  # entered, never listed: a worker uid without namespaces reaches lib/ by name
    atexit.register(shutil.rmtree, private, True)
    stage = private / "lib"
    source = Path(PACKAGE_PARENT) / "grader"
    for name in WORKER_CODE:
        if (source / name).is_dir():
            shutil.copytree(source / name, stage / "grader" / name, ignore=lambda _, names: [
                n for n in names if not n.endswith(".py")])
        else:
            (stage / "grader").mkdir(parents=True, exist_ok=True)
            shutil.copyfile(source / name, stage / "grader" / name)
    for folder, _, names in os.walk(stage):  # any worker uid reads it (its view binds it read-only)
        os.chmod(folder, 0o755)
        for name in names:
            os.chmod(os.path.join(folder, name), 0o644)
    return stage


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
    # the CPUs the worker may run on (sched_setaffinity, inherited by all it starts; None: as the
    # grader's): a student's worker is kept off the one CPU the grading process times from
    # (`student_cpus`). An ordinary process may widen its own mask again, so this confines an
    # honest worker's threads, not a hostile one: what decides a score never rests on it
    # (grader.judge.timing.decision counts the student's own threads as its own load)
    cpus: tuple[int, ...] | None = None

    def for_worker(self, dedicated_uid: bool, interpret: bool) -> dict:
        return {
            "cpus": list(self.cpus) if self.cpus else None,
            "file_size": self.file_size,
            "open_files": self.open_files,
            "cpu_seconds": self.cpu_seconds,
            "core": 0,
            "processes": self.processes if dedicated_uid else None,
            "address_space": self.address_space if interpret else None,
        }


def student_cpus() -> tuple[int, ...] | None:
    """The grading process's own CPUs less the first, where it has four or more (None: fewer,
    the worker shares them all): the first is left to the grading process's clock."""
    try:
        mine = sorted(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return None
    return tuple(mine[1:]) if len(mine) >= 4 else None


def _memory_default() -> int:
    """Three quarters of this machine's memory, at most 32 GiB."""
    try:
        total = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError):
        total = 32 << 30
    return min(32 << 30, total * 3 // 4)


def worker_env(scratch: Path, interpret: bool, gpu: str | None, threads: int | None = None) -> dict[str, str]:
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
    if threads is not None:  # this job's share of the cores (Settings.threads, set by grader.batch.executors)
        env["OMP_NUM_THREADS"] = env["MKL_NUM_THREADS"] = str(threads)
    return env


def worker_argv(*channel: str, path: str) -> list[str]:
    """The worker, importing the grader from `path`: its session's private copy of the code
    (SandboxState.worker_code), or the package itself (the plain backend's: it hides nothing)."""
    return isolated_python(BOOTSTRAP, *channel, path=path)


@dataclass
class Launch:
    """One worker to start, whatever contains it. `cwd`, `scratch` and every folder in
    `writable` are its own (writable); `job` is readable; `hide` names more private folders;
    `command` replaces the worker (a probe, a test), else the backend runs the worker with its
    channel's ends as arguments; `probe` is the code a forked start runs for the probe's command
    (grader.sandbox.zygote: a fork has no command line to exec); `readable` names more folders of
    the host its view shows read-only (the grader's choice, never the student's: Nsight Compute's
    install folder for a profiled replay)."""

    cwd: Path
    scratch: Path
    job: Path
    writable: list[Path]
    hide: list[Path]
    env: dict[str, str]
    limits: Limits
    interpret: bool
    gpu: str | None
    command: list[str] | None = None
    probe: str | None = None
    settings: Settings = field(kw_only=True)  # the session's: warm starts, the uid range, the container command
    readable: list[Path] = field(default_factory=list, kw_only=True)
    loopback: bool = field(default=False, kw_only=True)  # its network namespace's loopback up (ncu talks over it)


class StartedProcess(Protocol):
    """A started worker's process as the sandbox uses it, whoever started it: a `subprocess.Popen`,
    or a zygote's fork (`grader.sandbox.zygote.client.Forked`), which has no Popen of its own."""

    @property
    def pid(self) -> int: ...

    @property
    def returncode(self) -> int | None: ...

    @property
    def stdin(self) -> IO[bytes] | None: ...

    @property
    def stdout(self) -> IO[bytes] | None: ...

    def poll(self) -> int | None: ...

    def wait(self, timeout: float | None = None) -> int: ...


@dataclass
class Started:
    """What a backend's start hands to `WorkerProcess`: the process (its stdout and stderr one
    pipe), the grader's ends of the request (`tx`) and reply (`rx`) channel, and what only some
    backends have: the init's status pipe and lifeline, a lent uid, a container's name."""

    proc: StartedProcess  # a Popen, or a zygote's fork
    rx: int
    tx: int
    status_rx: int = -1
    lifeline: int = -1
    lease: JobLease | None = None
    container: str | None = None
    container_cli: str = "docker"  # the command that started the container (and kills it)


def pipe_pair() -> tuple[tuple[int, int], tuple[int, int]]:
    """A private request/reply channel of two pipes: (the grader's rx, tx), (the worker's rx, tx)."""
    child_rx, tx = os.pipe()
    rx, child_tx = os.pipe()
    return (rx, tx), (child_rx, child_tx)
