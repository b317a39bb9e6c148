"""Shared fixtures: student repos built from tests/fixtures, and the real CLI."""

from __future__ import annotations

import json
import os
import shutil
import atexit
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

FIXTURES = Path(__file__).parent / "fixtures"
REPO_ROOT = Path(__file__).parent.parent

# A check is a CI job where CI or GITHUB_ACTIONS is set (grader.settings): set on the machine that runs
# these tests (CI sets CI=true), every student-side check they start would be one. The tests that
# test a CI job say so themselves (--ci, or the variables set for that call).
for _machines_own in ("CI", "GITHUB_ACTIONS"):
    os.environ.pop(_machines_own, None)

# what `grader check` keeps between runs goes to this test session's own folder, and no warm
# zygote outlives a command (the tests of both turn them on where they test them)
_KEPT = tempfile.mkdtemp(prefix="grader-test-kept-")
atexit.register(shutil.rmtree, _KEPT, True)
os.environ.setdefault("GRADER_CACHE_DIR", _KEPT)
os.environ.setdefault("GRADER_WARM_SECONDS", "0")

from grader.settings import Settings  # noqa: E402 (after the environment above)
from grader.spec import Course  # noqa: E402
from grader.sandbox.zygote import SandboxState  # noqa: E402

SANDBOX = SandboxState()  # what the sandbox keeps for this test process's workers (their zygotes, code copy)

COURSE = Course.find(Settings())  # the repository's course, as a command run here finds it: loaded once for every test


def has_gpu() -> bool:
    try:
        import torch

        return torch.cuda.is_available()
    except Exception:
        return False


def pytest_collection_modifyitems(config, items):
    if "bench" not in (config.getoption("-m") or ""):  # benchmarks run only when -m names them
        benches = [item for item in items if "bench" in item.keywords]
        if benches:
            config.hook.pytest_deselected(items=benches)
            items[:] = [item for item in items if "bench" not in item.keywords]
    if has_gpu():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU; none is visible on this machine")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


def build_submission(dest: Path, name: str) -> Path:
    """A student repo: the correct solution `good`, overlaid with fixture `name`'s files,
    so each buggy fixture holds only what it gets wrong and the rest still passes. The good
    vector_add and dropout also stay importable as `kernels._good_add` and `kernels._good_dropout`,
    for the fixtures that wrap them (timing cheats, honest shortcuts), and a GPU fixture gets
    gpu/forged's honest slow kernels as `kernels._slow_add` and `kernels._loop_add`, its forgeries as
    `kernels._forgeries`, and the good softmax as `kernels._good_softmax`."""
    shutil.copytree(FIXTURES / "good", dest)
    shutil.copy(FIXTURES / "good" / "kernels" / "vector_add.py", dest / "kernels" / "_good_add.py")
    shutil.copy(FIXTURES / "good" / "kernels" / "dropout.py", dest / "kernels" / "_good_dropout.py")
    if name.startswith("gpu/"):  # the honest slow vector_add the timing fixtures wrap (gpu/forged's own)
        shutil.copy(FIXTURES / "gpu" / "forged" / "kernels" / "_slow_add.py", dest / "kernels" / "_slow_add.py")
        shutil.copy(FIXTURES / "gpu" / "forged" / "kernels" / "_loop_add.py", dest / "kernels" / "_loop_add.py")
        shutil.copy(FIXTURES / "gpu" / "forged" / "kernels" / "_forgeries.py", dest / "kernels" / "_forgeries.py")
        shutil.copy(FIXTURES / "good" / "kernels" / "softmax.py", dest / "kernels" / "_good_softmax.py")
    if name != "good":
        shutil.copytree(FIXTURES / name, dest, dirs_exist_ok=True)
    return dest


@pytest.fixture
def submission(tmp_path):
    return lambda name: build_submission(tmp_path / name, name)


@dataclass
class CliRun:
    returncode: int
    stdout: str
    stderr: str
    results: dict | None
    report: str | None

    def test(self, assignment: str, name: str) -> dict:
        for t in self.results["tests"]:
            if t["name"] == f"{assignment}: {name}":
                return t
        raise KeyError(f"{assignment}: {name} not in {[t['name'] for t in self.results['tests']]}")

    def tests_of(self, assignment: str) -> list[dict]:
        return [t for t in self.results["tests"] if t["tags"][0] == assignment]


