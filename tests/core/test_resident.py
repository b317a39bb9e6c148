"""The warm judge a check leaves for the next (grader.resident): the next check is served by it
and grades exactly as one run alone; it is used only where it fits (the same grader, course and
environment, a folder of the user's alone, never in CI); nobody else can reach it; an interrupt
reaches the check, and a caller that dies takes its check with it."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import REPO_ROOT, as_nobody
from tests.coursebuild import broken_course
from grader import resident
from grader.settings import from_environment


def _env(tmp_path: Path, **extra: str) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("CI", "GITHUB_ACTIONS", "GRADER_RESIDENT", "GRADER_WARM")}
    env.update(GRADER_CACHE_DIR=str(tmp_path / "cache"), GRADER_WARM_SECONDS="120", COLUMNS="200",
               PYTHONPATH=os.pathsep.join(filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")])))
    env.update(extra)
    return env


def _argv(repo: Path, out: Path, *more: str, assignment: str = "vector_add", case: str = "n=1") -> list[str]:
    return [sys.executable, "-m", "grader", "check", str(repo), "-a", assignment, "--device", "cpu", "--seed", "7",
            "--case", case, "--dtype", "float32", "--json", str(out / "results.json"), "--html", str(out), *more]


def _check(repo: Path, out: Path, env: dict, *more: str) -> subprocess.CompletedProcess:
    return subprocess.run(_argv(repo, out, *more), env=env, cwd=out.parent, capture_output=True, text=True, timeout=600)


def _log(tmp_path: Path) -> str:
    return "".join(p.read_text() for p in (tmp_path / "cache" / "resident").glob("judge-*.log"))


def _wait_for_socket(tmp_path: Path, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while not list((tmp_path / "cache" / "resident").glob("judge-*.sock")):
        assert time.monotonic() < deadline, f"no warm judge after {timeout:.0f} s: {_log(tmp_path)[-2000:]}"
        time.sleep(0.2)


@pytest.fixture
def judge(tmp_path):
    """A kept cache of this test's own; every warm judge and zygote in it stopped at the end."""
    yield tmp_path
    resident.stop_warm(tmp_path / "cache")


def _same(a: str, b: str, tmp_path: Path) -> None:
    def plain(text: str) -> str:  # the outputs' own folders and the seconds aside
        text = re.sub(r"\d+(\.\d+)? s\b", "N s", text.replace(str(tmp_path), "TMP"))
        return re.sub(r"/out\d", "/outN", text)
    assert plain(a) == plain(b)


def test_the_next_check_is_served_by_the_warm_judge_and_grades_the_same(submission, judge):
    repo = submission("good")
    env = _env(judge)
    first = _check(repo, judge / "out1", env)
    assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-3000:]
    assert "serving" not in _log(judge)  # the first ran in its own process, and left a judge behind
    assert "kept for the next check: a warm worker start and a warm judge for 120 s" in first.stdout, first.stdout
    _wait_for_socket(judge)
    second = _check(repo, judge / "out2", env)
    assert second.returncode == 0, second.stdout[-3000:] + second.stderr[-3000:]
    served = re.findall(r"serving grader check as pid (\d+)", _log(judge))
    assert len(served) == 1 and f"pid {served[0]} exited 0" in _log(judge), _log(judge)
    _same(first.stdout, second.stdout, judge)
    a, b = (json.loads((judge / o / "results.json").read_text()) for o in ("out1", "out2"))
    assert [(t["name"], t["outcome"], t["score"]) for t in a["tests"]] == \
        [(t["name"], t["outcome"], t["score"]) for t in b["tests"]]
    failing = _check(submission("missing_mask"), judge / "out3", env)  # its exit code is the check's
    assert failing.returncode == 1 and len(re.findall("serving", _log(judge))) == 2, failing.stdout[-2000:]
    alone = _check(repo, judge / "out4", _env(judge, GRADER_RESIDENT="0"))
    assert alone.returncode == 0 and len(re.findall("serving", _log(judge))) == 2, "GRADER_RESIDENT=0 goes alone"
    assert "a warm worker start for 120 s" in alone.stdout and "warm judge" not in alone.stdout, alone.stdout


