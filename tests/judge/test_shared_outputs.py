"""The GPU lock folder and the output folders, on a machine other users share (#47): a lock
folder or lock file another user may change, replace or link is refused with the reason and
the fix, never followed; `grader check` and `grader grade` refuse an output folder another user
may change (a student's repo checked by a TA, a folder under /tmp another user made), and a
`.grader` swapped for a link during the check is never written through. As root and as an
ordinary user (uid 65533), the attacker uid 65534."""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from tests.conftest import AS_NOBODY, REPO_ROOT, as_nobody, as_user
from grader.judge.devicelock import gpu_phase
from grader.settings import from_environment

NOBODY = 65534
TA = 65533
root_only = pytest.mark.skipif(os.geteuid() != 0, reason="acting as other users needs root")



def _hold(folder: Path) -> str:
    """A timing phase held in lock folder `folder`: 'held', or the refusal."""
    settings = from_environment({"GRADER_LOCK_DIR": str(folder)})
    result: list[str] = []

    def run() -> None:
        try:
            with gpu_phase("0", True, settings):
                result.append("held")
        except Exception as exc:  # noqa: BLE001 - the refusal is the answer
            result.append(f"{type(exc).__name__}: {exc}")

    thread = threading.Thread(target=run, daemon=True)  # a FIFO opened blocking would hang here
    thread.start()
    thread.join(20)
    return result[0] if result else "hung"


# -- the GPU locks ---------------------------------------------------------------------------------

@root_only
def test_a_lock_folder_another_user_may_change_is_refused(shared_tmp):
    theirs = shared_tmp / "theirs"  # made by the attacker before the TA's first timing phase
    theirs.mkdir()
    os.chown(theirs, NOBODY, NOBODY)
    open_to_all = shared_tmp / "open"  # anyone may rename what lies in it
    open_to_all.mkdir()
    open_to_all.chmod(0o777)
    for who in (0, TA):
        for folder, words in ((theirs, "belongs to nobody"), (open_to_all / "locks", "other users may write")):
            got = _hold(folder) if who == 0 else as_user(who, lambda f=folder: _hold(f))
            assert "UnsafeFolderError" in got and words in got and "GRADER_LOCK_DIR" in got, (who, got)
        assert not (open_to_all / "locks").exists() and os.listdir(theirs) == []


@root_only
def test_a_lock_file_that_is_a_link_a_fifo_or_another_users_is_refused_never_followed(shared_tmp):
    """In root's sticky lock folder (as every user's grader shares it) the attacker plants the
    GPU's lock files: a link to a file that does not exist yet (opening it to create would make
    it), a FIFO (opening it would hang), a file of its own (it may remove it and make another
    while a timing phase holds it: two would time at once). Each is refused, for root and for
    an ordinary user, and nothing is made through the link."""
    locks = shared_tmp / "locks"
    locks.mkdir()
    locks.chmod(0o1777)
    victim = shared_tmp / "victim"  # root's folder: only the grader could make a file in it
    victim.mkdir(mode=0o777)
    for plant, words in (("link", "is a link"), ("fifo", "is not a regular file"), ("file", "belongs to uid 65534")):
        for who in (0, TA):
            for name in os.listdir(locks):
                os.unlink(locks / name)
            lock = locks / "gpu-0.turnstile"
            if plant == "link":
                lock.symlink_to(victim / "made")
            elif plant == "fifo":
                os.mkfifo(lock, 0o666)
            else:
                lock.write_text("")
            os.lchown(lock, NOBODY, NOBODY)
            got = _hold(locks) if who == 0 else as_user(who, lambda: _hold(locks))
            assert "UnsafeFolderError" in got and words in got, (plant, who, got)
            assert not os.path.lexists(victim / "made"), (plant, who)


@root_only
def test_every_user_shares_roots_lock_folder_and_a_new_one_is_made_sticky(shared_tmp):
    """The honest case: root's timing phase makes the folder (1777) and its lock files; an
    ordinary user's grader then takes the same locks (read-only descriptors lock as well)."""
    locks = shared_tmp / "locks"
    assert _hold(locks) == "held"
    assert stat.S_IMODE(locks.stat().st_mode) == 0o1777 and locks.stat().st_uid == 0
    assert as_user(TA, lambda: _hold(locks)) == "'held'"
    mine = shared_tmp / "ta"
    mine.mkdir()
    os.chown(mine, TA, TA)
    assert as_user(TA, lambda: _hold(mine / "locks")) == "'held'"