def run_cli(args: list[str], cwd: Path, timeout: float = 900) -> CliRun:
    out = cwd / "out"
    # this checkout's grader, whatever is installed, and wide enough lines to assert on
    env = dict(os.environ, COLUMNS="200", PYTHONPATH=os.pathsep.join(filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")])))
    for own in ("PYTEST_CURRENT_TEST", "PYTEST_XDIST_WORKER"):  # pytest's own, per test and worker: without them
        env.pop(own, None)  # every test's check fits the same warm judge (where GRADER_WARM_SECONDS keeps one)
    proc = subprocess.run([sys.executable, "-m", "grader", *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    results_file = out / "results.json"
    report_file = out / "report.html"
    return CliRun(
        proc.returncode,
        proc.stdout,
        proc.stderr,
        json.loads(results_file.read_text()) if results_file.exists() else None,
        report_file.read_text() if report_file.exists() else None,
    )


@pytest.fixture
def cli(tmp_path):
    """Run `python -m grader COMMAND ...`; `check` writes to tmp_path/out."""

    def run(*args, command: str = "check") -> CliRun:
        extra = ["--json", str(tmp_path / "out" / "results.json"), "--html", str(tmp_path / "out")] if command == "check" else []
        return run_cli([command, *map(str, args), *extra], tmp_path)

    return run


def leftovers(marker: str = "", within: Path | None = None) -> list[str]:
    """Live processes of this checkout's workers (or with `marker` in their command line);
    with `within`, only those whose environment names that folder (a worker's HOME is its
    scratch folder), so tests running in parallel do not see each other's workers."""
    from grader.sandbox.interpreter import CHECKOUT_TAG, PACKAGE_PARENT

    code = str(SANDBOX.worker_code())  # where the tests' workers import from
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            cmdline = open(f"/proc/{pid}/cmdline", "rb").read().replace(b"\0", b" ").decode(errors="replace")
            state = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        ours = (PACKAGE_PARENT in cmdline or code in cmdline or CHECKOUT_TAG in cmdline) and (
            "grader.worker.server" in cmdline or "grader.sandbox.init" in cmdline)
        if state not in ("Z", "X") and (ours or (marker and marker in cmdline)) and int(pid) != os.getpid():
            if within is not None and not _environ_names(pid, within):
                continue
            found.append(f"{pid}: {cmdline[:120]}")
    return found


def _environ_names(pid: str, folder: Path) -> bool:
    try:
        return str(folder).encode() in open(f"/proc/{pid}/environ", "rb").read()
    except OSError:
        return False


def assert_nothing_left(marker: str = "", within: Path | None = None) -> None:
    deadline = time.monotonic() + 30  # a killed process may take a moment to be reaped on a busy machine
    while (left := leftovers(marker, within)) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not left, left


# Run as root: a private mount namespace in which the interpreter is reachable by uid 65534 (it may
# lie under a home folder only root enters, e.g. /root/.pyenv: that folder becomes an empty tmpfs
# there, the interpreter's prefix bound back, and a venv's base interpreter's too), then the switch to uid 65534 (which takes every
# capability away) and the run itself. The mounts stay in that namespace.
AS_NOBODY = """
import ctypes, os, sys
libc = ctypes.CDLL(None, use_errno=True)
def check(result, what):
    if result != 0:
        raise OSError(ctypes.get_errno(), what)
check(libc.unshare(0x00020000), "unshare")
check(libc.mount(None, b"/", None, 16384 | (1 << 18), None), "private")
held = []  # a venv's prefix, and the base interpreter's its python links to
for prefix in sorted({{os.path.realpath(sys.prefix), os.path.realpath(sys.base_prefix)}}):
    closed = next((a for a in reversed(__import__("pathlib").Path(prefix).parents) if not os.stat(a).st_mode & 0o001), None)
    if closed is not None:
        held.append((str(closed), prefix, os.open(prefix, os.O_PATH | os.O_DIRECTORY)))
covered = []
for closed in sorted({{c for c, _, _ in held}}, key=len):
    if not any(closed.startswith(c.rstrip("/") + "/") for c in covered):
        check(libc.mount(b"tmpfs", closed.encode(), b"tmpfs", 0, b"mode=0755"), "tmpfs")
        covered.append(closed)
for closed, prefix, fd in held:
    os.makedirs(prefix, exist_ok=True)
    check(libc.mount(f"/proc/self/fd/{{fd}}".encode(), prefix.encode(), None, 4096 | 16384, None), "bind")
os.setgroups([])
os.setresgid({uid}, {uid}, {uid})
os.setresuid({uid}, {uid}, {uid})
os.chdir({home!r})
os.execve(sys.executable, [sys.executable, *sys.argv[1:]], {env!r})
"""


def as_nobody(home: Path, env: dict, *argv: str) -> list[str]:
    """The command that runs `python *argv` as uid 65534 (root only), through AS_NOBODY."""
    return [sys.executable, "-c", AS_NOBODY.format(uid=65534, home=str(home), env=env), *argv]


def as_user(uid: int, what) -> str:
    """repr of `what()` (or of its exception) in a forked child running as `uid` (root only): a
    second user on the machine, for the tests where another user is the attacker or the victim."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            os.close(read)
            os.setgroups([])
            os.setresgid(uid, uid, uid)
            os.setresuid(uid, uid, uid)
            try:
                got: object = what()
            except Exception as exc:  # noqa: BLE001 - handed back to the test
                got = exc
            os.write(write, repr(got).encode())
        finally:
            os._exit(0)
    os.close(write)
    with os.fdopen(read) as f:
        got = f.read()
    os.waitpid(pid, 0)
    return got


@pytest.fixture
def shared_tmp():
    """A folder in /tmp that root owns and anyone may enter, as a course's or a TA's scripts use
    (GRADER_CACHE_DIR, GRADER_LOCK_DIR, an output folder): where another user is the attacker."""
    base = Path(tempfile.mkdtemp(prefix="grader-shared-", dir="/tmp"))
    base.chmod(0o755)
    yield base
    shutil.rmtree(base, ignore_errors=True)