def test_the_judge_never_imports_from_the_folder_its_first_check_ran_in(submission, judge):
    """A check run in a repo that holds modules named as the grader's own (typer.py, rich/) starts
    the judge from there: the judge imports from its own folder, never the repo, so neither this
    student's check nor the next one (another repo, on a TA's machine) runs that code."""
    repo = submission("good")
    marker = judge / "imported-from-the-repo"
    for name in ("typer.py", "safetensors.py", "json.py"):
        (repo / name).write_text(f"open({str(marker)!r}, 'a').write({name!r})\nraise ImportError('planted')\n")
    env = _env(judge)
    out = judge / "out1"
    out.mkdir()
    argv = _argv(repo, out)  # as the `grader` command starts: its own folder first on its path, not the repo's
    first = subprocess.run([argv[0], "-P", *argv[1:]], env=env, cwd=repo, capture_output=True, text=True,
                           timeout=600)
    _wait_for_socket(judge)
    argv = _argv(submission("slow"), judge / "out2")
    second = subprocess.run([argv[0], "-P", *argv[1:]], env=env, cwd=repo, capture_output=True, text=True,
                            timeout=600)
    assert "serving" in _log(judge), _log(judge)
    assert not marker.exists(), marker.read_text()
    assert first.returncode == 0 and second.returncode == 0, first.stderr[-2000:] + second.stderr[-2000:]


@pytest.mark.parametrize("argv, env, wanted", [
    (["check", "."], {}, True),
    (["list"], {}, False),
    (["check", ".", "--ci", "github"], {}, False),
    (["check", ".", "--ci=classroom50"], {}, False),
    (["check", "--help"], {}, False),
    (["check", "."], {"CI": "true"}, False),
    (["check", "."], {"GITHUB_ACTIONS": "true"}, False),
    (["check", "."], {"GRADER_CACHE_GB": "0"}, False),
    (["check", "."], {"GRADER_CACHE_GB": "lots"}, False),  # the command itself says what is wrong
    (["check", "."], {"GRADER_WARM": "0"}, False),
    (["check", "."], {"GRADER_WARM_SECONDS": "0"}, False),
    (["check", "."], {"GRADER_RESIDENT": "0"}, False),
    (["--course", "c", "check", "."], {}, True),  # the global --course: a check of that course
    (["--course=c", "check", "."], {}, True),
    (["--course", "c", "list"], {}, False),
    (["--version", "check"], {}, False),
    (["--course"], {}, False),
])
def test_only_a_students_check_with_something_kept_goes_through_a_judge(argv, env, wanted):
    assert resident.wanted(argv, from_environment(env)) is wanted


def test_a_judge_fits_the_same_course_and_environment_only(tmp_path):
    course = tmp_path / "course"
    (course / "assignments").mkdir(parents=True)
    (course / "assignments" / "spec.py").write_text("x = 1\n")
    env = {"GRADER_COURSE": str(course), "HOME": "/home/a", "PWD": "/x"}
    k = resident.key(env, from_environment(env))
    assert resident.key(dict(env, PWD="/elsewhere", SHLVL="3"), from_environment(env)) == k  # the terminal's own
    assert resident.key(dict(env, HOME="/home/b"), from_environment(env)) != k
    assert resident.key(dict(env, TRITON_INTERPRET="1"), from_environment(env)) != k
    os.utime(course / "assignments" / "spec.py", ns=(1, 1))  # the course changed on disk
    assert resident.key(env, from_environment(env)) != k