# -- the output folders ----------------------------------------------------------------------------

# The attacker's loop: swap `.grader` with a link to a folder of the TA's, as fast as it can
# (renameat2 with RENAME_EXCHANGE), until stopped.
SWAP = """
import ctypes, os, sys
libc = ctypes.CDLL(None, use_errno=True)
a, b = (os.fsencode(p) for p in sys.argv[1:3])
open(sys.argv[3], "w").close()
while True:
    libc.renameat2(-100, a, -100, b, 2)
"""

QUICK = ["-a", "vector_add", "--device", "cpu", "--case", "n=1", "--dtype", "float32"]


def _env() -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("CI", "GITHUB_ACTIONS", "GRADER_RESIDENT")}
    env.update(GRADER_CACHE_GB="0", COLUMNS="200",
               PYTHONPATH=os.pathsep.join(filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")])))
    return env


def _grader(uid: int, cwd: Path, *args: str) -> tuple[int, str]:
    """`python -m grader ARGS` in `cwd`, as root (uid 0) or as `uid`; its exit code and output."""
    env = _env()
    if uid == 0:
        command = [sys.executable, "-m", "grader", *args]
    else:
        env["HOME"] = str(cwd)
        command = [sys.executable, "-c", AS_NOBODY.format(uid=uid, home=str(cwd), env=env), "-m", "grader", *args]
    got = subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True, timeout=600)
    return got.returncode, " ".join((got.stdout + got.stderr).split())


@root_only
@pytest.mark.parametrize("who", [0, TA], ids=["root", "ordinary user"])
def test_a_check_in_a_students_repo_is_refused_and_a_swapped_grader_folder_is_never_written_through(
        submission, shared_tmp, who):
    """A TA runs `grader check` in a student's repo (the student's files, uid 65534) while the
    student swaps `.grader` with a link to a folder of the TA's, in a loop: the check is refused
    with the reason and the fix (exit 2) and nothing is written in the TA's folder."""
    repo = submission("good")
    student = shared_tmp / "student"
    shutil.copytree(repo, student / "repo", symlinks=True)
    repo = student / "repo"
    victim = shared_tmp / "ta-files"  # the TA's: a check must never write here
    victim.mkdir()
    os.chown(victim, who, who)
    (repo / "elsewhere").symlink_to(victim)
    for path in [student, *student.rglob("*")]:
        os.lchown(path, NOBODY, NOBODY)
    (repo / ".grader").mkdir()
    os.chown(repo / ".grader", NOBODY, NOBODY)
    ready = student / "swapping"  # where the attacker says it has started
    swapper = subprocess.Popen(as_nobody(student, {"PATH": "/usr/bin:/bin"}, "-c", SWAP, str(repo / ".grader"),
                                         str(repo / "elsewhere"), str(ready)),
                               stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 60
        while not ready.exists():
            assert swapper.poll() is None and time.monotonic() < deadline, swapper.stderr.read()
            time.sleep(0.05)
        said = [_grader(who, repo, "check", ".", *QUICK) for _ in range(2)]
    finally:
        swapper.kill()
        swapper.wait()
    assert os.listdir(victim) == [], os.listdir(victim)
    for code, text in said:
        assert code == 2, text[-3000:]
        assert "belongs to nobody" in text and "run grader check from one" in text, text[-3000:]


@root_only
@pytest.mark.parametrize("who", [0, TA], ids=["root", "ordinary user"])
def test_an_output_folder_another_user_may_change_is_refused(submission, shared_tmp, who):
    """--json/--html in a folder another user made, or in one anyone may write (not sticky), and
    grade's --out in another user's folder: refused, exit 2, before anything is graded or made."""
    repo = shared_tmp / "ta" / "repo"  # the TA's own repo: only the output folders are another user's
    shutil.copytree(submission("good"), repo, symlinks=True)
    for path in [repo.parent, *repo.parent.rglob("*")]:
        os.lchown(path, who, who)
    theirs = shared_tmp / "theirs"
    theirs.mkdir()
    os.chown(theirs, NOBODY, NOBODY)
    open_to_all = shared_tmp / "open"
    open_to_all.mkdir()
    open_to_all.chmod(0o777)
    for out, words in ((theirs, "belongs to nobody"), (open_to_all / "out", "other users may write")):
        code, text = _grader(who, repo.parent, "check", str(repo), *QUICK, "--json", str(out / "results.json"),
                             "--html", str(out))
        assert code == 2 and words in text and "--json and --html" in text, text[-3000:]
        code, text = _grader(who, repo.parent, "grade", "--lock", str(repo.parent / "no-lock.json"), "--device",
                             "cpu", "--out", str(out / "class"))
        assert code == 2 and words in text and "choose --out" in text, text[-3000:]
    assert os.listdir(theirs) == [] and not (open_to_all / "out").exists()


@root_only
def test_a_gpu_run_is_refused_up_front_where_a_lock_file_was_planted(shared_tmp):
    """What `grader check --device cuda` and `grader grade` ask before grading anything (exit 2):
    every lock file of each GPU used, the set-up slots' too."""
    from grader.judge.devicelock import refuse_unsafe_locks
    from grader.safefiles import UnsafeFolderError

    locks = shared_tmp / "locks"
    settings = from_environment({"GRADER_LOCK_DIR": str(locks)})
    refuse_unsafe_locks(["0", "1"], settings)  # root's, made 1777: fine
    (locks / "gpu-1.setup1").unlink()
    (locks / "gpu-1.setup1").symlink_to(shared_tmp / "made")
    os.lchown(locks / "gpu-1.setup1", NOBODY, NOBODY)
    for who in (0, TA):
        got = as_user(who, lambda: refuse_unsafe_locks(["0", "1"], settings)) if who else None
        if who == 0:
            with pytest.raises(UnsafeFolderError, match="gpu-1.setup1 is a link"):
                refuse_unsafe_locks(["0", "1"], settings)
        else:
            assert "gpu-1.setup1 is a link" in str(got), got
    assert not os.path.lexists(shared_tmp / "made")


def _hold_default(env: dict) -> str:
    """A timing phase held with the default lock folder (no GRADER_LOCK_DIR): 'held <folder>', or the refusal."""
    from grader.judge.devicelock import lock_dir

    settings = from_environment(env)
    try:
        with gpu_phase("0", True, settings):
            return f"held {lock_dir(settings)}"
    except Exception as exc:  # noqa: BLE001 - the refusal is the answer
        return f"{type(exc).__name__}: {exc}"


@root_only
def test_the_default_lock_folder_cannot_be_squatted(shared_tmp, monkeypatch):
    """uid 65534 makes <tmp>/grader-locks first (the old default every user shared): every GPU
    run of root's and of uid 65533's was refused until an admin removed it. The default is now
    each user's own folder (their runtime folder, else beside their cache): the squat costs
    nothing, and nothing is made in the attacker's folder."""
    tmp = shared_tmp / "tmp"
    tmp.mkdir()
    tmp.chmod(0o1777)
    monkeypatch.setenv("TMPDIR", str(tmp))
    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", None)  # TMPDIR read again
    squat = tmp / "grader-locks"
    squat.mkdir()
    os.chown(squat, NOBODY, NOBODY)
    for who in (0, TA):
        runtime = shared_tmp / f"run-{who}"
        runtime.mkdir(mode=0o700)
        os.chown(runtime, who, who)
        env = {"XDG_RUNTIME_DIR": str(runtime), "TMPDIR": str(tmp)}
        got = _hold_default(env) if who == 0 else as_user(who, lambda e=env: _hold_default(e))
        assert f"held {runtime / 'grader-locks'}" in got, (who, got)
        assert stat.S_IMODE((runtime / "grader-locks").stat().st_mode) == 0o700
        home = shared_tmp / f"home-{who}"  # no runtime folder: beside the user's cache
        home.mkdir(mode=0o700)
        os.chown(home, who, who)
        env = {"XDG_CACHE_HOME": str(home / ".cache"), "TMPDIR": str(tmp)}
        got = _hold_default(env) if who == 0 else as_user(who, lambda e=env: _hold_default(e))
        assert f"held {home / '.cache' / 'grader-locks'}" in got, (who, got)
    assert os.listdir(squat) == []
    # a runtime folder another user owns is refused with the reason and the fix, never used
    theirs = shared_tmp / "theirs-run"
    theirs.mkdir()
    theirs.chmod(0o755)
    os.chown(theirs, NOBODY, NOBODY)
    got = as_user(TA, lambda: _hold_default({"XDG_RUNTIME_DIR": str(theirs)}))
    assert "UnsafeFolderError" in got and "belongs to nobody" in got and "XDG_RUNTIME_DIR" in got, got
