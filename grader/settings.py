"""The grader's settings from its environment: `from_environment()` is the one place that reads
the `GRADER_*` variables and decides whether we run in CI.

Each process reads them once, where it starts (a `grader` command in grader.cli, a batch's job
process or job server, a Ray task, with `current()`), and passes them down: a grading session
(grader.judge.session) holds them in its `Resources`, which hand each part what it needs (the
device lock, the run cache, the workers and their sandbox, the warm starts), and a batch hands
them to its executors. Nothing below an entry point asks the environment again (a test walks
the package for `current()`), and nothing else in the package reads a `GRADER_*` variable.
(The kit's CI adapters read the CI runner's own variables, such as `GITHUB_OUTPUT` or
Classroom 50's `SUBMISSION_TAG`: they are the runner's contract, not ours.)

| variable | what it sets |
| --- | --- |
| GRADER_COURSE | the course folder (assignments/, reference/); default: found from the package or a kit |
| GRADER_COURSE_SECRET | the secret the graded random shapes come from (else the course's course-secret.txt) |
| GRADER_REFERENCE_DIR | where a Gradescope autograder build takes the reference kernels from |
| GRADER_CACHE_DIR, GRADER_CACHE_GB | where `grader check` keeps input sets and kernels between runs, and how many GiB
(0: none) |
| GRADER_LOCK_DIR | a folder of GPU locks every user's grader on the host shares (root's, 1777; default: your own) |
| GRADER_SANDBOX_UIDS | the uid range sandboxed workers run as (root only) |
| GRADER_THREADS | CPU threads per job process and its workers (a batch sets it per slot) |
| GRADER_DOCKER_IMAGE | the image of `--isolation docker` |
| GRADER_CONTAINER_CLI | the command `--isolation docker` runs containers with (default `docker`; `podman` speaks the
same) |
| GRADER_WARM | 0: no warm start anywhere (no fork server, no kept zygote, no job server) |
| GRADER_ZYGOTE, GRADER_WARM_SECONDS, GRADER_JOB_SERVER | the three warm starts one by one (0 turns one off; seconds a
kept zygote and a warm judge wait) |
| GRADER_RESIDENT | 0: no warm judge for the next `grader check` (grader.resident) |
| CUDA_VISIBLE_DEVICES | the GPUs a batch spreads its jobs over, and a worker's GPU |
| CI, GITHUB_ACTIONS | we run in CI: nothing is kept warm, and no student's kernels are kept |

A CI platform may strip the environment (Classmoji's command grader passes only PATH, HOME,
FORCE_COLOR and a few more), so the runner's own folders say it too (`on_actions_runner`): a
working directory inside an Actions runner's work folder is CI, whatever the variables say.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Mapping

KIT_MANIFEST = "grader-kit.toml"  # marks a student kit (grader release): public specs, no secret
DEFAULT_WARM_SECONDS = 600.0  # how long a check's kept zygote waits for the next check
DEFAULT_SANDBOX_UIDS = "60100-61099"  # above login.defs' UID_MAX (60000), below systemd's dynamic users (61184)


@dataclass(frozen=True)
class WarmStarts:
    """Every way the grader starts warm, as one policy: a fork server (zygote) per job process, a
    zygote and a judge kept between `grader check`s for `keep_seconds`, and a batch's job process
    kept per slot. Warm starts cost no safety (grader.sandbox.zygote), only memory; CI runs each
    job in a fresh machine, so nothing is kept warm there."""

    fork_server: bool = True
    keep_seconds: float = DEFAULT_WARM_SECONDS
    job_server: bool = True
    resident: bool = True  # a judge that has done its imports, kept for the next check (grader.resident)


# the work folder of a GitHub Actions runner: hosted (/home/runner/work), self-hosted (<runner>/_work),
# a container job's (/__w); each holds the runner's `_temp` while a job runs
RUNNER_WORK_FOLDERS = ("work", "_work", "__w")


def on_actions_runner(cwd: Path | None = None) -> bool:
    """`cwd` (default: the working directory) lies in a GitHub Actions runner's work folder
    (`<work>/<repo>/<repo>`, beside the runner's `<work>/_temp`): a CI job, even where its
    platform passed none of the runner's variables."""
    try:
        here = (cwd or Path.cwd()).resolve()
    except OSError:
        return False
    for folder in here.parents:
        if folder.name in RUNNER_WORK_FOLDERS and (folder / "_temp").is_dir():
            return True
    return False


@dataclass(frozen=True)
class Settings:
    course: Path | None = None
    course_secret: str | None = None
    reference_dir: Path | None = None
    cache_dir: Path | None = None  # GRADER_CACHE_DIR as given (None: $XDG_CACHE_HOME/grader or ~/.cache/grader)
    cache_gb: str = ""  # GRADER_CACHE_GB as given: checked where it is used (grader.judge.runcache)
    xdg_cache_home: Path | None = None
    lock_dir: Path | None = None  # GRADER_LOCK_DIR: a folder every user's grader on the host shares (opt-in)
    xdg_runtime_dir: Path | None = None
    sandbox_uids: str = DEFAULT_SANDBOX_UIDS
    threads: int | None = None
    docker_image: str = "grader"
    container_cli: str = "docker"  # docker, or a command with its CLI (podman)
    warm: WarmStarts = WarmStarts()
    visible_gpus: str | None = None  # CUDA_VISIBLE_DEVICES: the GPUs this process may use (None: all)
    in_ci: bool = False  # any CI (CI or GITHUB_ACTIONS set, or a working directory in a runner's work folder)
    in_actions: bool = False  # GitHub Actions, whose log reads workflow commands at the start of a line

    def for_ci(self) -> "Settings":
        """These settings in a CI job (a `--ci` mode, or a runner found by its files): nothing is
        kept warm past the command (no kept zygote, no warm judge: a job's machine is thrown
        away, and a process left behind would outlive the job's own limits)."""
        return replace(self, in_ci=True, warm=replace(self.warm, keep_seconds=0.0, resident=False))

    @property
    def check_cache_base(self) -> Path:
        """Where `grader check` keeps what the next check reuses, unless GRADER_CACHE_DIR says."""
        return self.cache_dir or (self.xdg_cache_home or Path.home() / ".cache") / "grader"

    @property
    def own_lock_dir(self) -> Path:
        """The GPU locks' folder of this user alone, unless GRADER_LOCK_DIR names a shared one: in
        the user's runtime folder ($XDG_RUNTIME_DIR), else beside the user's cache. Nobody else
        can make it first (a folder in /tmp anyone could, and so refuse every GPU run)."""
        if self.xdg_runtime_dir is not None:
            return self.xdg_runtime_dir / "grader-locks"
        return (self.xdg_cache_home or Path.home() / ".cache") / "grader-locks"

    def course_folder(self) -> Path:
        """The course folder: $GRADER_COURSE (`course`); else the folder this package sits in
        when it holds assignments/ (a TA's checkout); else the student kit around the working
        directory (the grader installed from a wheel has no course of its own). The TA's course is
        found before any kit, so a kit's public specs inside a submission never replace the TA's.
        Here, not in grader.spec, so the sandbox keeps the course out of a worker's sight without
        knowing the course model."""
        if self.course is not None:
            return self.course
        home = Path(__file__).resolve().parent.parent
        if (home / "assignments").is_dir():
            return home
        for folder in (Path.cwd(), *Path.cwd().parents):
            if (folder / KIT_MANIFEST).is_file():
                return folder
        return home


def from_environment(env: Mapping[str, str] | None = None) -> Settings:
    """The settings `env` (default: this process's environment) gives; unset or empty means the
    default. A malformed number is left for its user to refuse with a message (GRADER_CACHE_GB)
    or read as off (GRADER_WARM_SECONDS: a warm start costs speed only)."""
    env = os.environ if env is None else env

    def path(name: str) -> Path | None:
        return Path(env[name]) if env.get(name) else None

    in_ci = bool(env.get("CI") or env.get("GITHUB_ACTIONS")) or on_actions_runner()
    all_warm = env.get("GRADER_WARM", "1") != "0"
    raw_seconds = env.get("GRADER_WARM_SECONDS")
    if raw_seconds is None:
        seconds = 0.0 if in_ci else DEFAULT_WARM_SECONDS
    else:
        try:
            seconds = max(0.0, float(raw_seconds))
        except ValueError:
            seconds = 0.0
    warm = WarmStarts(fork_server=all_warm and env.get("GRADER_ZYGOTE", "1") != "0",
                      keep_seconds=seconds if all_warm else 0.0,
                      job_server=all_warm and env.get("GRADER_JOB_SERVER", "1") != "0",
                      resident=all_warm and env.get("GRADER_RESIDENT", "1") != "0")
    threads = env.get("GRADER_THREADS", "")
    return Settings(
        course=path("GRADER_COURSE"),
        course_secret=env.get("GRADER_COURSE_SECRET"),
        reference_dir=path("GRADER_REFERENCE_DIR"),
        cache_dir=path("GRADER_CACHE_DIR"),
        cache_gb=env.get("GRADER_CACHE_GB", "").strip(),
        xdg_cache_home=path("XDG_CACHE_HOME"),
        lock_dir=path("GRADER_LOCK_DIR"),
        xdg_runtime_dir=path("XDG_RUNTIME_DIR"),
        sandbox_uids=env.get("GRADER_SANDBOX_UIDS") or DEFAULT_SANDBOX_UIDS,
        threads=int(threads) if threads.isdigit() and int(threads) > 0 else None,
        docker_image=env.get("GRADER_DOCKER_IMAGE") or "grader",
        container_cli=env.get("GRADER_CONTAINER_CLI") or "docker",
        warm=warm,
        visible_gpus=env.get("CUDA_VISIBLE_DEVICES"),
        in_ci=in_ci,
        in_actions=env.get("GITHUB_ACTIONS") == "true",
    )


def name_course(folder: Path) -> None:
    """`grader --course PATH ...`: the course folder this process and every one it starts use,
    as $GRADER_COURSE names it (set before any command reads its settings)."""
    os.environ["GRADER_COURSE"] = str(Path(folder).resolve())


def current() -> Settings:
    """The settings as the environment says now: for a command's entry point only (it reads them
    once and passes them down)."""
    return from_environment()