def test_a_judge_keys_the_course_of_a_global_course_option(tmp_path):
    course = tmp_path / "course"
    (course / "assignments").mkdir(parents=True)
    (course / "assignments" / "spec.py").write_text("x = 1\n")
    env = {"HOME": "/home/a"}
    settings = from_environment(env)
    named = resident.course_named(["--course", "course", "check", "."], str(tmp_path), settings)
    assert named == course.resolve()
    assert resident.course_named(["check", "."], str(tmp_path), settings) is None
    k = resident.key(env, settings, named)
    assert k != resident.key(env, settings)  # the built-in course's judge does not serve it
    assert k == resident.key(dict(env, PWD="/elsewhere"), settings, named)  # the same course from another folder
    os.utime(course / "assignments" / "spec.py", ns=(1, 1))  # the course changed on disk
    assert resident.key(env, settings, named) != k


def test_a_folder_that_is_not_the_users_alone_is_never_used(submission, judge):
    """A resident/ folder others may enter, or a link in its place, is not used: the check runs
    on its own and leaves no judge there."""
    repo = submission("good")
    folder = judge / "cache" / "resident"
    folder.mkdir(parents=True)
    folder.chmod(0o755)
    got = _check(repo, judge / "out1", _env(judge))
    assert got.returncode == 0 and not list(folder.iterdir()), list(folder.iterdir())
    folder.rmdir()
    (judge / "elsewhere").mkdir(mode=0o700)
    folder.symlink_to(judge / "elsewhere")
    got = _check(repo, judge / "out2", _env(judge))
    assert got.returncode == 0 and not list((judge / "elsewhere").iterdir())


