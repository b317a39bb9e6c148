"""The docker backend (`--isolation docker`): one container per worker (see `docker_command`),
speaking over two FIFOs in the worker's scratch folder, killed and removed by name. The command
is `docker` or one with its CLI (GRADER_CONTAINER_CLI=podman)."""

from __future__ import annotations

import os
import secrets
import shutil
import subprocess
from collections.abc import Callable, Sequence
from pathlib import Path

from grader.sandbox.interpreter import BOOTSTRAP
from grader.sandbox.isolation import Isolation, SandboxError
from grader.sandbox.launch import Launch, Limits, Started
from grader.sandbox.uids import chown_tree
from grader.sandbox.zygote import SandboxState
from grader.settings import Settings

IMAGE_COURSE = "/opt/grader"  # the course folder the Dockerfile copies into the image (GRADER_COURSE there)
# the image's `student` user (see the Dockerfile); a grader that is not root cannot give it the
# job folder, so its containers run as the grader's own uid (a user only inside the container)
DOCKER_USER = "10001:10001" if os.geteuid() == 0 else f"{os.getuid()}:{os.getgid()}"

SUMMARY = "a container per worker"  # what `--isolation` help says of this mode


def missing(settings: Settings) -> str | None:
    """Why `--isolation docker` cannot run here (its command, GRADER_CONTAINER_CLI, is not on
    PATH), else None."""
    if shutil.which(settings.container_cli) is None:
        return (f"--isolation docker: no `{settings.container_cli}` command on this machine "
                "(GRADER_CONTAINER_CLI names another, e.g. podman; or use the default, --isolation sandbox)")
    return None


def detect(probe: Callable[[Isolation], str | None], settings: Settings) -> Isolation:
    """The container command must be here; the image is found when the first worker starts."""
    if (problem := missing(settings)) is not None:
        raise SandboxError(problem)
    return Isolation("docker")


def start(launch: Launch, isolation: Isolation, sandbox: SandboxState) -> Started:
    """`docker run` in the background; the channel is a FIFO pair in the scratch folder, which
    the container sees at the same path."""
    channel = Path(launch.scratch) / ".channel"
    channel.mkdir(exist_ok=True)
    requests, replies = channel / "requests", channel / "replies"
    for fifo in (requests, replies):
        os.mkfifo(fifo, 0o600)
    if os.geteuid() == 0:
        uid, gid = (int(x) for x in DOCKER_USER.split(":"))
        chown_tree(launch.job, uid, gid)
    rx = os.open(replies, os.O_RDONLY | os.O_NONBLOCK)  # never blocks; EOF only once a writer came and went
    tx = os.open(requests, os.O_RDWR)  # holds a reader too, so neither side's open blocks
    container = f"grader-worker-{secrets.token_hex(6)}"
    argv = docker_command(container, launch.cwd, launch.job, launch.writable, launch.env, launch.gpu, launch.limits,
                          launch.interpret, launch.command or ["python", "-I", "-u", "-B", "-c",
                                                              BOOTSTRAP.format(path="/opt/grader-host"),
                                                              str(requests), str(replies)],
                          settings=launch.settings, code=sandbox.worker_code(), readable=launch.readable)
    try:
        proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                start_new_session=True)
    except BaseException:
        os.close(rx)
        os.close(tx)
        raise
    return Started(proc, rx, tx, container=container, container_cli=launch.settings.container_cli)


def kill(started: Started, isolation: Isolation) -> None:
    """The container, by name: `docker run` is only its client."""
    assert started.container is not None  # docker's start names every container
    subprocess.run([started.container_cli, "kill", started.container], capture_output=True, timeout=60)


def cleanup(started: Started) -> None:
    assert started.container is not None  # docker's start names every container
    subprocess.run([started.container_cli, "rm", "-f", started.container], capture_output=True, timeout=60)


def exit_code(code: int) -> int:
    return -(code - 128) if code > 128 else code  # docker reports a signal as 128 + its number


def docker_command(name: str, cwd: Path, job: Path, writable: list[Path], env: dict[str, str], gpu: str | None,
                   limits: Limits, interpret: bool, command: list[str], image: str | None = None, *,
                   settings: Settings, code: Path, readable: Sequence[Path] = ()) -> list[str]:
    """`docker run` for one worker: no network, a read-only root with a private /tmp, the job
    folder mounted at its own path (read-only, its writable folders on top), the worker's copy
    of the grader's code mounted read-only (so the worker speaks this grader's protocol), the
    image's course folder blanked, a non-root user, no capabilities, no privilege gain, a pids
    limit, memory without swap, and one GPU. `settings` name the container command and image;
    `readable`: host folders mounted read-only at their own paths (Nsight Compute's install)."""
    memory = f"{max(1, limits.memory >> 20)}m"
    argv = [
        settings.container_cli, "run", "--rm", "--name", name, "--init",
        "--network", "none", "--read-only", "--tmpfs", "/tmp:rw,nosuid,nodev,size=256m",
        "--user", DOCKER_USER, "--cap-drop", "ALL", "--security-opt", "no-new-privileges",
        "--pids-limit", str(limits.processes), "--memory", memory, "--memory-swap", memory,
        "--ulimit", f"nofile={limits.open_files}", "--ulimit", f"fsize={limits.file_size}",
        "--ulimit", f"cpu={limits.cpu_seconds}", "--ulimit", "core=0",
        "--mount", f"type=bind,source={job},target={job},readonly",
    ]
    if limits.cpus:  # the worker's own CPUs, enforced here by the container's cgroup (cpuset)
        argv += ["--cpuset-cpus", ",".join(map(str, limits.cpus))]
    for w in writable:
        argv += ["--mount", f"type=bind,source={w},target={w}"]
    for r in readable:
        argv += ["--mount", f"type=bind,source={r},target={r},readonly"]
    # the worker's own copy of the grader's code, not the course's grader/ (nor anything beside it)
    argv += ["--mount", f"type=bind,source={code / 'grader'},target=/opt/grader-host/grader,readonly"]
    # the image's course folder (its assignments/, hidden cases included: see the Dockerfile), blank
    # (podman would copy the image's folder into the tmpfs unless told not to)
    podman = Path(argv[0]).name == "podman"
    if podman:
        # podman sets an unset nproc to its maximum, which a runtime without CAP_SYS_RESOURCE
        # refuses. It counts per uid, and every worker container shares one: a bound on all of
        # them together, where --pids-limit is each one's.
        argv += ["--ulimit", f"nproc={8 * limits.processes}"]
    argv += ["--mount", f"type=tmpfs,target={IMAGE_COURSE},tmpfs-size=65536,tmpfs-mode=0555"
             + (",notmpcopyup" if podman else "")]
    if not interpret:  # podman names a GPU by its CDI spec (nvidia-ctk cdi generate)
        argv += ["--device", f"nvidia.com/gpu={gpu or 0}"] if podman else ["--gpus", f'"device={gpu or 0}"']
    argv += ["--workdir", str(cwd)]
    for key, value in env.items():
        if key == "CUDA_VISIBLE_DEVICES" and not interpret:
            continue  # inside, the one GPU given is device 0
        if key == "PATH":
            continue  # the image's own
        argv += ["--env", f"{key}={value}"]
    # the image's entrypoint is the grader's CLI (its other use): the worker's command replaces it
    return argv + ["--env", "PYTHONPATH=/opt/grader-host", "--entrypoint", command[0], image or settings.docker_image,
                   *command[1:]]