@pytest.mark.skipif(os.geteuid() != 0, reason="switching to another user needs root")
def test_another_user_cannot_reach_the_judge():
    """Attacked as uid 65534 through a path it may walk: the judge's folder (0700) stops it, and
    with that folder opened to others, the socket itself (0700) still does; nothing is served."""
    import shutil
    import tempfile

    base = Path(tempfile.mkdtemp(prefix="grader-resident-", dir="/tmp"))
    base.chmod(0o755)  # every folder above the judge's may be walked by anyone
    folder = base / "cache" / "resident"
    (base / "cache").mkdir(mode=0o755)
    server = subprocess.Popen([sys.executable, "-m", "grader.resident", "serve", str(folder), "k" * 24, "60"],
                              env=_env(base), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    probe = ("import socket, sys\ns = socket.socket(socket.AF_UNIX)\n"
             "try:\n    s.connect(sys.argv[1]); print('connected')\n"
             "except OSError as e:\n    print(type(e).__name__)\n")
    home = base / "nobody"
    home.mkdir(mode=0o777)
    home.chmod(0o777)
    try:
        _wait_for_socket(base)
        sock = next(folder.glob("judge-*.sock"))
        assert sock.stat().st_mode & 0o077 == 0 and folder.stat().st_mode & 0o077 == 0
        for mode in (0o700, 0o711):  # as made; then the folder opened to others: the socket is not
            folder.chmod(mode)
            got = subprocess.run(as_nobody(home, {"PATH": "/usr/bin:/bin"}, "-c", probe, str(sock)),
                                 capture_output=True, text=True, timeout=60)
            assert got.stdout.strip() == "PermissionError", (oct(mode), got.stdout + got.stderr)
        assert server.poll() is None and "serving" not in _log(base)
    finally:
        server.kill()
        server.wait()
        resident.stop_warm(base / "cache")
        shutil.rmtree(base, ignore_errors=True)


@pytest.mark.slow
def test_an_interrupt_reaches_the_check_and_a_dead_caller_takes_its_check_along(submission, judge):
    """Ctrl-C in the caller's terminal ends the check the judge runs as it ends one run alone
    (exit 130, no traceback); a caller killed outright leaves nothing running."""
    repo = submission("hangs")
    env = _env(judge)
    warmed = _check(submission("good"), judge / "out0", env)
    assert warmed.returncode == 0
    _wait_for_socket(judge)
    for how, expect in ((signal.SIGINT, 130), (signal.SIGKILL, None)):
        served = len(re.findall("serving", _log(judge)))
        proc = subprocess.Popen(_argv(repo, judge / f"out-{how.name}", "--timeout", "60", assignment="softmax",
                                      case="1x1"), env=env, cwd=judge,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        deadline = time.monotonic() + 120
        while len(re.findall("serving", _log(judge))) == served:
            assert time.monotonic() < deadline and proc.poll() is None, _log(judge)
            time.sleep(0.1)
        pid = int(re.findall(r"serving grader check as pid (\d+)", _log(judge))[-1])
        time.sleep(3)  # inside the hanging call
        proc.send_signal(how)
        out, err = proc.communicate(timeout=60)
        if expect is not None:
            assert proc.returncode == expect and "Traceback" not in out + err, (proc.returncode, out[-1500:], err[-1500:])
        deadline = time.monotonic() + 30
        while f"pid {pid} exited" not in _log(judge):
            assert time.monotonic() < deadline, f"the check {pid} outlived its caller: {_log(judge)}"
            time.sleep(0.1)
        assert not Path(f"/proc/{pid}").exists() or Path(f"/proc/{pid}/stat").read_text().split()[2] == "Z"


def test_a_check_in_ci_is_never_served_by_a_judge_a_local_check_left(submission, judge):
    """On a persistent self-hosted runner (#50): a judge left by a local check waits; a check
    with CI=true and GRADER_WARM_SECONDS=0 runs in its own process with its own settings (no
    warm judge, no kept worker start), and a request sent to the judge with that environment
    is refused by the judge itself."""
    import json as _json
    import socket

    repo = submission("good")
    first = _check(repo, judge / "out1", _env(judge))
    assert first.returncode == 0, first.stdout[-2000:] + first.stderr[-2000:]
    _wait_for_socket(judge)
    ci = _check(repo, judge / "out2", _env(judge, CI="true", GRADER_WARM_SECONDS="0"))
    assert ci.returncode == 0, ci.stdout[-2000:] + ci.stderr[-2000:]
    assert "serving" not in _log(judge) and "kept for the next check" not in ci.stdout, (_log(judge), ci.stdout)
    sock = next((judge / "cache" / "resident").glob("judge-*.sock"))
    conn = socket.socket(socket.AF_UNIX)
    folder = os.open(sock.parent, os.O_RDONLY | os.O_DIRECTORY)
    conn.connect(f"/proc/self/fd/{folder}/{sock.name}")  # a short path, however deep the folder lies
    os.close(folder)
    env = _env(judge, CI="true", GRADER_WARM_SECONDS="0")
    request = _json.dumps({"argv": ["check", str(repo)], "cwd": str(judge), "env": env}).encode()
    socket.send_fds(conn, [resident.HEADER.pack(len(request))], [1, 2])
    conn.sendall(request)
    assert resident._line(conn).startswith(b"refused"), _log(judge)
    conn.close()
    assert "serving" not in _log(judge) and "refused" in _log(judge), _log(judge)


def test_the_warm_judge_prints_and_exits_as_the_cold_check_for_every_error(submission, judge):
    """The same failures, cold (GRADER_RESIDENT=0) and through a warm judge: the same exit code
    and the same words. A spec that raises while grading is the course's error in one line (file,
    function, line, case), exit 2; a usage error and an unknown assignment likewise."""
    repo = submission("good")
    course = broken_course(judge / "course")
    env = _env(judge, GRADER_COURSE=str(course))
    failures = {
        "make_inputs": (["-a", "fails_inputs"], 2, "assignments/fails_inputs/spec.py:13: make_inputs() raised "
                                                   "KeyError: 'n' on case n=1 [float32]: the assignment is broken"),
        "truth": (["-a", "fails_truth"], 2, "assignments/fails_truth/spec.py:18: truth() raised AssertionError: "
                                            "too short on case n=1 [float32]: the assignment is broken"),
        "unknown": (["-a", "nope"], 2, "unknown assignment 'nope'"),
        "usage": (["-a", "fails_truth", "--device", "tpu"], 2, "tpu"),
    }

    def run(more: list[str], out: str, env: dict, case: str = "n=1") -> subprocess.CompletedProcess:
        argv = [sys.executable, "-m", "grader", "check", str(repo), "--device", "cpu", "--seed", "7", "--case", case,
                "--dtype", "float32", "--json", str(judge / out / "results.json"), "--html", str(judge / out), *more]
        return subprocess.run(argv, env=env, cwd=judge, capture_output=True, text=True, timeout=600)

    cold = {name: run(more, f"cold-{name}", _env(judge, GRADER_COURSE=str(course), GRADER_RESIDENT="0"))
            for name, (more, _, _) in failures.items()}
    for name, (_, code, words) in failures.items():
        assert cold[name].returncode == code and words in cold[name].stderr, (name, cold[name].stderr[-2000:])
        assert "Traceback" not in cold[name].stderr and "─" not in cold[name].stderr, cold[name].stderr
    first = run(["-a", "fails_truth"], "first", env, case="n=127")  # a check that passes leaves a judge behind
    assert first.returncode == 0, first.stdout[-2000:] + first.stderr[-2000:]
    _wait_for_socket(judge)
    for i, (name, (more, code, words)) in enumerate(failures.items()):
        warm = run(more, f"cold-{name}", env)
        assert len(re.findall("serving", _log(judge))) == i + 1, (name, _log(judge)[-2000:])
        assert (warm.returncode, warm.stderr) == (cold[name].returncode, cold[name].stderr), name
        _same(warm.stdout, cold[name].stdout, judge)


def test_a_check_of_a_course_named_by_the_global_option_is_served_warm_and_fails_the_same(submission, judge):
    """`grader --course PATH check`: the course is the judge's too (its key), and a spec that raises
    while grading says the same line with the same exit code cold and through the warm judge."""
    repo = submission("good")
    course = broken_course(judge / "course")
    env = _env(judge)
    env.pop("GRADER_COURSE", None)

    def run(case: str, out: str, env: dict) -> subprocess.CompletedProcess:
        argv = [sys.executable, "-m", "grader", "--course", "course", "check", str(repo), "-a", "fails_truth",
                "--device", "cpu", "--seed", "7", "--case", case, "--dtype", "float32",
                "--json", str(judge / out / "results.json"), "--html", str(judge / out)]
        return subprocess.run(argv, env=env, cwd=judge, capture_output=True, text=True, timeout=600)

    words = ("assignments/fails_truth/spec.py:18: truth() raised AssertionError: too short on case n=1 [float32]: "
             "the assignment is broken")
    cold = run("n=1", "cold", dict(env, GRADER_RESIDENT="0"))
    assert cold.returncode == 2 and words in cold.stderr, cold.stderr[-2000:]
    first = run("n=127", "first", env)  # a check that passes leaves a judge behind, keyed by the course
    assert first.returncode == 0, first.stdout[-2000:] + first.stderr[-2000:]
    _wait_for_socket(judge)
    warm = run("n=1", "cold", env)
    assert len(re.findall("serving", _log(judge))) == 1, _log(judge)[-2000:]
    assert (warm.returncode, warm.stderr) == (cold.returncode, cold.stderr)
    _same(warm.stdout, cold.stdout, judge)


def test_run_as_cold_says_what_an_uncaught_exception_is():
    """The judge's fork of a command that raises: the traceback printed as Python prints it, exit 1."""
    import io
    from contextlib import redirect_stderr

    def boom():
        raise RuntimeError("boom")

    said = io.StringIO()
    with redirect_stderr(said):
        assert resident.run_as_cold(boom) == 1
        assert resident.run_as_cold(lambda: sys.exit(3)) == 3
        assert resident.run_as_cold(lambda: sys.exit("no")) == 1
    assert "RuntimeError: boom" in said.getvalue() and "no" in said.getvalue()
